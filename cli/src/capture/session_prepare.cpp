#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <thread>

#include "capture/capture_session.h"

extern char** environ;

namespace tpscope::cli::capture {

namespace fs = std::filesystem;

namespace {

int freeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  int port = 0;
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

int64_t unixNowNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Why files cannot be created in `dir` (read-only file system, no permission); "" when they can. Creating one is
// the only sure test: access(2) answers for the real user id, and root passes permission bits anyway.
std::string writeProblem(const fs::path& dir) {
  const fs::path probe = dir / fmt::format(".tpscope-write-check-{}", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return {};
}

std::string shellQuote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") ==
                        std::string::npos)
    return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The environment of the ranks: ours, with torchrun's and tpscope's variables replaced.
std::vector<std::string> rankEnvironment(const std::map<std::string, std::string>& set) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv(*e);
    const std::string key = kv.substr(0, kv.find('='));
    if (!set.contains(key)) env.push_back(kv);
  }
  for (const auto& [k, v] : set) env.push_back(k + "=" + v);
  return env;
}

}  // namespace

// ---- 2. prepare the folder, the store, the port -----------------------------------------------------------------
std::optional<int> CaptureSession::prepare() {
  if (auto code = prepareFolder()) return code;
  return startStoreAndAnnounce();
}

// Creates DIR and DIR/logs and removes the previous capture's rank files, run file and rank logs (nothing else).
std::optional<int> CaptureSession::prepareFolder() {
  std::error_code ec;
  fs::create_directories(o_.out, ec);
  if (ec || !fs::is_directory(o_.out))
    return bad(fmt::format("--out {}: cannot create the folder: {}", o_.out.string(),
                           ec ? ec.message() : "not a folder"));
  dir_ = fs::absolute(o_.out);
  runFile_ = dir_ / "run.db";
  // Refused before anything in it is removed or any rank starts (a read-only folder, no permission).
  if (std::string why = writeProblem(dir_); !why.empty())
    return bad(fmt::format("--out {}: cannot write in this folder: {}", o_.out.string(), why));
  logs_ = dir_ / "logs";
  fs::create_directories(logs_, ec);
  if (ec || !fs::is_directory(logs_))
    return bad(fmt::format("--out {}: cannot create {}: {}", o_.out.string(), logs_.string(),
                           ec ? ec.message() : "not a folder"));
  int removed = 0;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    const bool rankFile = name.starts_with("rank-") && (name.ends_with(".db") || name.ends_with(".db-wal") ||
                                                        name.ends_with(".db-shm") || name.ends_with(".db-journal"));
    const bool runFile = name == "run.db" || name == "run.db-wal" || name == "run.db-shm";
    if ((rankFile && ownsRankFile(name)) || runFile) removed += fs::remove(entry.path(), ec) ? 1 : 0;
  }
  for (const auto& entry : fs::directory_iterator(logs_, ec))
    if (const std::string name = entry.path().filename().string(); name.starts_with("rank-") && ownsRankFile(name))
      fs::remove(entry.path(), ec);
  if (removed > 0) fmt::print(out_, "replacing the previous capture in {}\n", dir_.string());
  return std::nullopt;
}

// One node: a capture folder holds every rank file of the run. Several: only this node's ranks are its to replace
// (a folder shared by mistake keeps the other nodes' files).
bool CaptureSession::ownsRankFile(const std::string& name) const {
  if (o_.nnodes == 1) return true;
  int rank = -1;
  const char* begin = name.data() + 5;  // after "rank-"
  const auto [end, ec] = std::from_chars(begin, name.data() + name.size(), rank);
  return ec == std::errc() && end != begin && *end == '.' && rank >= firstRank_ && rank < firstRank_ + o_.nproc;
}

