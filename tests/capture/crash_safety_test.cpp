// Crash safety and the output folder: real `tpscope capture` runs (tiny config, loopback Gloo) in which one rank,
// chosen at random, is killed from outside at a random moment — SIGKILL (no chance to dump), SIGTERM (the recorder
// dumps, then dies), SIGABRT (not handled: what was not yet flushed is lost). Every rank file and run.db must pass
// `PRAGMA integrity_check`, every rank must be merged, whatever the dead rank had committed before the kill must be in
// run.db, and `tpscope diagnose` must name the dead rank, and only it, as crashed.
//
// Each test runs two kills: one after a random delay, one at the moment a flush starts writing the rank's WAL (the
// file's size or mtime changes; the kill lands while SQLite is still writing the transaction's pages). The seed is
// printed; TPSCOPE_TEST_SEED=<seed> repeats a run's choices (the kill points depend on timing too).
//
// The output folder: a read-only one, a path under a regular file, and a disk that fills up mid-run (simulated with
// RLIMIT_FSIZE on capture and its ranks, SIGXFSZ ignored so that writes fail with EFBIG) must each end with a clear
// message and a non-zero exit, and leave no file that fails integrity_check or was written half.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "capture_test_util.h"

namespace tpscope::capture_test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct KillCase {
  const char* name;
  int signal;
  int nproc, tp, dp;
};
void PrintTo(const KillCase& c, std::ostream* os) {
  *os << c.name;
}

uint64_t testSeed() {
  if (const char* s = std::getenv("TPSCOPE_TEST_SEED"); s != nullptr && *s != '\0') return std::stoull(s);
  return std::random_device{}();
}

// True once every rank's file has its ranks row (the recorder's first transaction).
bool everyRankRecording(const fs::path& dir, int nproc) {
  for (int r = 0; r < nproc; ++r) {
    const fs::path f = dir / ("rank-" + std::to_string(r) + ".db");
    if (!fs::exists(f)) return false;
    Db db(f);
    if (db.integer("SELECT count(*) FROM ranks", /*quiet=*/true) != 1) return false;
  }
  return true;
}

struct WalState {
  off_t size = -1;
  timespec mtime{};
  bool operator==(const WalState& o) const {
    return size == o.size && mtime.tv_sec == o.mtime.tv_sec && mtime.tv_nsec == o.mtime.tv_nsec;
  }
};

WalState walState(const fs::path& wal) {
  struct stat st {};
  if (::stat(wal.c_str(), &st) != 0) return {};
  return WalState{st.st_size, st.st_mtim};
}

// Waits (at most `limit`) until the WAL of `dbFile` changes — a flush has begun writing — and returns whether it did.
bool waitForFlushStart(const fs::path& dbFile, std::chrono::milliseconds limit) {
  const fs::path wal = dbFile.string() + "-wal";
  const WalState before = walState(wal);
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    if (!(walState(wal) == before)) return true;
    std::this_thread::sleep_for(100us);
  }
  return false;
}

class CrashSafety : public ::testing::TestWithParam<KillCase> {};

