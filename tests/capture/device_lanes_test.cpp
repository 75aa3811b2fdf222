// The GPU path end to end without a GPU (issue #13): a real TP=2 capture of tpscope-train with
// TPSCOPE_GPU_ACTIVITY=simulated, whose device records go through the same correlator, lanes, merge, breakdown and
// diagnosis as CUPTI's. Checked with SQL on the merged file: every rank has its stream lanes; every kernel points at
// a host span of its own rank that launched it (merge keeps the correlation across renumbering); every NCCL kernel
// sits inside a collective of its rank, one per collective; and the report's device-lane compute time equals the
// union of the kernels in the step windows, computed here independently. A healthy run stays healthy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "capture_test_util.h"

namespace tpscope::capture_test {
namespace {

constexpr int kSteps = 8;

int simulatedDevice() { return ::setenv("TPSCOPE_GPU_ACTIVITY", "simulated", 1) == 0 ? 0 : 99; }

// Total length of the union of [begin, end) intervals clipped to [lo, hi).
int64_t unionWithin(std::vector<std::pair<int64_t, int64_t>> iv, int64_t lo, int64_t hi) {
  std::sort(iv.begin(), iv.end());
  int64_t total = 0, curB = 0, curE = -1;
  for (auto [b, e] : iv) {
    b = std::max(b, lo);
    e = std::min(e, hi);
    if (e <= b) continue;
    if (b > curE) {
      if (curE > curB) total += curE - curB;
      curB = b;
      curE = e;
    } else {
      curE = std::max(curE, e);
    }
  }
  if (curE > curB) total += curE - curB;
  return total;
}

TEST(SimulatedDevice, CaptureRecordsCorrelatedDeviceLanesThatFeedTheBreakdown) {
  const auto dir = testDir("simulated_device");
  const RunResult r = capture(dir, 2, 2, 1, kSteps, {}, simulatedDevice);
  ASSERT_EQ(r.status, 0) << r.output;
  Db db(dir / "run.db");

  for (int rank = 0; rank < 2; ++rank) {
    const std::string rk = std::to_string(rank);
    EXPECT_EQ(db.integer("SELECT count(*) FROM threads WHERE kind = 'cuda-stream' AND rank = " + rk), 2)
        << "rank " << rank << ": a compute and an NCCL stream lane";
    // Kernels (6) and NCCL kernels (9), each against the host span that launched it.
    const std::string device = " FROM spans k LEFT JOIN spans h ON h.id = k.correlation LEFT JOIN threads t "
                               "ON t.rank = h.rank AND t.thread = h.thread WHERE k.kind IN (6, 9) AND k.rank = " + rk;
    EXPECT_GT(db.integer("SELECT count(*)" + device + " AND k.kind = 6"), 5 * kSteps) << "rank " << rank;
    EXPECT_EQ(db.integer("SELECT count(*)" + device + " AND (h.id IS NULL OR h.rank != k.rank OR t.kind != 'cpu')"),
              0)
        << "rank " << rank << ": a device record without its launching host span on a CPU thread of its rank";
    EXPECT_EQ(db.integer("SELECT count(*)" + device + " AND k.begin_ns < h.begin_ns"), 0)
        << "a kernel that ran before the span that launched it";
    EXPECT_EQ(db.integer("SELECT count(*)" + device + " AND k.kind = 9 AND h.kind != 1"), 0)
        << "an NCCL kernel launched outside a comm span";
    EXPECT_EQ(db.integer("SELECT count(*)" + device + " AND k.kind = 6 AND h.kind NOT IN (0, 3)"), 0)
        << "a compute kernel launched outside compute/optimizer spans";
    // NCCL kernels ↔ collectives: one per completed collective, each inside the time of one of its rank's records.
    EXPECT_EQ(db.integer("SELECT count(*) FROM spans WHERE kind = 9 AND rank = " + rk),
              db.integer("SELECT count(*) FROM collectives WHERE state = 'completed' AND rank = " + rk));
    EXPECT_EQ(db.integer("SELECT count(*)" + device +
                         " AND k.kind = 9 AND NOT EXISTS (SELECT 1 FROM collectives c WHERE c.rank = k.rank AND "
                         "c.start_ns <= h.begin_ns + h.dur_ns AND c.end_ns >= h.begin_ns)"),
              0)
        << "an NCCL kernel whose comm span overlaps no collective of its rank";
  }

  // The breakdown reads the device lanes; its compute time is the kernels' union inside the step windows.
  const RunResult rep = run({TPSCOPE_BIN, "report", "--json", (dir / "run.db").string()}, dir / "report.json");
  ASSERT_EQ(rep.status, 0) << rep.output;
  const auto report = nlohmann::json::parse(rep.output);
  for (const auto& rk : report["ranks"]) {
    const int rank = rk["rank"].get<int>();
    EXPECT_EQ(rk["lanes"], "device") << rk.dump();
    int64_t expected = 0;
    std::vector<std::pair<int64_t, int64_t>> kernels;
    for (const auto& row : db.rows("SELECT begin_ns, begin_ns + dur_ns FROM spans WHERE kind = 6 AND rank = " +
                                   std::to_string(rank)))
      kernels.emplace_back(std::stoll(row[0]), std::stoll(row[1]));
    for (const auto& w : db.rows("SELECT begin_ns, begin_ns + dur_ns FROM spans WHERE kind = 4 AND rank = " +
                                 std::to_string(rank)))
      expected += unionWithin(kernels, std::stoll(w[0]), std::stoll(w[1]));
    ASSERT_GT(expected, 0);
    EXPECT_NEAR(static_cast<double>(rk["compute_ns"].get<int64_t>()), static_cast<double>(expected),
                0.005 * static_cast<double>(expected))
        << "rank " << rank;
  }

  const Diagnosis d = diagnose(dir / "run.db");
  ASSERT_EQ(d.status, 0) << d.json;
  for (const auto& f : d.findings) EXPECT_EQ(f.severity, "info") << "a healthy run got:\n" << d.summary();
}

}  // namespace
}  // namespace tpscope::capture_test
