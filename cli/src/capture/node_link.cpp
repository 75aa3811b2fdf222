#include "capture/node_link.h"

#include <charconv>
#include <random>
#include <sstream>
#include <vector>

#include <fmt/format.h>

namespace tpscope::cli::capture {

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kPrefix = "tpscope/job/";

std::string key(const std::string& name) { return kPrefix + name; }

bool isLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.starts_with("127.");
}

std::optional<int64_t> parseI64(std::string_view text) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

}  // namespace

probes::TcpKvLimits storeLimits(int ranks, int nnodes) {
  probes::TcpKvLimits limits;
  limits.maxClients = static_cast<size_t>(ranks) + static_cast<size_t>(nnodes) + 16;
  return limits;
}

std::string makeToken() {
  std::random_device rd;
  std::string token;
  for (int i = 0; i < 4; ++i) token += fmt::format("{:08x}", static_cast<uint32_t>(rd()));
  return token;
}

NodeLink::~NodeLink() {
  client_.reset();
  server_.reset();
}

std::unique_ptr<NodeLink> NodeLink::open(const Options& options, std::string* error, bool* refused) {
  std::unique_ptr<NodeLink> link(new NodeLink(options));
  *refused = false;
  std::string host = options.masterAddr;
  if (options.nodeRank == 0) {
    std::string why;
    const std::string bindHost = isLoopback(host) ? host : std::string();
    link->server_ = probes::TcpKvServer::listen(bindHost, static_cast<uint16_t>(options.controlPort), &why,
                                                options.token, options.storeLimits);
    if (!link->server_) {
      *error = fmt::format("cannot listen on {}:{} (the control channel, --master-port + 1): {}",
                           bindHost.empty() ? "*" : bindHost, options.controlPort, why);
      return nullptr;
    }
    if (bindHost.empty()) host = "127.0.0.1";  // node 0 talks to its own store over loopback
  }
  std::string why;
  const auto timeout = options.nodeRank == 0 ? std::chrono::milliseconds(10'000) : options.rendezvousTimeout;
  link->client_ =
      probes::TcpKvClient::connect(host, static_cast<uint16_t>(options.controlPort), timeout, &why, options.token);
  if (!link->client_) {
    *refused = why.find("refused: wrong token") != std::string::npos;
    *error = *refused ? fmt::format("node 0's capture at {}:{} refused this node's token (--token / TPSCOPE_TOKEN "
                                    "must be the one node 0 uses)",
                                    options.masterAddr, options.controlPort)
                      : fmt::format("cannot reach node 0's capture at {}:{} within {:g} s: {}", options.masterAddr,
                                    options.controlPort, timeout.count() / 1000.0, why);
    return nullptr;
  }
  return link;
}

std::string NodeLink::storeAddress() const {
  const std::string& h = o_.masterAddr;
  return (h.find(':') != std::string::npos ? "[" + h + "]" : h) + ":" + std::to_string(o_.controlPort);
}

std::optional<probes::TcpKvServerStats> NodeLink::storeStats() const {
  if (!server_) return std::nullopt;
  return server_->stats();
}

std::optional<std::string> NodeLink::waitFor(const std::string& name, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (auto v = client_->get(key(name), std::max(left, std::chrono::milliseconds(1)))) return v;
    if (!client_->connected() || Clock::now() >= deadline) return std::nullopt;
  }
}