TEST_P(CrashSafety, EveryFileSurvivesAndTheDeadRankIsNamed) {
  const KillCase c = GetParam();
  const uint64_t seed = testSeed();
  std::printf("seed %llu (TPSCOPE_TEST_SEED=%llu repeats it)\n", static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seed));
  RecordProperty("seed", std::to_string(seed));
  std::mt19937_64 rng(seed);

  for (const bool atFlush : {false, true}) {
    const int victim = std::uniform_int_distribution<int>(0, c.nproc - 1)(rng);
    const int delayMs = std::uniform_int_distribution<int>(0, 2500)(rng);
    SCOPED_TRACE(::testing::Message() << "seed " << seed << ", " << strsignal(c.signal) << " to rank " << victim
                                      << (atFlush ? " at the start of a flush after " : " after ") << delayMs
                                      << " ms of recording");
    const auto dir = testDir(std::string("crash_") + c.name + (atFlush ? "_flush" : "_random"));
    // Far more steps than the test lasts: the run ends because of the kill.
    const pid_t capturePid = startCapture(dir, c.nproc, c.tp, c.dp, 100000, {"--hang-timeout", "30", "--grace", "3"});
    bool recording = false;
    for (int i = 0; i < 600 && !recording; ++i) {
      std::this_thread::sleep_for(50ms);
      recording = everyRankRecording(dir, c.nproc);
    }
    const pid_t pid = rankPid(capturePid, victim);
    if (!recording || pid <= 0) {
      ::kill(capturePid, SIGKILL);
      waitStatus(capturePid);
      FAIL() << "the ranks did not start recording within 30 s:\n" << readFile(captureLog(dir));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delayMs));
    const fs::path victimFile = dir / ("rank-" + std::to_string(victim) + ".db");
    // What the victim has committed so far must survive, whatever the signal.
    int64_t stepsBefore = 0;
    {
      Db live(victimFile);
      stepsBefore = live.integer("SELECT count(*) FROM step_stats");
    }
    const bool sawFlush = atFlush && waitForFlushStart(victimFile, 3000ms);
    ::kill(pid, c.signal);
    const int status = waitStatus(capturePid);
    const std::string out = readFile(captureLog(dir));
    if (atFlush) std::printf("  %s\n", sawFlush ? "killed as a flush began" : "no flush seen within 3 s");

    EXPECT_EQ(status, 4) << out;  // a crash: the first abnormal end was the victim's
    EXPECT_NE(out.find("rank " + std::to_string(victim) + " (pid"), std::string::npos) << out;
    for (int r = 0; r < c.nproc; ++r) {
      const fs::path f = dir / ("rank-" + std::to_string(r) + ".db");
      EXPECT_EQ(integrityCheck(f), "ok") << f;
    }
    ASSERT_TRUE(fs::exists(dir / "run.db")) << out;
    EXPECT_EQ(integrityCheck(dir / "run.db"), "ok");
    Db db(dir / "run.db");
    EXPECT_EQ(db.integer("SELECT count(*) FROM ranks"), c.nproc);
    const std::string victimSql = " WHERE rank = " + std::to_string(victim);
    EXPECT_EQ(db.value("SELECT exit_reason FROM ranks" + victimSql),
              std::string("crash: killed by signal SIG") + sigabbrev_np(c.signal));
    EXPECT_GE(db.integer("SELECT count(*) FROM step_stats" + victimSql), stepsBefore);

    const Diagnosis d = diagnose(dir / "run.db");
    EXPECT_EQ(d.status, 0) << d.json;
    const auto crashes = d.ofKind("crash", "critical");
    ASSERT_EQ(crashes.size(), 1u) << "exactly the dead rank is a crash:\n" << d.json;
    EXPECT_EQ(crashes[0].rank, victim) << d.json;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kill, CrashSafety,
    ::testing::Values(KillCase{"sigkill_tp2", SIGKILL, 2, 2, 1}, KillCase{"sigkill_tp2_dp2", SIGKILL, 4, 2, 2},
                      KillCase{"sigterm_tp2", SIGTERM, 2, 2, 1}, KillCase{"sigterm_tp2_dp2", SIGTERM, 4, 2, 2},
                      KillCase{"sigabrt_tp2", SIGABRT, 2, 2, 1}, KillCase{"sigabrt_tp2_dp2", SIGABRT, 4, 2, 2}),
    [](const ::testing::TestParamInfo<KillCase>& i) { return std::string(i.param.name); });

// ---- the output folder ------------------------------------------------------------------------------------------

std::vector<std::string> filesIn(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

constexpr int kCannotMount = 77;  // the child's status when it may not make a read-only mount

// Makes `dir` read-only for the capture about to start. Root passes permission bits, so for root the forked child
// bind-mounts `dir` read-only in a mount namespace of its own (gone with the process tree); others get chmod 0555.
BeforeExec makeReadOnly(const fs::path& dir) {
  if (::geteuid() != 0) {
    fs::permissions(dir, fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write,
                    fs::perm_options::remove);
    return {};
  }
  return [dir] {
    if (::unshare(CLONE_NEWNS) != 0) return kCannotMount;
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return kCannotMount;
    if (::mount(dir.c_str(), dir.c_str(), nullptr, MS_BIND, nullptr) != 0) return kCannotMount;
    if (::mount(nullptr, dir.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) != 0) return kCannotMount;
    return 0;
  };
}

TEST(OutputFolder, ReadOnlyFolderIsRefusedAndLeftAsItWas) {
  const auto dir = testDir("readonly");
  const fs::path out = dir / "out";
  fs::create_directories(out / "logs");
  { std::ofstream(out / "run.db") << "a previous capture"; }  // capture would replace it: it must stay
  const BeforeExec readOnly = makeReadOnly(out);
  const RunResult r = capture(out, 2, 2, 1, 2, {"--hang-timeout", "30"}, readOnly);
  fs::permissions(out, fs::perms::owner_write, fs::perm_options::add);
  if (r.status == kCannotMount) GTEST_SKIP() << "running as root without the right to make a read-only bind mount";
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("tpscope capture: error: --out " + out.string() + ": cannot write in this folder: "),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("capture: 2 ranks"), std::string::npos) << "no rank may start:\n" << r.output;
  EXPECT_EQ(filesIn(out), (std::vector<std::string>{"logs", "run.db"}));
  EXPECT_EQ(readFile(out / "run.db"), "a previous capture");
}

