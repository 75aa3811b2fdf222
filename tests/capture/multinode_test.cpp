// Many nodes on one machine (issue #13, part 3): two `tpscope capture` processes with --nnodes 2 --node-rank 0/1
// on loopback stand for two nodes — distinct host names through TPSCOPE_HOSTNAME, node 1's clock set off by a known
// amount through TPSCOPE_TEST_CLOCK_OFFSET_NS — and ranks started the way srun starts them (Slurm's variables only,
// no capture). Real tpscope-train ranks over loopback Gloo; every test has a TIMEOUT (CMakeLists.txt).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <regex>
#include <thread>

#include "capture_test_util.h"

namespace tpscope::capture_test {
namespace {

using Clock = std::chrono::steady_clock;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The environment of one "node": its host name, its clock offset, its token (set in the child before exec).
BeforeExec nodeEnvironment(const std::string& host, int64_t clockOffsetNs, const std::string& token) {
  return [host, clockOffsetNs, token] {
    ::setenv("TPSCOPE_HOSTNAME", host.c_str(), 1);
    if (clockOffsetNs != 0) ::setenv("TPSCOPE_TEST_CLOCK_OFFSET_NS", std::to_string(clockOffsetNs).c_str(), 1);
    if (token.empty()) ::unsetenv("TPSCOPE_TOKEN");
    else ::setenv("TPSCOPE_TOKEN", token.c_str(), 1);
    return 0;
  };
}

// `tpscope capture` of node `node` of a 2-node job of 2 ranks per node (TP = 2 inside a node, DP = 2 across them).
std::vector<std::string> nodeArgv(const fs::path& dir, int node, int port, int steps,
                                  const std::vector<std::string>& extra) {
  std::vector<std::string> more = {"--nnodes", "2", "--node-rank", std::to_string(node), "--master-addr",
                                   "127.0.0.1", "--master-port", std::to_string(port)};
  more.insert(more.end(), extra.begin(), extra.end());
  return captureArgv(dir, 2, 2, 2, steps, more);
}

struct NodeRun {
  RunResult result;
  double seconds = 0;  // from the start of both until this one ended
};

// Runs both node captures to their end (node 1 started first: the nodes may start in any order).
std::pair<NodeRun, NodeRun> runTwoNodes(const fs::path& dir0, const fs::path& dir1, int port, int steps,
                                        const std::vector<std::string>& extra0,
                                        const std::vector<std::string>& extra1, int64_t node1OffsetNs) {
  const auto t0 = Clock::now();
  const pid_t p1 = startProcess(nodeArgv(dir1, 1, port, steps, extra1), captureLog(dir1),
                                nodeEnvironment("node-b", node1OffsetNs, "job-token-1"));
  const pid_t p0 = startProcess(nodeArgv(dir0, 0, port, steps, extra0), captureLog(dir0),
                                nodeEnvironment("node-a", 0, "job-token-1"));
  std::pair<NodeRun, NodeRun> out;
  // Reap whichever ends first, and time each.
  for (int left = 2; left > 0; --left) {
    int st = 0;
    const pid_t pid = ::waitpid(-1, &st, 0);
    if (pid != p0 && pid != p1) {
      if (pid < 0) break;
      ++left;  // not one of ours
      continue;
    }
    NodeRun& r = pid == p0 ? out.first : out.second;
    r.result.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  out.first.result.output = readFile(captureLog(dir0));
  out.second.result.output = readFile(captureLog(dir1));
  return out;
}

RunResult merge(const std::vector<fs::path>& inputs, const fs::path& output) {
  std::vector<std::string> argv = {TPSCOPE_BIN, "merge"};
  for (const auto& i : inputs) argv.push_back(i.string());
  argv.insert(argv.end(), {"-o", output.string()});
  return run(argv, output.parent_path() / (output.stem().string() + ".merge.log"));
}

constexpr int64_t kNode1OffsetNs = 3'700'000'000;  // node 1's clock runs 3.7 s ahead

// `rank`'s stored clock offset is `expectedNs` within its stored uncertainty: the true offset between two processes
// of one machine is 0 but for the injected one and how each reads its realtime − monotonic difference (well under
// the 1 µs allowed). Prints the figures (the docs quote them).
void expectOffsetRecovered(Db& db, int rank, int64_t expectedNs, const char* label) {
  const auto row = db.rows("SELECT clock_offset_ns, clock_uncertainty_ns FROM ranks WHERE rank = " +
                           std::to_string(rank));
  ASSERT_EQ(row.size(), 1u) << label << " rank " << rank;
  const int64_t offset = std::stoll(row[0][0]), uncertainty = std::stoll(row[0][1]);
  std::printf("%s rank %d: clock offset %lld ns (expected %lld), uncertainty %lld ns, error %lld ns\n", label, rank,
              static_cast<long long>(offset), static_cast<long long>(expectedNs),
              static_cast<long long>(uncertainty), static_cast<long long>(offset - expectedNs));
  EXPECT_GT(uncertainty, 0) << label << " rank " << rank << " was not aligned";
  EXPECT_LT(uncertainty, 50'000'000) << label << " rank " << rank;
  EXPECT_LE(std::llabs(offset - expectedNs), uncertainty + 1'000) << label << " rank " << rank;
}

TEST(MultiNode, TwoNodeCapturesMergeIntoOneRunWithBothHostsAndAlignedClocks) {
  const auto root = testDir("multinode-healthy");
  const auto dir0 = root / "node0", dir1 = root / "node1";
  const int port = freePortPair();
  ASSERT_NE(port, 0);
  const auto [n0, n1] = runTwoNodes(dir0, dir1, port, 3, {"--hang-timeout", "60"}, {"--hang-timeout", "60"},
                                    kNode1OffsetNs);
  ASSERT_EQ(n0.result.status, 0) << n0.result.output << "\n---- node 1:\n" << n1.result.output;
  ASSERT_EQ(n1.result.status, 0) << n1.result.output;
  EXPECT_TRUE(contains(n0.result.output, "node 0 of 2: ranks 0-1 of 4")) << n0.result.output;
  EXPECT_TRUE(contains(n1.result.output, "node 1 of 2: ranks 2-3 of 4")) << n1.result.output;
  // Each node wrote its own ranks, in its own folder.
  EXPECT_TRUE(fs::exists(dir0 / "rank-0.db") && fs::exists(dir0 / "rank-1.db"));
  EXPECT_TRUE(fs::exists(dir1 / "rank-2.db") && fs::exists(dir1 / "rank-3.db"));
  EXPECT_FALSE(fs::exists(dir0 / "rank-2.db") || fs::exists(dir1 / "rank-0.db"));

  const fs::path runFile = root / "run.db";
  const RunResult m = merge({dir0, dir1}, runFile);
  ASSERT_EQ(m.status, 0) << m.output;
  Db db(runFile);
  EXPECT_EQ(db.integer("SELECT count(*) FROM ranks"), 4);
  EXPECT_EQ(db.integer("SELECT count(*) FROM ranks WHERE exit_reason = 'ok'"), 4);
  EXPECT_EQ(db.value("SELECT group_concat(host, ',') FROM (SELECT host FROM ranks ORDER BY rank)"),
            "node-a,node-a,node-b,node-b");
  EXPECT_EQ(db.integer("SELECT count(DISTINCT rank) FROM step_stats WHERE step = 3"), 4);

  // The injected offset is recovered: node 1's ranks measured −3.7 s, node 0's rank 1 about 0 (rank 0 is the
  // reference).
  for (int rank = 1; rank < 4; ++rank) expectOffsetRecovered(db, rank, rank >= 2 ? -kNode1OffsetNs : 0, "capture");
  // An independent look: the two members of every completed DP all-reduce (one rank per node) leave it at about
  // the same moment. In node 1's own files its times are 3.7 s ahead; in the merged run they are not.
  const std::string pairs =
      "SELECT max(abs(a.end_ns - b.end_ns)) FROM collectives a JOIN collectives b ON b.group_name = a.group_name "
      "AND b.seq = a.seq AND b.rank = a.rank + 2 WHERE a.group_name LIKE 'dp-%' AND a.state = 'completed' AND "
      "b.state = 'completed'";
  const int64_t spreadMerged = db.integer(pairs);
  EXPECT_GE(spreadMerged, 0);
  EXPECT_LT(spreadMerged, 500'000'000) << "DP all-reduce ends differ by " << spreadMerged << " ns across nodes";
  Db raw1(dir1 / "rank-2.db"), raw0(dir0 / "rank-0.db");
  const int64_t firstEnd1 = raw1.integer("SELECT min(end_ns) FROM collectives WHERE group_name = 'dp-0'");
  const int64_t firstEnd0 = raw0.integer("SELECT min(end_ns) FROM collectives WHERE group_name = 'dp-0'");
  EXPECT_NEAR(static_cast<double>(firstEnd1 - firstEnd0), static_cast<double>(kNode1OffsetNs), 5e8);
}

TEST(MultiNode, HangOnOneNodeStopsBothAndIsDiagnosedFromTheMergedRun) {
  const auto root = testDir("multinode-hang");
  const auto dir0 = root / "node0", dir1 = root / "node1";
  const int port = freePortPair();
  ASSERT_NE(port, 0);
  // Rank 3 (node 1) never enters its first forward collective of step 2. Node 1's watchdog (4 s) fires; node 0's
  // own watchdog would wait 60 s, so node 0 stopping within seconds is the stop coming over the control channel.
  const std::vector<std::string> inject = {"--inject", "hang:rank=3,step=2,phase=fwd", "--grace", "3"};
  std::vector<std::string> extra0 = inject, extra1 = inject;
  extra0.insert(extra0.end(), {"--hang-timeout", "60"});
  extra1.insert(extra1.end(), {"--hang-timeout", "4"});
  const auto [n0, n1] = runTwoNodes(dir0, dir1, port, 6, extra0, extra1, kNode1OffsetNs);
  EXPECT_EQ(n1.result.status, 3) << n1.result.output;
  EXPECT_EQ(n0.result.status, 3) << n0.result.output << "\n---- node 1:\n" << n1.result.output;
  EXPECT_TRUE(contains(n1.result.output, "no progress for 4 s")) << n1.result.output;
  EXPECT_TRUE(contains(n0.result.output, "node 1 stopped the job")) << n0.result.output;
  std::printf("node 1 ended after %.1f s, node 0 after %.1f s\n", n1.seconds, n0.seconds);
  EXPECT_LT(n0.seconds, 50.0) << "node 0 waited for its own watchdog instead of node 1's stop";
  EXPECT_LT(std::abs(n0.seconds - n1.seconds), 20.0);

  const fs::path runFile = root / "run.db";
  const RunResult m = merge({dir0, dir1}, runFile);
  ASSERT_EQ(m.status, 0) << m.output;
  Db db(runFile);
  EXPECT_EQ(db.integer("SELECT count(*) FROM ranks"), 4);
  // Node 1's ranks were stopped by its watchdog; node 0's by node 1's stop — or, when node 1's ranks were gone
  // before node 0's SIGTERM came, by their own collective failing. No rank crashed.
  EXPECT_EQ(db.integer("SELECT count(*) FROM ranks WHERE rank >= 2 AND exit_reason LIKE "
                       "'stopped by capture (hang watchdog%'"), 2);
  EXPECT_EQ(db.integer("SELECT count(*) FROM ranks WHERE exit_reason LIKE 'crash%'"), 0);
  const int64_t seq2 = db.integer("SELECT max(seq) FROM collectives WHERE rank = 2 AND group_name = 'tp-1'");
  const int64_t seq3 = db.integer("SELECT max(seq) FROM collectives WHERE rank = 3 AND group_name = 'tp-1'");
  EXPECT_EQ(seq3 + 1, seq2) << "rank 3 never entered tp-1 seq " << seq2;
  const Diagnosis d = diagnose(runFile);
  bool named = false;
  for (const auto& f : d.ofKind("hang", "critical"))
    named |= f.group == "tp-1" && f.seq == seq2 &&
             (f.rank == 3 || std::find(f.ranks.begin(), f.ranks.end(), 3) != f.ranks.end());
  EXPECT_TRUE(named) << "no hang finding naming rank 3 on (tp-1, " << seq2 << "):\n" << d.summary() << d.json;
}

TEST(MultiNode, CrashOnNodeZeroStopsNodeOneWithTheSameStatus) {
  const auto root = testDir("multinode-crash");
  const auto dir0 = root / "node0", dir1 = root / "node1";
  const int port = freePortPair();
  ASSERT_NE(port, 0);
  // Rank 1 (node 0) aborts at step 3. Node 1's ranks then see their DP peer gone; whichever way they end, node 1
  // reports the job's cause — node 0's crash — and exits 4 as node 0 does.
  const std::vector<std::string> extra = {"--inject", "crash:rank=1,step=3", "--hang-timeout", "60", "--grace", "3"};
  const auto [n0, n1] = runTwoNodes(dir0, dir1, port, 8, extra, extra, 0);
  EXPECT_EQ(n0.result.status, 4) << n0.result.output;
  EXPECT_EQ(n1.result.status, 4) << n1.result.output << "\n---- node 0:\n" << n0.result.output;
  EXPECT_TRUE(contains(n1.result.output, "node 0 stopped the job")) << n1.result.output;
  std::printf("node 0 ended after %.1f s, node 1 after %.1f s\n", n0.seconds, n1.seconds);
  EXPECT_LT(std::abs(n0.seconds - n1.seconds), 15.0);

  const fs::path runFile = root / "run.db";
  const RunResult m = merge({dir1, dir0}, runFile);  // folders in any order
  ASSERT_EQ(m.status, 0) << m.output;
  Db db(runFile);
  EXPECT_EQ(db.integer("SELECT count(*) FROM ranks"), 4);
  EXPECT_EQ(db.value("SELECT exit_reason FROM ranks WHERE rank = 1"), "crash: killed by signal SIGABRT");
  EXPECT_EQ(db.integer("SELECT count(*) FROM ranks WHERE rank <> 1 AND exit_reason LIKE 'crash%'"), 0);
  const Diagnosis d = diagnose(runFile);
  const auto crashed = d.ofKind("crash", "critical");
  ASSERT_EQ(crashed.size(), 1u) << d.summary();
  EXPECT_EQ(crashed[0].rank, 1) << d.summary();
}

TEST(MultiNode, BadNodeArgumentsExitTwoBeforeStartingAnything) {
  const auto dir = testDir("multinode-badargs");
  const auto tiny = [&](const std::vector<std::string>& more) {
    std::vector<std::string> argv = captureArgv(dir, 2, 2, 2, 2, more);
    return run(argv, dir.parent_path() / "multinode-badargs.log", nodeEnvironment("node-a", 0, "t"));
  };
  RunResult r = tiny({"--nnodes", "2", "--node-rank", "0", "--master-port", "29500"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "needs --master-addr")) << r.output;
  r = tiny({"--nnodes", "2", "--node-rank", "2", "--master-addr", "127.0.0.1", "--master-port", "29500"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--node-rank 2 must be between 0 and --nnodes - 1 = 1")) << r.output;
  r = tiny({"--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "needs --master-port")) << r.output;
  // --tp 2 x --dp 2 = 4 ranks, but three nodes of 2 make 6.
  r = tiny({"--nnodes", "3", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", "29500"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "the job's 6 ranks (--nnodes x --nproc)")) << r.output;
  // --inject names global ranks: rank 3 exists in a 2 x 2 job.
  r = tiny({"--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", "29500", "--inject",
            "hang:rank=4,step=1"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 4 does not exist in a job of 4 ranks")) << r.output;
  EXPECT_FALSE(fs::exists(dir / "rank-2.db"));
}

// Node 1 with another layout than node 0's: it refuses, and its stop ends node 0 (whose ranks had started) too.
TEST(MultiNode, ALayoutThatDiffersFromNodeZerosStopsTheJob) {
  const auto root = testDir("multinode-layout");
  const auto dir0 = root / "node0", dir1 = root / "node1";
  const int port = freePortPair();
  ASSERT_NE(port, 0);
  const auto t0 = Clock::now();
  const pid_t p0 = startProcess(nodeArgv(dir0, 0, port, 3, {"--hang-timeout", "60"}), captureLog(dir0),
                                nodeEnvironment("node-a", 0, "tok"));
  std::vector<std::string> argv1 = captureArgv(dir1, 1, 2, 1, 3, {"--nnodes", "2", "--node-rank", "1", "--master-addr",
                                                                  "127.0.0.1", "--master-port", std::to_string(port)});
  const RunResult r1 = run(argv1, captureLog(dir1), nodeEnvironment("node-b", 0, "tok"));
  EXPECT_EQ(r1.status, 2) << r1.output;
  EXPECT_TRUE(contains(r1.output, "node 1 has --nproc 1 (2 ranks in all) but node 0 has --nproc 2 (4 ranks)"))
      << r1.output;
  const int status0 = waitStatus(p0);
  const std::string out0 = readFile(captureLog(dir0));
  EXPECT_EQ(status0, 2) << out0;
  EXPECT_TRUE(contains(out0, "node 1 stopped the job")) << out0;
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 20.0) << out0;  // no wait for node 1's end
}

TEST(MultiNode, AWrongTokenIsRefused) {
  const auto root = testDir("multinode-token");
  const auto dir0 = root / "node0", dir1 = root / "node1";
  const int port = freePortPair();
  ASSERT_NE(port, 0);
  // Node 1 without any token: refused before anything starts.
  RunResult r = run(nodeArgv(dir1, 1, port, 2, {}), root / "no-token.log", nodeEnvironment("node-b", 0, ""));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "needs the job's token")) << r.output;
  // Node 0 with the job's token, node 1 with another: node 1 is refused at once; node 0 gives up at --join-timeout
  // (the old name of --rendezvous-timeout, still accepted).
  const auto t0 = Clock::now();
  const pid_t p0 = startProcess(nodeArgv(dir0, 0, port, 2, {"--join-timeout", "6"}), captureLog(dir0),
                                nodeEnvironment("node-a", 0, "the-right-token"));
  r = run(nodeArgv(dir1, 1, port, 2, {"--token", "a-wrong-token", "--join-timeout", "20"}), captureLog(dir1),
          nodeEnvironment("node-b", 0, ""));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "refused this node's token")) << r.output;
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 15.0);
  const int status0 = waitStatus(p0);
  const std::string out0 = readFile(captureLog(dir0));
  EXPECT_EQ(status0, 1) << out0;
  EXPECT_TRUE(contains(out0, "node 1 never joined within 6 s (--rendezvous-timeout); 1 of 2 nodes came")) << out0;
  EXPECT_FALSE(fs::exists(dir0 / "rank-0.db"));  // no rank was started
}

// ---- the store against strangers; the rendezvous timeout (issues #31 §4, #30 §4) ----------------------------------

// A loopback connection to `port` (a stranger's, or the test speaking the store's protocol); -1 when refused. The
// connect gives up after 200 ms (a full backlog).
int rawConnect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{0, 200'000};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool sendBytes(int fd, const std::string& bytes) {
  return ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

std::string u32(uint32_t v) {
  return {static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16), static_cast<char>(v >> 24)};
}

// The store's requests (probes/runtime tcp_store.h): 'A' presents a token, 'S' sets a key.
std::string authRequest(const std::string& token) {
  return "A" + u32(static_cast<uint32_t>(token.size())) + token + u32(0);
}
std::string setRequest(const std::string& key, const std::string& value) {
  return "S" + u32(static_cast<uint32_t>(key.size())) + key + u32(static_cast<uint32_t>(value.size())) + value;
}

// The store's one-byte status reply (0 ok, 2 refused) within `limit`; -1 when it closed the connection instead, -2
// when nothing came.
int readStatus(int fd, std::chrono::milliseconds limit) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(limit.count())) <= 0) return -2;
  unsigned char status = 0;
  return ::recv(fd, &status, 1, 0) == 1 ? status : -1;
}

// Strangers on a store's port until stop(): `idle` ones connect and say nothing, `slow` ones trickle a login one byte
// every 500 ms (slow-loris), `garbage` ones send junk. One the server drops reconnects 300 ms later, so the crowd
// keeps its size for the whole capture. Counts the drops, by kind. One thread, polling every 50 ms.
class StrangerCrowd {
 public:
  enum Kind { kIdle, kSlow, kGarbage, kKinds };
  StrangerCrowd(int port, int idle, int slow, int garbage) : port_(port) {
    for (auto [kind, n] : {std::pair{kIdle, idle}, {kSlow, slow}, {kGarbage, garbage}})
      for (int i = 0; i < n; ++i) slots_.push_back(Slot{kind});
    thread_ = std::thread([this] { run(); });
  }
  ~StrangerCrowd() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    for (Slot& s : slots_) {
      if (s.fd >= 0) {
        const linger reset{1, 0};  // RST: no TIME_WAIT left on hundreds of the machine's ephemeral ports
        ::setsockopt(s.fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
        ::close(s.fd);
      }
      s.fd = -1;
    }
  }
  int dropped(Kind k) const { return dropped_[k].load(); }
  int connects() const { return connects_.load(); }

 private:
  struct Slot {
    Kind kind;
    int fd = -1;
    size_t sent = 0;  // slow: bytes of its login sent so far
    Clock::time_point next{};
  };

  void run() {
    // A login that would take 2,000 s at one byte per 500 ms: a 4,000-byte token.
    const std::string slowLogin = authRequest(std::string(4000, 't'));
    std::vector<pollfd> fds;
    std::vector<Slot*> polled;
    while (!stop_) {
      const auto now = Clock::now();
      fds.clear();
      polled.clear();
      for (Slot& s : slots_) {
        if (s.fd < 0 && now >= s.next) {
          s.fd = rawConnect(port_);
          s.sent = 0;
          s.next = now;
          if (s.fd < 0) {
            s.next = now + std::chrono::milliseconds(300);  // node 0 not listening yet
          } else {
            ++connects_;
          }
          if (s.fd >= 0 && s.kind == kGarbage) sendBytes(s.fd, "GET / HTTP/1.1\r\nHost: node0\r\n\r\n");
        }
        if (s.fd >= 0 && s.kind == kSlow && now >= s.next && s.sent < slowLogin.size()) {
          sendBytes(s.fd, slowLogin.substr(s.sent++, 1));
          s.next = now + std::chrono::milliseconds(500);
        }
        if (s.fd >= 0) {
          fds.push_back({s.fd, POLLIN, 0});
          polled.push_back(&s);
        }
      }
      ::poll(fds.data(), fds.size(), 50);
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        char buf[256];
        const ssize_t n = ::recv(fds[i].fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR))) continue;
        Slot& s = *polled[i];
        ::close(s.fd);
        s.fd = -1;
        s.next = Clock::now() + std::chrono::milliseconds(300);
        ++dropped_[s.kind];
      }
    }
  }