// The clock store and MASTER_PORT on loopback, the run's id and epoch; prints what is about to run.
std::optional<int> CaptureSession::startStoreAndAnnounce() {
  epochNs_ = unixNowNs();
  runId_ = fmt::format("{}-{}-{}", dir_.filename().string(), epochNs_ / 1'000'000'000, ::getpid());
  masterPort_ = o_.masterPort;
  if (o_.nodeRank == 0) raiseOpenFileLimit(storeLimits(world_, o_.nnodes));
  if (o_.nnodes > 1) {
    if (auto code = connectNodes()) return code;
  } else {
    // A token on loopback too: other users of this machine can reach 127.0.0.1. The ranks get it (TPSCOPE_TOKEN).
    token_ = o_.token.empty() ? makeToken() : o_.token;
    std::string storeError;
    store_ = probes::TcpKvServer::listen("127.0.0.1", 0, &storeError, token_, storeLimits(world_, 1));
    if (!store_) {
      fmt::print(err_, "tpscope capture: error: cannot start the clock store on loopback: {}\n", storeError);
      return kExitFailure;
    }
    storeAddr_ = fmt::format("127.0.0.1:{}", store_->port());
    if (masterPort_ == 0) masterPort_ = freeLoopbackPort();
    if (masterPort_ == 0) {
      fmt::print(err_, "tpscope capture: error: no free loopback port for MASTER_PORT\n");
      return kExitFailure;
    }
  }

  for (const auto& a : argv_) command_ += (command_.empty() ? "" : " ") + shellQuote(a);
  const std::string pp = o_.pp > 1 ? fmt::format(" x pp {}", o_.pp) : "";
  if (o_.nnodes > 1)
    fmt::print(out_, "capture: node {} of {}: ranks {}-{} of {} (tp {} x dp {}{}) → {}\n  {}\n", o_.nodeRank,
               o_.nnodes, firstRank_, firstRank_ + o_.nproc - 1, world_, tp_, dp_, pp, dir_.string(), command_);
  else
    fmt::print(out_, "capture: {} ranks (tp {} x dp {}{}) → {}\n  {}\n", o_.nproc, tp_, dp_, pp, dir_.string(),
               command_);
  if (!faults_.empty()) fmt::print(out_, "  inject: {}\n", rules::formatFaultList(faults_));
  if (!healthText_.empty()) fmt::print(out_, "  health: {}\n", healthText_);
  if (!pythonNote_.empty()) fmt::print(out_, "  python: {}\n", pythonNote_);
  std::fflush(out_);
  return std::nullopt;
}

// Several nodes: node 0 serves the control channel and publishes the job (run id, time origin, layout); the others
// connect with the token, say hello and take the job's run id and time origin. Nothing is started before every node
// is in (bounded by --rendezvous-timeout).
std::optional<int> CaptureSession::connectNodes() {
  NodeLink::Options lo;
  lo.nnodes = o_.nnodes;
  lo.nodeRank = o_.nodeRank;
  lo.masterAddr = masterAddr_;
  lo.controlPort = o_.masterPort + 1;
  lo.rendezvousTimeout = std::chrono::milliseconds(static_cast<int64_t>(o_.rendezvousTimeoutS * 1000));
  lo.storeLimits = storeLimits(world_, o_.nnodes);
  if (token_.empty()) {
    token_ = makeToken();
    fmt::print(out_, "capture: the job's token is {} — give it to the other nodes (--token or TPSCOPE_TOKEN)\n",
               token_);
  }
  lo.token = token_;
  std::string error;
  bool refused = false;
  link_ = NodeLink::open(lo, &error, &refused);
  if (!link_) {
    fmt::print(err_, "tpscope capture: error: {}\n", error);
    return refused ? kExitBadArgs : kExitFailure;
  }
  storeAddr_ = link_->storeAddress();
  if (o_.nodeRank == 0) {
    fmt::print(out_, "capture: node 0 of {}: waiting for the other nodes on {} (at most {:g} s: "
                     "--rendezvous-timeout)\n",
               o_.nnodes, storeAddr_, o_.rendezvousTimeoutS);
    std::fflush(out_);
    if (!link_->waitForNodesAndPublish(JobInfo{runId_, epochNs_, o_.nproc, world_}, &error)) {
      fmt::print(err_, "tpscope capture: error: {}\n", error);
      return kExitFailure;
    }
    return std::nullopt;
  }
  const char* hostEnv = std::getenv("TPSCOPE_HOSTNAME");
  char host[256] = {};
  if (hostEnv != nullptr && *hostEnv != '\0') std::snprintf(host, sizeof host, "%s", hostEnv);
  else ::gethostname(host, sizeof host - 1);
  const auto job = link_->helloAndReadJob(host, &error);
  if (!job) {
    fmt::print(err_, "tpscope capture: error: {}\n", error);
    return kExitFailure;
  }
  if (job->worldSize != world_ || job->nprocPerNode != o_.nproc) {
    const std::string why = fmt::format("node {} has --nproc {} ({} ranks in all) but node 0 has --nproc {} ({} ranks)",
                                        o_.nodeRank, o_.nproc, world_, job->nprocPerNode, job->worldSize);
    link_->claimStop(kExitBadArgs, why);
    link_->postDone(kExitBadArgs);  // node 0 need not wait for this node's ranks: there are none
    return bad(why);
  }
  runId_ = job->runId;
  epochNs_ = job->epochNs;
  return std::nullopt;
}

// The store holds a descriptor per rank and node capture of the job (storeLimits()) plus the strangers it tolerates,
// and the poller a few per local rank: the soft open-file limit (often 1024) is raised to what the job needs, up to
// the hard limit. Below that, a warning: the ranks past it would run with unaligned clocks.
void CaptureSession::raiseOpenFileLimit(const probes::TcpKvLimits& limits) {
  const auto need = static_cast<rlim_t>(limits.maxClients + limits.maxPending + 4 * static_cast<size_t>(o_.nproc) + 64);
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need) return;
  rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? need : std::min(need, rl.rlim_max);
  if (::setrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur >= need) return;
  fmt::print(err_, "tpscope capture: warning: the open-file limit ({}) is below the {} descriptors the clock store "
                   "of {} ranks needs; ranks past it run with unaligned clocks (raise it: ulimit -n)\n",
             rl.rlim_cur, need, world_);
}

