// `tpscope whatif` on real captures (issue #33): a rank made slower by --inject slow is the straggler whatif removes,
// and the saving it predicts per step is close to the injected milliseconds; a healthy run has nothing to gain from
// removing a straggler. The replay with no change must reproduce the measured step time.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "capture_test_util.h"

namespace tpscope::capture_test {
namespace {

nlohmann::json whatif(const fs::path& dir) {
  const RunResult r = run({TPSCOPE_BIN, "whatif", (dir / "run.db").string(), "--json"},
                          dir.parent_path() / (dir.filename().string() + ".whatif.json"));
  EXPECT_EQ(r.status, 0) << r.output;
  return nlohmann::json::parse(r.output, nullptr, false);
}

const nlohmann::json* change(const nlohmann::json& report, const std::string& name) {
  for (const auto& ch : report["changes"])
    if (ch["change"] == name) return &ch;
  return nullptr;
}

// The no-change replay within `tolerance` of the measured step time.
void expectReplayMatches(const nlohmann::json& j, double tolerance = 0.1) {
  const double measured = j["measured_step_ms"].get<double>(), replayed = j["replayed_step_ms"].get<double>();
  EXPECT_GT(measured, 0);
  EXPECT_NEAR(replayed, measured, tolerance * measured) << "the model misses a dependency";
  EXPECT_EQ(j["model"]["forced_releases"], 0);
}

TEST(WhatIfCapture, InjectedStragglerIsRemovedWithItsMilliseconds) {
  constexpr int kInjectedMs = 40;
  const fs::path dir = testDir("whatif_slow");
  const RunResult r = capture(dir, 2, 2, 1, 12, {"--inject", "slow:rank=1,ms=" + std::to_string(kInjectedMs)});
  ASSERT_EQ(r.status, 0) << r.output;
  const auto j = whatif(dir);
  ASSERT_FALSE(j.is_discarded());
  expectReplayMatches(j);
  const nlohmann::json* s = change(j, "straggler");
  ASSERT_NE(s, nullptr) << j.dump(1);
  EXPECT_EQ((*s)["rank"], 1);
  EXPECT_EQ((*s)["ranks"], nlohmann::json::array({1}));
  // Everything rank 1 does beyond rank 0 is the injected busy loop, and rank 0 waits for all of it.
  EXPECT_NEAR((*s)["saving_ms"].get<double>(), kInjectedMs, 0.25 * kInjectedMs) << j.dump(1);
  EXPECT_NEAR((*s)["predicted_step_ms"].get<double>(),
              j["measured_step_ms"].get<double>() - (*s)["saving_ms"].get<double>(), 0.01);
  ASSERT_FALSE(j["critical_path"].empty());
}

TEST(WhatIfCapture, HealthyRunGainsLittleFromAStraggler) {
  const fs::path dir = testDir("whatif_healthy");
  const RunResult r = capture(dir, 2, 2, 1, 30, {});  // 16 ms steps: enough of them for a steady median
  ASSERT_EQ(r.status, 0) << r.output;
  const auto j = whatif(dir);
  ASSERT_FALSE(j.is_discarded());
  // Steps of 10-17 ms replay 1.2-1.7 ms short (8-12 %, measured 2026-12-05 in 11 runs): time the model does not yet
  // place on any lane (docs/diagnosis.md, "What if", limits); 15 % holds it, 10 % flaked one run in three.
  expectReplayMatches(j, 0.15);
  const nlohmann::json* s = change(j, "straggler");
  // Two ranks on two cores still take turns with the launcher and the recorders: a few ms at most, never the 40 above.
  if (s != nullptr) {
    EXPECT_LT((*s)["saving_ms"].get<double>(), 10.0) << j.dump(1);
  }
}

}  // namespace
}  // namespace tpscope::capture_test
