// `tpscope watch DIR` on jobs capture did not start (issue #30 §2): real tpscope-train ranks started the way torchrun
// starts them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT, TPSCOPE_OUT; no capture), with faults injected through
// tpscope-train's own --inject. The watch must name a hang live — the right rank, the right collective, seconds
// after the last rank blocked — and exit with capture's status: 3 for a hang, 4 for a crash, 0 for a healthy run
// (and print no stall line then); bad folders get a message and a non-zero status.
#include <chrono>
#include <thread>

#include "capture_test_util.h"

namespace tpscope::capture_test {
namespace {

using Clock = std::chrono::steady_clock;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Starts `world` tpscope-train ranks with torchrun's environment, writing into `dir`; `extra` goes to every rank's
// command line (e.g. --inject: tpscope-train passes it on to its own engine as TPSCOPE_INJECT).
std::vector<pid_t> startTorchrunRanks(const fs::path& dir, int world, int steps,
                                      const std::vector<std::string>& extra) {
  const int port = freePortPair();
  EXPECT_NE(port, 0);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    std::vector<std::string> argv = {TPSCOPE_TRAIN_BIN,     "--config", TPSCOPE_TINY_CONFIG,  "--tp",
                                     std::to_string(world), "--steps",  std::to_string(steps)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    pids.push_back(startProcess(
        argv, dir.parent_path() / (dir.filename().string() + "-rank-" + std::to_string(rank) + ".log"), [=] {
          for (const char* v : {"TPSCOPE_RUN_ID", "TPSCOPE_EPOCH_NS", "TPSCOPE_CLOCK_STORE", "TPSCOPE_INJECT",
                                "TPSCOPE_HOSTNAME", "SLURM_PROCID"})
            ::unsetenv(v);
          const std::map<std::string, std::string> env = {{"RANK", std::to_string(rank)},
                                                          {"LOCAL_RANK", std::to_string(rank)},
                                                          {"WORLD_SIZE", std::to_string(world)},
                                                          {"LOCAL_WORLD_SIZE", std::to_string(world)},
                                                          {"TORCHELASTIC_RUN_ID", "watch"},
                                                          {"MASTER_ADDR", "127.0.0.1"},
                                                          {"MASTER_PORT", std::to_string(port)},
                                                          {"TPSCOPE_OUT", dir.string()},
                                                          {"OMP_NUM_THREADS", "1"}};
          for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
          return 0;
        }));
  }
  return pids;
}

void killAll(const std::vector<pid_t>& pids) {
  for (pid_t p : pids) ::kill(p, SIGKILL);
  for (pid_t p : pids) waitStatus(p);
}

// `log` removed first: a poll of it must never read a previous run's lines before the process (a forked child)
// truncates it.
fs::path freshLog(const fs::path& log) {
  std::error_code ec;
  fs::remove(log, ec);
  return log;
}

fs::path watchLog(const fs::path& dir) {
  return dir.parent_path() / (dir.filename().string() + ".watch.log");
}

std::vector<std::string> watchArgv(const fs::path& dir, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {TPSCOPE_BIN, "watch", dir.string()};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

int64_t unixNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A hang injected into a torchrun-style job: rank 1 skips its first collective of step 3. The watch (started before
// the ranks, so it waits for their files) prints WAITING for that collective — on tp-0, at the seq rank 0 is blocked
// in, naming rank 1 as the one that has not entered it — within 5 s of rank 0 entering it, then exits 3 on its
// watchdog, leaving the ranks running. The line is in the folder's stall journal while the watch runs, and
// `tpscope merge` of the folder keeps it as a critical alert of kind stall on rank 1.
TEST(Watch, NamesAHangLiveAndExitsThreeOnItsWatchdog) {
  const auto dir = testDir("watch-hang");
  const pid_t watch =
      startProcess(watchArgv(dir, {"--hang-timeout", "8", "--start-timeout", "60"}), freshLog(watchLog(dir)));
  const std::vector<pid_t> ranks = startTorchrunRanks(dir, 2, 30, {"--inject", "hang:rank=1,step=3"});
  // Note when each WAITING line appears ("WAITING  G seq S" → first seen), while the watch runs.
  std::map<std::string, int64_t> seenUnixNs;
  bool journalled = false;  // the journal held a WAITING line before the watch ended
  int status = -1;
  const auto deadline = Clock::now() + std::chrono::seconds(90);
  while (Clock::now() < deadline) {
    std::istringstream text(readFile(watchLog(dir)));
    for (std::string l; std::getline(text, l);)
      if (l.starts_with("WAITING")) seenUnixNs.emplace(l.substr(0, l.find(" (")), unixNowNs());
    journalled = journalled || contains(readFile(dir / "stalls.jsonl"), "WAITING  tp-0 seq ");
    int st = 0;
    if (::waitpid(watch, &st, WNOHANG) == watch) {
      status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (status < 0) {
    ::kill(watch, SIGKILL);
    waitStatus(watch);
  }
  const std::string out = readFile(watchLog(dir));
  // Where rank 0 blocked: its newest tp-0 collective, still open, and when it entered it (wall clock).
  Db db0(dir / "rank-0.db");
  const int64_t seq = db0.integer("SELECT max(seq) FROM collectives WHERE group_name = 'tp-0'");
  const int64_t state =
      db0.integer("SELECT count(*) FROM collectives WHERE group_name = 'tp-0' AND seq = " + std::to_string(seq) +
                  " AND state != 'completed'");
  const int64_t enteredUnixNs =
      db0.integer("SELECT value FROM meta WHERE key = 'epoch_unix_ns'") +
      db0.integer("SELECT enqueue_ns FROM collectives WHERE group_name = 'tp-0' AND seq = " + std::to_string(seq));
  killAll(ranks);
  ASSERT_EQ(status, 3) << out;
  EXPECT_EQ(state, 1) << "rank 0's last tp-0 collective completed: it was not blocked";
  const std::string line = "WAITING  tp-0 seq " + std::to_string(seq) + " (";
  const size_t at = out.find(line);
  ASSERT_NE(at, std::string::npos) << "no live line for tp-0 seq " << seq << ":\n" << out;
  const std::string waiting = out.substr(at, out.find('\n', at) - at);
  EXPECT_TRUE(contains(waiting, "rank 0 blocked")) << waiting;
  EXPECT_TRUE(contains(waiting, "rank 1 has not entered it")) << waiting;
  EXPECT_FALSE(contains(out, "rank 1 blocked")) << out;
  EXPECT_LT(at, out.find("hang: no progress on any rank for 8 s")) << out;
  const auto seen = seenUnixNs.find(line.substr(0, line.size() - 2));
  ASSERT_NE(seen, seenUnixNs.end()) << "the line was not seen while the watch ran";
  const double latencyS = static_cast<double>(seen->second - enteredUnixNs) * 1e-9;
  EXPECT_GT(latencyS, 1.0) << "a line before --stall-after (1.5 s) has passed";
  EXPECT_LT(latencyS, 5.0) << out;
  EXPECT_TRUE(journalled) << "the stall journal had no WAITING line while the watch ran";
  const RunResult merged = run({TPSCOPE_BIN, "merge", dir.string(), "-o", (dir / "run.db").string()},
                               dir.parent_path() / (dir.filename().string() + ".merge.log"));
  ASSERT_EQ(merged.status, 0) << merged.output;
  EXPECT_TRUE(contains(merged.output, "live stall line")) << merged.output;
  Db db(dir / "run.db");
  EXPECT_EQ(db.integer("SELECT count(*) FROM alerts WHERE kind = 'stall' AND severity = 'critical' AND rank = 1 AND "
                       "json_extract(evidence, '$.group') = 'tp-0' AND json_extract(evidence, '$.seq') = " +
                       std::to_string(seq)),
            1);
  // On the run's clock: after rank 0 entered the collective, before the end of the run's records.
  EXPECT_GE(db.integer("SELECT min(ts_ns) FROM alerts WHERE kind = 'stall'"),
            db.integer("SELECT min(enqueue_ns) FROM collectives WHERE rank = 0 AND group_name = 'tp-0' AND seq = " +
                       std::to_string(seq)));
}

// A healthy job: the watch follows it to its end and exits 0 without a stall line. Started again on the same folder
// after that job ended, it does not take the old files for a job that just finished: it waits for new ones.
TEST(Watch, AHealthyJobExitsZeroWithoutAStallLineAndAnEarlierJobsFilesAreNotThisOnes) {
  const auto dir = testDir("watch-healthy");
  const pid_t watch =
      startProcess(watchArgv(dir, {"--start-timeout", "60", "--hang-timeout", "60"}), freshLog(watchLog(dir)));
  const std::vector<pid_t> ranks = startTorchrunRanks(dir, 2, 6, {});
  for (pid_t p : ranks) EXPECT_EQ(waitStatus(p), 0);
  const int status = waitStatus(watch);
  const std::string out = readFile(watchLog(dir));
  EXPECT_EQ(status, 0) << out;
  EXPECT_TRUE(contains(out, "every rank finished (2 ranks)")) << out;
  for (const char* word : {"WAITING", "STUCK", "DESYNC", "RESUMED"}) EXPECT_FALSE(contains(out, word)) << out;

  const RunResult again = run(watchArgv(dir, {"--start-timeout", "1"}), dir.parent_path() / "watch-healthy.again.log");
  EXPECT_EQ(again.status, 1) << again.output;
  EXPECT_TRUE(contains(again.output, "no rank file of a running job appeared")) << again.output;
}

// A crash (rank 1 aborts at the start of step 3): exit 4, naming rank 1 and its signal.
TEST(Watch, ACrashExitsFourNamingTheRank) {
  const auto dir = testDir("watch-crash");
  const pid_t watch =
      startProcess(watchArgv(dir, {"--start-timeout", "60", "--hang-timeout", "30"}), freshLog(watchLog(dir)));
  const std::vector<pid_t> ranks = startTorchrunRanks(dir, 2, 30, {"--inject", "crash:rank=1,step=3"});
  const int status = waitStatus(watch);
  killAll(ranks);
  const std::string out = readFile(watchLog(dir));
  EXPECT_EQ(status, 4) << out;
  EXPECT_TRUE(contains(out, "crash: rank 1 ended")) << out;
  EXPECT_TRUE(contains(out, "SIGABRT")) << out;
}

// A desync the ranks die on (rank 1's all-reduce carries one element more; Gloo aborts both at once): never blocked
// for --stall-after, it is named from the ranks' dumps as they die — the DESYNC line with both sizes — and the watch
// exits 4 (the abort), as capture does.
TEST(Watch, ADesyncTheRanksDieOnIsNamedFromTheirDumps) {
  const auto dir = testDir("watch-desync");
  const pid_t watch =
      startProcess(watchArgv(dir, {"--start-timeout", "60", "--hang-timeout", "30"}), freshLog(watchLog(dir)));
  const std::vector<pid_t> ranks = startTorchrunRanks(dir, 2, 30, {"--inject", "mismatch:rank=1,step=3"});
  const int status = waitStatus(watch);
  killAll(ranks);
  const std::string out = readFile(watchLog(dir));
  EXPECT_EQ(status, 4) << out;
  Db db(dir / "rank-1.db");
  // The mismatched all-reduce: rank 1's collective still open when Gloo aborted it.
  const std::string seq =
      std::to_string(db.integer("SELECT min(seq) FROM collectives WHERE group_name = 'tp-0' AND state != 'completed'"));
  const size_t at = out.find("DESYNC   tp-0 seq " + seq + " (");
  ASSERT_NE(at, std::string::npos) << "no DESYNC line for tp-0 seq " << seq << ":\n" << out;
  const std::string line = out.substr(at, out.find('\n', at) - at);
  EXPECT_TRUE(contains(line, "size_mismatch")) << line;
  EXPECT_TRUE(contains(line, "rank 1 all_reduce float32 numel")) << line;
}

// `tpscope alerts --follow DIR`: the ranks' alerts (a NaN gradient on rank 1 at step 2) and the stall line (rank 1
// hangs at step 4) are printed while the job still runs; when the ranks are gone (killed here, as a scheduler
// would), it stops following with status 0 and says on stderr how the job ended.
TEST(Watch, AlertsFollowPrintsAlertsAndStallLinesWhileTheJobRuns) {
  const auto dir = testDir("watch-follow");
  const fs::path log = freshLog(dir.parent_path() / "watch-follow.alerts.log");
  const pid_t follow = startProcess({TPSCOPE_BIN, "alerts", dir.string(), "--follow", "--hang-timeout", "60"}, log);
  const std::vector<pid_t> ranks =
      startTorchrunRanks(dir, 2, 30, {"--inject", "nan:rank=1,step=2", "--inject", "hang:rank=1,step=4"});
  const auto deadline = Clock::now() + std::chrono::seconds(40);
  while (Clock::now() < deadline && !contains(readFile(log), "WAITING"))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string live = readFile(log);
  bool running = true;
  for (pid_t p : ranks) {
    int st = 0;
    running &= ::waitpid(p, &st, WNOHANG) == 0;
  }
  killAll(ranks);
  const int status = waitStatus(follow);
  const std::string out = readFile(log);
  EXPECT_TRUE(running) << "the ranks ended before the lines were checked";
  // Rank 1's alert; its TP peer may report the NaN the all-reduce carried to it first (the ranks race to their files).
  size_t alert = live.find("nonfinite_grad");
  while (alert != std::string::npos && !contains(live.substr(alert, live.find('\n', alert) - alert), "rank 1"))
    alert = live.find("nonfinite_grad", alert + 1);
  ASSERT_NE(alert, std::string::npos) << "no nonfinite_grad line of rank 1:\n" << live;
  EXPECT_TRUE(contains(live, "rank 1 has not entered it")) << live;
  EXPECT_LT(alert, live.find("WAITING")) << live;  // in the order they happened
  EXPECT_EQ(status, 0) << out;
  EXPECT_TRUE(contains(out, "exit status 4")) << out;  // the watch's end line: killed ranks left no end
}

TEST(Watch, BadFoldersGetAMessageAndANonZeroStatus) {
  const auto dir = testDir("watch-bad");
  RunResult r = run(watchArgv(dir / "missing", {}), dir / "missing.log");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "missing: no such folder")) << r.output;
  { std::ofstream(dir / "file") << "x"; }
  r = run(watchArgv(dir / "file", {}), dir / "file.log");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "not a folder")) << r.output;
  fs::create_directories(dir / "empty");
  r = run(watchArgv(dir / "empty", {"--start-timeout", "1"}), dir / "empty.log");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "within 1 s")) << r.output;
}

}  // namespace
}  // namespace tpscope::capture_test
