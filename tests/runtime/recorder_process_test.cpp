// The recorder across process deaths: SIGKILL keeps every committed flush, SIGTERM/SIGINT dump then die by the
// signal, SIGUSR1 dumps and continues, a normal exit dumps, and the environment starts a recorder.
#include <gtest/gtest.h>
#include <signal.h>
#include <string.h>

#include <thread>

#include "test_util.h"
#include "tpscope/probes/tcp_store.h"
#include "tpscope/tracedb/reader.h"

namespace db = tpscope::tracedb;
using tpscope::testing::Child;
using tpscope::testing::TempDir;

#ifndef TPSCOPE_RECORDER_CHILD
#error "TPSCOPE_RECORDER_CHILD must name the helper executable"
#endif

namespace {

const std::string kChild = TPSCOPE_RECORDER_CHILD;

int64_t spanCount(const std::filesystem::path& file) {
  auto r = db::Reader::open(file);
  if (!r) return -1;
  auto n = (*r)->spanCount();
  return n ? *n : -1;
}

TEST(RecorderProcess, SigkillLeavesEveryFlushedSpanReadable) {
  TempDir dir;
  Child child(kChild, {"kill", dir.path().string()});
  ASSERT_GT(child.pid(), 0);
  int64_t flushed = 0;
  while (flushed < 30'000) {
    auto line = child.readLine();
    ASSERT_TRUE(line) << "the child stopped reporting";
    ASSERT_EQ(line->rfind("flushed ", 0), 0u) << *line;
    flushed = std::stoll(line->substr(8));
  }
  ASSERT_EQ(kill(child.pid(), SIGKILL), 0);
  auto status = child.wait();
  ASSERT_TRUE(status);
  ASSERT_TRUE(WIFSIGNALED(*status));
  EXPECT_EQ(WTERMSIG(*status), SIGKILL);

  const auto file = dir.path() / "rank-0.db";
  auto reader = db::Reader::open(file);
  ASSERT_TRUE(reader.isOk()) << reader.error();
  auto n = (*reader)->spanCount();
  ASSERT_TRUE(n.isOk()) << n.error();
  // Everything reported as flushed is there; the recorder may have committed a little more before the kill.
  EXPECT_GE(*n, flushed);
  auto ranks = (*reader)->ranks();
  ASSERT_TRUE(ranks.isOk());
  ASSERT_EQ(ranks->size(), 1u);
  EXPECT_FALSE(ranks->front().endNs.has_value());  // it never got to say goodbye
  auto stats = (*reader)->recorderStats();
  ASSERT_TRUE(stats.isOk());
  ASSERT_FALSE(stats->empty());
  EXPECT_GE(stats->back().spansWritten, flushed);
}

class RecorderSignal : public ::testing::TestWithParam<int> {};

TEST_P(RecorderSignal, DumpsThenDiesByTheSignal) {
  const int sig = GetParam();
  TempDir dir;
  Child child(kChild, {"signal", dir.path().string(), "5000"});
  auto line = child.readLine();
  ASSERT_TRUE(line);
  ASSERT_EQ(*line, "ready");
  ASSERT_EQ(kill(child.pid(), sig), 0);
  auto status = child.wait();
  ASSERT_TRUE(status) << "the child did not die";
  ASSERT_TRUE(WIFSIGNALED(*status)) << "status " << *status;
  EXPECT_EQ(WTERMSIG(*status), sig);  // the default action was re-raised after the dump
  auto reader = db::Reader::open(dir.path() / "rank-0.db");
  ASSERT_TRUE(reader.isOk()) << reader.error();
  EXPECT_EQ(*(*reader)->spanCount(), 5000);  // the flush interval is 60 s: only the signal's dump wrote them
  auto ranks = (*reader)->ranks();
  ASSERT_TRUE(ranks.isOk());
  ASSERT_EQ(ranks->size(), 1u);
  EXPECT_EQ(ranks->front().exitReason, std::string("signal SIG") + sigabbrev_np(sig));
  EXPECT_TRUE(ranks->front().endNs.has_value());
}

// SIGTERM/SIGINT (a launcher stops the rank) and the crash signals (std::terminate on an uncaught exception, a
// segfault): the rank dumps what it recorded since its last periodic flush, then dies by the signal.
INSTANTIATE_TEST_SUITE_P(TermIntAndCrashes, RecorderSignal,
                         ::testing::Values(SIGTERM, SIGINT, SIGABRT, SIGSEGV, SIGBUS),
                         [](const auto& info) { return std::string("SIG") + sigabbrev_np(info.param); });

TEST(RecorderProcess, SigusrOneDumpsAndContinues) {
  TempDir dir;
  Child child(kChild, {"signal", dir.path().string(), "3000"});
  auto line = child.readLine();
  ASSERT_TRUE(line);
  ASSERT_EQ(*line, "ready");
  ASSERT_EQ(kill(child.pid(), SIGUSR1), 0);
  const auto file = dir.path() / "rank-0.db";
  int64_t n = -1;
  for (int i = 0; i < 200 && n != 3000; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    n = spanCount(file);
  }
  EXPECT_EQ(n, 3000);  // dumped within 5 s, although the flush interval is 60 s
  EXPECT_FALSE(child.wait(std::chrono::milliseconds(300)).has_value()) << "SIGUSR1 must not end the process";
  ASSERT_EQ(kill(child.pid(), SIGKILL), 0);
  auto status = child.wait();
  ASSERT_TRUE(status);
  EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL);
}