// ---- 3. spawn -------------------------------------------------------------------------------------------------------
std::optional<int> CaptureSession::spawn() {
  interrupts_.emplace();
  for (int local = 0; local < o_.nproc; ++local) {
    const int r = firstRank_ + local;
    std::map<std::string, std::string> set = {
        {"MASTER_ADDR", masterAddr_},
        {"MASTER_PORT", std::to_string(masterPort_)},
        {"RANK", std::to_string(r)},
        {"WORLD_SIZE", std::to_string(world_)},
        {"LOCAL_RANK", std::to_string(local)},
        {"LOCAL_WORLD_SIZE", std::to_string(o_.nproc)},
        {"GROUP_RANK", std::to_string(o_.nodeRank)},
        {"TPSCOPE_OUT", dir_.string()},
        {"TPSCOPE_RUN_ID", runId_},
        {"TPSCOPE_EPOCH_NS", std::to_string(epochNs_)},
        {"TPSCOPE_CLOCK_STORE", storeAddr_},
        {"TPSCOPE_INJECT", rules::formatFaultList(faults_)},
        {"TPSCOPE_HEALTH", healthText_},
        {"TPSCOPE_TP", std::to_string(tp_)},
        {"TPSCOPE_DP", std::to_string(dp_)},
        {"TPSCOPE_PP", std::to_string(o_.pp)},
    };
    if (!token_.empty()) set["TPSCOPE_TOKEN"] = token_;
    set.insert(programEnv_.begin(), programEnv_.end());
    if (std::getenv("OMP_NUM_THREADS") == nullptr) set["OMP_NUM_THREADS"] = "1";
    std::string error;
    auto p = RankProcess::spawn(r, argv_, rankEnvironment(set), logOf(r), &error);
    if (!p) {
      for (auto& q : ranks_) q.signal(SIGKILL);
      for (auto& q : ranks_)
        while (!q.poll() && q.running()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (link_) {  // the other nodes' ranks would wait for this node's at their rendezvous
        link_->claimStop(kExitBadArgs, fmt::format("node {}: rank {} could not start: {}", o_.nodeRank, r, error));
        link_->postDone(kExitBadArgs);
      }
      return bad(fmt::format("rank {}: {}", r, error));
    }
    ranks_.push_back(std::move(*p));
  }
  return std::nullopt;
}

}  // namespace tpscope::cli::capture