TEST(OutputFolder, PathThroughARegularFileIsRefused) {
  const auto dir = testDir("notafolder");
  { std::ofstream(dir / "file") << "x"; }
  int n = 0;
  for (const fs::path& out : {dir / "file" / "out", dir / "file"}) {
    const RunResult r =
        run(captureArgv(out, 2, 2, 1, 2, {"--hang-timeout", "30"}), dir / ("capture-" + std::to_string(++n) + ".log"));
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("--out " + out.string() + ": cannot create the folder: Not a directory"), std::string::npos)
        << r.output;
  }
  EXPECT_EQ(filesIn(dir), (std::vector<std::string>{"capture-1.log", "capture-2.log", "file"}));
  EXPECT_EQ(readFile(dir / "file"), "x");
}

// The disk fills up while the ranks record: RLIMIT_FSIZE (inherited by the ranks) is hit after the first flushes.
TEST(OutputFolder, FileSizeLimitMidRunEndsWithAClearErrorAndIntactFiles) {
  // Sized for the tiny config: the first flushes (meta, model build, the first steps) fit, 200 steps do not.
  constexpr rlim_t kLimitBytes = 300 * 1024;
  const auto dir = testDir("fsize");
  const fs::path out = dir / "out";
  const pid_t capturePid = startCapture(out, 2, 2, 1, 200, {"--hang-timeout", "30", "--grace", "3"}, [] {
    ::signal(SIGXFSZ, SIG_IGN);  // stays ignored across exec: a write past the limit fails with EFBIG
    const rlimit limit{kLimitBytes, kLimitBytes};
    return ::setrlimit(RLIMIT_FSIZE, &limit) == 0 ? 0 : 1;
  });
  // While it runs: the most steps rank 0's file has shown committed. They must all still be there at the end.
  int64_t committed = 0;
  int status = -1;
  for (int i = 0; i < 1200 && status < 0; ++i) {
    int st = 0;
    if (::waitpid(capturePid, &st, WNOHANG) == capturePid) {
      status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    if (fs::exists(out / "rank-0.db")) {
      Db live(out / "rank-0.db");
      committed = std::max(committed, live.integer("SELECT count(*) FROM step_stats", /*quiet=*/true));
    }
    std::this_thread::sleep_for(50ms);
  }
  if (status < 0) {
    ::kill(capturePid, SIGKILL);
    waitStatus(capturePid);
    FAIL() << "capture did not end within 60 s:\n" << readFile(captureLog(out));
  }
  const std::string output = readFile(captureLog(out));
  EXPECT_EQ(status, 1) << output;
  EXPECT_NE(output.find("trace is incomplete: flush to "), std::string::npos) << output;

  // No half-written file: every trace file there is intact, no merge temporary is left.
  std::vector<fs::path> rankFiles;
  for (const std::string& name : filesIn(out)) {
    EXPECT_EQ(name.find(".tmp-"), std::string::npos) << name;
    if (name.ends_with(".db")) {
      EXPECT_EQ(integrityCheck(out / name), "ok") << name;
    }
    if (name.starts_with("rank-") && name.ends_with(".db")) rankFiles.push_back(out / name);
  }
  ASSERT_EQ(rankFiles.size(), 2u) << "the limit was hit before the ranks could start recording (raise it?)\n" << output;
  int64_t kept = 0;
  {
    Db db(out / "rank-0.db");
    kept = db.integer("SELECT count(*) FROM step_stats");
  }
  EXPECT_GE(kept, committed);
  EXPECT_GT(kept, 0) << "no step fit under the limit (raise it?)";
  // What was written stays usable: the rank files merge (without the limit) and diagnose.
  const fs::path merged = dir / "merged.db";
  const RunResult m = run({TPSCOPE_BIN, "merge", out.string(), "-o", merged.string()}, dir / "merge.log");
  ASSERT_EQ(m.status, 0) << m.output;
  EXPECT_EQ(integrityCheck(merged), "ok");
  EXPECT_EQ(diagnose(merged).status, 0);
}

}  // namespace
}  // namespace tpscope::capture_test