TEST(RecorderProcess, NormalExitDumps) {
  TempDir dir;
  Child child(kChild, {"exit", dir.path().string(), "4000"});
  auto status = child.wait();
  ASSERT_TRUE(status);
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0);
  auto reader = db::Reader::open(dir.path() / "rank-0.db");
  ASSERT_TRUE(reader.isOk()) << reader.error();
  EXPECT_EQ(*(*reader)->spanCount(), 4000);
  auto ranks = (*reader)->ranks();
  ASSERT_TRUE(ranks.isOk());
  EXPECT_EQ(ranks->front().exitReason, "ok");
  // Closed cleanly: the WAL was checkpointed into the main file.
  const auto wal = dir.path() / "rank-0.db-wal";
  EXPECT_EQ(std::filesystem::exists(wal) ? std::filesystem::file_size(wal) : 0u, 0u);
}

TEST(RecorderProcess, StartsFromTheEnvironment) {
  TempDir dir;
  const auto out = dir.path() / "capture";  // created by the recorder
  Child child(kChild, {"env", "2500"},
              {{"TPSCOPE_OUT", out.string()},
               {"TPSCOPE_RUN_ID", "env-run-7"},
               {"RANK", "3"},
               {"WORLD_SIZE", "4"},
               {"LOCAL_RANK", "1"},
               {"TPSCOPE_EPOCH_NS", "1700000000123456789"}});
  auto status = child.wait();
  ASSERT_TRUE(status);
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0);
  auto reader = db::Reader::open(out / "rank-3.db");
  ASSERT_TRUE(reader.isOk()) << reader.error();
  EXPECT_EQ(*(*reader)->spanCount(), 2500);
  EXPECT_EQ((*reader)->metaValue("run_id"), "env-run-7");
  EXPECT_EQ((*reader)->metaValue("epoch_unix_ns"), "1700000000123456789");
  auto ranks = (*reader)->ranks();
  ASSERT_TRUE(ranks.isOk());
  ASSERT_EQ(ranks->size(), 1u);
  EXPECT_EQ(ranks->front().rank, 3);
  EXPECT_EQ(ranks->front().worldSize, 4);
  EXPECT_EQ(ranks->front().localRank, 1);
}

TEST(RecorderProcess, AutostartRecordsAProgramThatOnlyUsesTheProbes) {
  TempDir dir;
  Child child(TPSCOPE_AUTOSTART_CHILD, {"1500"}, {{"TPSCOPE_OUT", dir.path().string()}, {"RANK", "1"}});
  auto status = child.wait();
  ASSERT_TRUE(status);
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0);
  auto reader = db::Reader::open(dir.path() / "rank-1.db");
  ASSERT_TRUE(reader.isOk()) << reader.error();
  EXPECT_EQ(*(*reader)->spanCount(), 1500);
  auto ranks = (*reader)->ranks();
  ASSERT_TRUE(ranks.isOk());
  EXPECT_EQ(ranks->front().exitReason, "ok");  // stopped at exit
}

TEST(RecorderProcess, WithoutTpscopeOutNothingIsRecorded) {
  TempDir dir;
  Child child(kChild, {"env", "10"}, {{"TPSCOPE_OUT", ""}});
  auto status = child.wait();
  ASSERT_TRUE(status);
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 2);  // the helper says "did not start"
}

TEST(RecorderProcess, TwoRanksAlignTheirClocksThroughTheTcpStore) {
  std::string error;
  auto server = tpscope::probes::TcpKvServer::listen("127.0.0.1", 0, &error);
  ASSERT_TRUE(server) << error;
  TempDir dir;
  const std::string store = "127.0.0.1:" + std::to_string(server->port());
  std::vector<std::unique_ptr<Child>> children;
  for (int r = 0; r < 2; ++r) {
    children.push_back(std::make_unique<Child>(
        kChild, std::vector<std::string>{"env", "100"},
        std::map<std::string, std::string>{{"TPSCOPE_OUT", dir.path().string()},
                                           {"TPSCOPE_RUN_ID", "clock-run"},
                                           {"RANK", std::to_string(r)},
                                           {"WORLD_SIZE", "2"},
                                           {"TPSCOPE_CLOCK_STORE", store}}));
  }
  for (auto& c : children) {
    auto status = c->wait(std::chrono::seconds(60));
    ASSERT_TRUE(status);
    ASSERT_TRUE(WIFEXITED(*status));
    EXPECT_EQ(WEXITSTATUS(*status), 0);
  }
  auto reader = db::Reader::open(dir.path() / "rank-1.db");
  ASSERT_TRUE(reader.isOk()) << reader.error();
  auto ranks = (*reader)->ranks();
  ASSERT_TRUE(ranks.isOk());
  ASSERT_EQ(ranks->size(), 1u);
  // Same machine, same clock: the offset is within its uncertainty of zero, and the uncertainty is real.
  EXPECT_GT(ranks->front().clockUncertaintyNs, 0);
  EXPECT_LT(ranks->front().clockUncertaintyNs, 50'000'000);
  EXPECT_LE(std::abs(ranks->front().clockOffsetNs), ranks->front().clockUncertaintyNs + 100'000);
  auto counters = (*reader)->counters();
  ASSERT_TRUE(counters.isOk());
  int offsets = 0;
  for (const auto& c : *counters) offsets += c.name == "tpscope.clock_offset_ns";
  EXPECT_EQ(offsets, 2);  // at start and at end
}

}  // namespace