  const int port_;
  std::vector<Slot> slots_;
  std::atomic<bool> stop_{false};
  std::atomic<int> dropped_[kKinds] = {};
  std::atomic<int> connects_{0};
  std::thread thread_;
};

// Hundreds of strangers hold, trickle into and spam node 0's store (the control channel and clock store, master-port
// + 1) for the whole of a real two-node capture — more than the store keeps waiting at once (256), so it must drop
// them: the oldest pushed out for newer ones, any left at their login deadline. Node 1, and every rank of both
// nodes, gets in through the crowd: both nodes finish, every rank's clock aligned through the store. Without the
// guards (the store before issue #31) the strangers are never dropped; with a cap but no pushing out, they fill the
// store and the nodes or ranks cannot get in.
TEST(MultiNode, StrangersFloodingTheStoreCannotStallATwoNodeCapture) {
  const auto root = testDir("multinode-strangers");
  const auto dir0 = root / "node0", dir1 = root / "node1";
  const int port = freePortPair();
  ASSERT_NE(port, 0);
  // A node locked out gives up within a minute (not at the default 900 s), and the test fails on its exit status.
  const std::vector<std::string> extra = {"--hang-timeout", "60", "--rendezvous-timeout", "60"};
  // Node 0 first, the crowd once its store listens (strangers that connect to a port nobody listens on yet may be
  // given it as their own source port — a loopback self-connect — and hold it against node 0), then node 1, which
  // has to get in through the crowd, as every rank of both nodes does.
  const auto t0 = Clock::now();
  const pid_t p0 =
      startProcess(nodeArgv(dir0, 0, port, 3, extra), captureLog(dir0), nodeEnvironment("node-a", 0, "job-token-1"));
  const auto node0Running = [p0] {  // peeks, leaving the exit status to waitStatus()
    siginfo_t info{};
    return ::waitid(P_PID, static_cast<id_t>(p0), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == 0;
  };
  while (!contains(readFile(captureLog(dir0)), "waiting for the other nodes") &&
         Clock::now() - t0 < std::chrono::seconds(20) && node0Running())
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  StrangerCrowd crowd(port + 1, 300, 100, 50);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the crowd is in before node 1 comes
  const pid_t p1 = startProcess(nodeArgv(dir1, 1, port, 3, extra), captureLog(dir1),
                                nodeEnvironment("node-b", kNode1OffsetNs, "job-token-1"));
  NodeRun n0, n1;
  n1.result.status = waitStatus(p1);
  n0.result.status = waitStatus(p0);
  n0.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  crowd.stop();
  n0.result.output = readFile(captureLog(dir0));
  n1.result.output = readFile(captureLog(dir1));
  std::printf("strangers: %d connections; dropped %d idle, %d slow-loris, %d garbage; the capture took %.1f s\n",
              crowd.connects(), crowd.dropped(StrangerCrowd::kIdle), crowd.dropped(StrangerCrowd::kSlow),
              crowd.dropped(StrangerCrowd::kGarbage), n0.seconds);
  ASSERT_EQ(n0.result.status, 0) << n0.result.output << "\n---- node 1:\n" << n1.result.output;
  ASSERT_EQ(n1.result.status, 0) << n1.result.output;
  // Node 0's exit closes every stranger's connection once; more drops than strangers of a kind means the store
  // dropped them while it ran.
  EXPECT_GT(crowd.dropped(StrangerCrowd::kIdle), 300) << "silent strangers were never dropped";
  EXPECT_GT(crowd.dropped(StrangerCrowd::kSlow), 100) << "slow-loris strangers were never dropped";
  EXPECT_GT(crowd.dropped(StrangerCrowd::kGarbage), 50) << "garbage was never dropped";
  // And node 0 says so, by cause: strangers that never logged in were dropped by the guards, not only the garbage.
  std::smatch said;
  ASSERT_TRUE(std::regex_search(n0.result.output, said,
                                std::regex(R"((\d+) silent past the login deadline, (\d+) pushed out by newer ones)")))
      << n0.result.output;
  EXPECT_GT(std::stoi(said[1]) + std::stoi(said[2]), 0) << said[0];
  const fs::path runFile = root / "run.db";
  const RunResult m = merge({dir0, dir1}, runFile);
  ASSERT_EQ(m.status, 0) << m.output;
  Db db(runFile);
  EXPECT_EQ(db.integer("SELECT count(*) FROM ranks WHERE exit_reason = 'ok'"), 4);
  for (int rank = 1; rank < 4; ++rank) expectOffsetRecovered(db, rank, rank >= 2 ? -kNode1OffsetNs : 0, "strangers");
}

// Three nodes, node 2 never starts. Node 0 gives up at --rendezvous-timeout, naming node 2 and only it, and exits
// 1; node 1, which did join, learns it when node 0's channel closes (not at its own, longer timeout) and exits 1
// too. No rank starts anywhere: node 0 publishes the job only once every node is in.
TEST(MultiNode, ANodeThatNeverJoinsIsNamedAtTheRendezvousTimeout) {
  const auto root = testDir("multinode-rendezvous");
  const auto dir0 = root / "node0", dir1 = root / "node1";
  const int port = freePortPair();
  ASSERT_NE(port, 0);
  const auto argvOf = [&](const fs::path& dir, int node, const char* timeout) {
    return captureArgv(dir, 2, 2, 3, 2,
                       {"--nnodes", "3", "--node-rank", std::to_string(node), "--master-addr", "127.0.0.1",
                        "--master-port", std::to_string(port), "--rendezvous-timeout", timeout});
  };
  const auto t0 = Clock::now();
  const auto since = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  const pid_t p1 = startProcess(argvOf(dir1, 1, "60"), captureLog(dir1), nodeEnvironment("node-b", 0, "tok-3"));
  const pid_t p0 = startProcess(argvOf(dir0, 0, "4"), captureLog(dir0), nodeEnvironment("node-a", 0, "tok-3"));
  const int status0 = waitStatus(p0);
  const double ended0 = since();
  const int status1 = waitStatus(p1);
  const double ended1 = since();
  const std::string out0 = readFile(captureLog(dir0)), out1 = readFile(captureLog(dir1));
  std::printf("node 0 gave up after %.1f s, node 1 ended after %.1f s\n", ended0, ended1);
  EXPECT_EQ(status0, 1) << out0;
  EXPECT_TRUE(contains(out0, "(at most 4 s: --rendezvous-timeout)")) << out0;
  EXPECT_TRUE(contains(out0, "node 2 never joined within 4 s (--rendezvous-timeout); 2 of 3 nodes came")) << out0;
  EXPECT_FALSE(contains(out0, "node 1 never joined") || contains(out0, "nodes 1")) << out0;
  EXPECT_GE(ended0, 3.5);
  EXPECT_LT(ended0, 30.0);
  EXPECT_EQ(status1, 1) << out1;
  EXPECT_TRUE(contains(out1, "node 0's capture ended before the job started")) << out1;
  EXPECT_LT(ended1 - ended0, 15.0) << "node 1 waited for its own timeout";
  EXPECT_FALSE(fs::exists(dir0 / "rank-0.db") || fs::exists(dir1 / "rank-2.db")) << "a rank was started";
}

// One node: capture's clock store on loopback asks for a token too (other users of the machine reach 127.0.0.1), and
// only its ranks get it. A program that writes down its TPSCOPE_CLOCK_STORE and TPSCOPE_TOKEN stands for a rank; the
// test is the other local user. Broken (a store without a token): the request without one is answered.
TEST(MultiNode, OneNodeStoreOnLoopbackAdmitsOnlyItsRanks) {
  const auto dir = testDir("singlenode-store-token");
  const std::string script =
      "printf '%s %s\\n' \"$TPSCOPE_CLOCK_STORE\" \"$TPSCOPE_TOKEN\" > \"$TPSCOPE_OUT/store.tmp\" && "
      "mv \"$TPSCOPE_OUT/store.tmp\" \"$TPSCOPE_OUT/store.txt\" && sleep 4";
  const pid_t p =
      startProcess({TPSCOPE_BIN, "capture", "--nproc", "1", "--out", dir.string(), "--", "/bin/sh", "-c", script},
                   captureLog(dir), nodeEnvironment("node-a", 0, ""));
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  int st = 0;
  while (!fs::exists(dir / "store.txt") && Clock::now() < deadline) {
    ASSERT_EQ(::waitpid(p, &st, WNOHANG), 0)
        << "capture ended before its rank wrote down the store: status " << st << "\n"
        << readFile(captureLog(dir));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::istringstream in(readFile(dir / "store.txt"));
  std::string address, token;
  in >> address >> token;
  const size_t colon = address.rfind(':');
  ASSERT_TRUE(address.starts_with("127.0.0.1:") && colon != std::string::npos) << "store: '" << address << "'\n"
                                                                               << readFile(captureLog(dir));
  const int storePort = std::stoi(address.substr(colon + 1));
  EXPECT_GE(token.size(), 16u) << "the ranks got no token";

  const int none = rawConnect(storePort);  // no token: the request is not answered, the connection is closed
  ASSERT_GE(none, 0);
  ASSERT_TRUE(sendBytes(none, setRequest("tpscope/intruder", "x")));
  EXPECT_EQ(readStatus(none, std::chrono::seconds(3)), -1);
  const int wrong = rawConnect(storePort);
  ASSERT_GE(wrong, 0);
  ASSERT_TRUE(sendBytes(wrong, authRequest(token + "x")));
  EXPECT_EQ(readStatus(wrong, std::chrono::seconds(3)), 2);  // refused
  const int rank = rawConnect(storePort);
  ASSERT_GE(rank, 0);
  ASSERT_TRUE(sendBytes(rank, authRequest(token)));
  EXPECT_EQ(readStatus(rank, std::chrono::seconds(3)), 0);
  ASSERT_TRUE(sendBytes(rank, setRequest("tpscope/test", "x")));
  EXPECT_EQ(readStatus(rank, std::chrono::seconds(3)), 0);
  for (int fd : {none, wrong, rank}) ::close(fd);
  const int status = waitStatus(p);  // the "rank" writes no trace: exit 1, but within its 4 s
  EXPECT_NE(status, -1);
}

// Ranks started as srun starts them — SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / SLURM_JOB_ID, no RANK or
// WORLD_SIZE, no tpscope capture — record the same files with one run id, align their clocks through the job's own
// rendezvous (tpscope-train's c10d store at MASTER_ADDR:MASTER_PORT), and dump on the SIGTERM srun sends.
TEST(MultiNode, SlurmRanksWithoutCaptureRecordAlignAndDumpOnSigterm) {
  const auto dir = testDir("multinode-slurm");
  const int port = freePortPair();
  ASSERT_NE(port, 0);
  constexpr int64_t kOffsetNs = -2'500'000'000;  // rank 1's "host" clock is 2.5 s behind
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    const std::vector<std::string> argv = {TPSCOPE_TRAIN_BIN, "--config", TPSCOPE_TINY_CONFIG, "--tp", "2",
                                           "--steps", "400"};
    pids.push_back(startProcess(argv, dir / ("rank-" + std::to_string(rank) + ".log"), [rank, port, dir] {
      for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TPSCOPE_RUN_ID",
                            "TPSCOPE_EPOCH_NS", "TPSCOPE_CLOCK_STORE", "TORCHELASTIC_RUN_ID"})
        ::unsetenv(v);
      ::setenv("SLURM_PROCID", std::to_string(rank).c_str(), 1);
      ::setenv("SLURM_LOCALID", std::to_string(rank).c_str(), 1);
      ::setenv("SLURM_NTASKS", "2", 1);
      ::setenv("SLURM_JOB_ID", "4242", 1);
      ::setenv("SLURM_STEP_ID", "0", 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("TPSCOPE_OUT", dir.c_str(), 1);
      ::setenv("OMP_NUM_THREADS", "1", 1);
      ::setenv("TPSCOPE_HOSTNAME", rank == 0 ? "slurm-a" : "slurm-b", 1);
      if (rank == 1) ::setenv("TPSCOPE_TEST_CLOCK_OFFSET_NS", std::to_string(kOffsetNs).c_str(), 1);
      return 0;
    }));
  }
  // Once both ranks have recorded step 3, send SIGTERM as srun does on scancel or a time limit.
  bool running = false;
  for (int i = 0; i < 600 && !running; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    running = true;
    for (int rank = 0; rank < 2 && running; ++rank) {
      const fs::path f = dir / ("rank-" + std::to_string(rank) + ".db");
      if (!fs::exists(f)) {
        running = false;
        break;
      }
      Db db(f);
      running = db.integer("SELECT max(step) FROM step_stats", true) >= 3;
    }
  }
  for (pid_t p : pids) ::kill(p, SIGTERM);
  std::vector<int> statuses;
  for (pid_t p : pids) statuses.push_back(waitStatus(p));
  ASSERT_TRUE(running) << readFile(dir / "rank-0.log") << readFile(dir / "rank-1.log");
  for (int s : statuses) EXPECT_EQ(s, 128 + SIGTERM);  // the dump re-raises SIGTERM: the launcher sees it

  const fs::path runFile = dir / "run.db";
  const RunResult m = merge({dir}, runFile);
  ASSERT_EQ(m.status, 0) << m.output;
  Db db(runFile);
  EXPECT_EQ(db.integer("SELECT count(*) FROM ranks"), 2);
  EXPECT_EQ(db.value("SELECT value FROM meta WHERE key = 'run_id'"), "slurm-4242.0");
  EXPECT_EQ(db.value("SELECT group_concat(host, ',') FROM (SELECT host FROM ranks ORDER BY rank)"), "slurm-a,slurm-b");
  EXPECT_EQ(db.integer("SELECT count(*) FROM ranks WHERE exit_reason = 'signal SIGTERM'"), 2);
  EXPECT_EQ(db.integer("SELECT count(DISTINCT rank) FROM step_stats WHERE step = 3"), 2);
  expectOffsetRecovered(db, 1, -kOffsetNs, "slurm");
}