bool NodeLink::waitForNodesAndPublish(const JobInfo& job, std::string* error) {
  const auto deadline = Clock::now() + o_.rendezvousTimeout;
  std::vector<int> missing;
  for (int k = 1; k < o_.nnodes; ++k) {
    // Past the deadline each node still gets one look: a hello already there counts.
    if (!waitFor(fmt::format("hello/{}", k), std::max(deadline, Clock::now() + std::chrono::milliseconds(1))))
      missing.push_back(k);
    if (!client_->connected()) {
      *error = "lost the control channel (node 0's own store)";
      return false;
    }
  }
  if (!missing.empty()) {
    std::string list;
    for (int k : missing) list += (list.empty() ? "" : ", ") + std::to_string(k);
    const bool many = missing.size() > 1;
    *error = fmt::format(
        "node{} {} never joined within {:g} s (--rendezvous-timeout); {} of {} nodes came. Was {} "
        "started, with the same --master-addr, --master-port and the job's token? Can {} reach "
        "this machine's port {}?",
        many ? "s" : "", list, o_.rendezvousTimeout.count() / 1000.0, o_.nnodes - static_cast<int>(missing.size()),
        o_.nnodes, many ? "each" : "it", many ? "they" : "it", o_.controlPort);
    return false;
  }
  const std::string info =
      fmt::format("{}\n{}\n{}\n{}", job.runId, job.epochNs, job.nprocPerNode, job.worldSize);
  if (!client_->set(key("info"), info)) {
    *error = "cannot write to the control channel";
    return false;
  }
  return true;
}

std::optional<JobInfo> NodeLink::helloAndReadJob(const std::string& host, std::string* error) {
  if (!client_->set(key(fmt::format("hello/{}", o_.nodeRank)), host)) {
    *error = "lost the control channel to node 0";
    return std::nullopt;
  }
  const auto info = waitFor("info", Clock::now() + o_.rendezvousTimeout);
  if (!info) {
    *error = client_->connected()
                 ? fmt::format(
                       "node 0 did not start the job within {:g} s (--rendezvous-timeout): not every node "
                       "joined",
                       o_.rendezvousTimeout.count() / 1000.0)
                 : "node 0's capture ended before the job started (not every node joined: node 0's output names "
                   "the missing ones)";
    return std::nullopt;
  }
  std::istringstream in(*info);
  std::string runId, epoch, nproc, world;
  std::getline(in, runId);
  std::getline(in, epoch);
  std::getline(in, nproc);
  std::getline(in, world);
  const auto e = parseI64(epoch), n = parseI64(nproc), w = parseI64(world);
  if (runId.empty() || !e || !n || !w) {
    *error = "node 0 published a job this capture cannot read (another tpscope version?)";
    return std::nullopt;
  }
  return JobInfo{runId, *e, static_cast<int>(*n), static_cast<int>(*w)};
}

namespace {
// "<exit status> <node> <why>"; nullopt when unreadable.
std::optional<RemoteStop> parseStop(const std::string& value) {
  std::istringstream in(value);
  RemoteStop s;
  if (!(in >> s.exitStatus >> s.node)) return std::nullopt;
  std::getline(in >> std::ws, s.why);
  return s;
}
}  // namespace

std::optional<RemoteStop> NodeLink::claimStop(int exitStatus, const std::string& why) {
  if (lost_) return std::nullopt;
  const auto holds = client_->setIfAbsent(key("stop"), fmt::format("{} {} {}", exitStatus, o_.nodeRank, why));
  return holds ? parseStop(*holds) : std::nullopt;
}

std::optional<RemoteStop> NodeLink::pollStop(bool* lost) {
  *lost = lost_;
  if (lost_) return std::nullopt;
  const auto value = client_->get(key("stop"), std::chrono::milliseconds(0));
  if (!client_->connected()) {
    lost_ = *lost = true;
    return std::nullopt;
  }
  if (!value) return std::nullopt;
  const auto s = parseStop(*value);
  if (!s || s->node == o_.nodeRank) return std::nullopt;  // unreadable, or our own
  return s;
}

void NodeLink::postDone(int exitStatus) {
  if (!lost_) client_->set(key(fmt::format("done/{}", o_.nodeRank)), std::to_string(exitStatus));
}

std::map<int, int> NodeLink::waitForDone(std::chrono::milliseconds timeout) {
  std::map<int, int> done;
  const auto deadline = Clock::now() + timeout;
  for (int k = 0; k < o_.nnodes; ++k) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    const auto v = client_->get(key(fmt::format("done/{}", k)), std::max(left, std::chrono::milliseconds(1)));
    if (!v) continue;
    if (const auto code = parseI64(*v)) done[k] = static_cast<int>(*code);
  }
  return done;
}

}  // namespace tpscope::cli::capture