// Two ranks with torchrun's environment and no capture (no TPSCOPE_CLOCK_STORE), rank 1's clock `offsetNs` off:
// runs `argv` (with `extraEnv`) in each to its end, merges the folder, and checks the run id (torchrun's
// TORCHELASTIC_RUN_ID and the rendezvous address), the hosts and rank 1's recovered offset. The program hands the
// recorder no store of its own, so the ranks align through the one rank 0's runtime serves at MASTER_PORT + 1.
void expectTorchrunRanksAligned(const std::string& name, const std::vector<std::string>& argv,
                                const std::map<std::string, std::string>& extraEnv, int64_t offsetNs) {
  const auto dir = testDir("multinode-" + name);
  const int port = freePortPair();
  ASSERT_NE(port, 0);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank)
    pids.push_back(startProcess(argv, dir / ("rank-" + std::to_string(rank) + ".log"), [&, rank] {
      for (const char* v : {"TPSCOPE_RUN_ID", "TPSCOPE_EPOCH_NS", "TPSCOPE_CLOCK_STORE", "SLURM_JOB_ID", "SLURM_PROCID",
                            "TPSCOPE_TOKEN"})
        ::unsetenv(v);
      std::map<std::string, std::string> env = {
          {"RANK", std::to_string(rank)},     {"LOCAL_RANK", std::to_string(rank)},   {"WORLD_SIZE", "2"},
          {"TORCHELASTIC_RUN_ID", "job7"},    {"MASTER_ADDR", "127.0.0.1"},           {"MASTER_PORT", std::to_string(port)},
          {"TPSCOPE_OUT", dir.string()},      {"TPSCOPE_HOSTNAME", rank == 0 ? "torch-a" : "torch-b"},
          {"OMP_NUM_THREADS", "1"}};
      if (rank == 1) env["TPSCOPE_TEST_CLOCK_OFFSET_NS"] = std::to_string(offsetNs);
      env.insert(extraEnv.begin(), extraEnv.end());
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      return 0;
    }));
  for (pid_t p : pids) EXPECT_EQ(waitStatus(p), 0) << readFile(dir / "rank-0.log") << readFile(dir / "rank-1.log");
  const fs::path runFile = dir / "run.db";
  const RunResult m = merge({dir}, runFile);
  ASSERT_EQ(m.status, 0) << m.output;
  Db db(runFile);
  EXPECT_EQ(db.integer("SELECT count(*) FROM ranks"), 2);
  EXPECT_EQ(db.value("SELECT value FROM meta WHERE key = 'run_id'"), "torchrun-job7-127.0.0.1:" + std::to_string(port));
  EXPECT_EQ(db.value("SELECT group_concat(host, ',') FROM (SELECT host FROM ranks ORDER BY rank)"), "torch-a,torch-b");
  EXPECT_GT(db.integer("SELECT count(*) FROM collectives WHERE rank = 1"), 0);
  expectOffsetRecovered(db, 1, -offsetNs, name.c_str());
}

#ifdef TPSCOPE_MINIMAL_TRAINER
// A C++ program that only starts the recorder from the environment (samples/minimal_trainer).
TEST(MultiNode, TorchrunRanksWithoutCaptureAlignThroughRankZerosStore) {
  expectTorchrunRanksAligned("torchrun", {TPSCOPE_MINIMAL_TRAINER, "--steps", "20"}, {}, 1'300'000'000);
}
#endif

#ifdef TPSCOPE_PYTHON_BIN
// An unchanged PyTorch script run as torchrun would run it (-m tpscope.run), its host named by TPSCOPE_HOSTNAME.
TEST(MultiNode, TorchrunPythonRanksWithoutCaptureAlignThroughRankZerosStore) {
  expectTorchrunRanksAligned("torchrun-python",
                             {TPSCOPE_PYTHON_BIN, "-m", "tpscope.run", TPSCOPE_PY_SAMPLE, "--steps", "4"},
                             {{"PYTHONPATH", TPSCOPE_PYTHON_PATH}, {"TPSCOPE_TP", "2"}}, -900'000'000);
}
#endif

}  // namespace
}  // namespace tpscope::capture_test
