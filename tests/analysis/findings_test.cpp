// Findings: names, order, rank lists, the JSON contract's shape.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tpscope/analysis/finding.h"
#include "tpscope/report/json_output.h"
#include "tpscope/analysis/run_info.h"

namespace tpscope::analysis {
namespace {

using report::diagnosisToJson;
using report::kDiagnosisJsonVersion;

TEST(Findings, NamesRoundTrip) {
  for (size_t k = 0; k < kFindingKindCount; ++k) {
    const auto kind = static_cast<FindingKind>(k);
    EXPECT_EQ(parseFindingKind(findingKindName(kind)), kind);
  }
  EXPECT_EQ(findingKindName(FindingKind::NanOrigin), "nan_origin");
  EXPECT_EQ(findingKindName(FindingKind::ReplicaDivergence), "replica_divergence");
  EXPECT_EQ(findingKindName(FindingKind::SilentCorruption), "silent_corruption");
  EXPECT_EQ(parseSeverity("critical"), Severity::Critical);
  EXPECT_FALSE(parseSeverity("fatal"));
  EXPECT_FALSE(parseFindingKind("nan"));
}

TEST(Findings, SortMostSevereFirstThenDeterministic) {
  std::vector<Finding> v(4);
  v[0].severity = Severity::Info;
  v[1].severity = Severity::Critical;
  v[1].kind = FindingKind::Hang;
  v[2].severity = Severity::Critical;
  v[2].kind = FindingKind::NanOrigin;
  v[3].severity = Severity::Warning;
  sortFindings(v);
  EXPECT_EQ(v[0].kind, FindingKind::NanOrigin);
  EXPECT_EQ(v[1].kind, FindingKind::Hang);
  EXPECT_EQ(v[2].severity, Severity::Warning);
  EXPECT_EQ(v[3].severity, Severity::Info);
}

TEST(Findings, EvidenceRowsAreCapped) {
  Finding f;
  for (size_t i = 0; i < kMaxEvidenceRows + 3; ++i) f.cite("spans", {{"rank", int64_t{0}}});
  EXPECT_EQ(f.evidence.rows.size(), kMaxEvidenceRows);
  EXPECT_EQ(f.evidence.rowsOmitted, 3);
}

TEST(RunInfo, FormatRanksAndGroupClass) {
  EXPECT_EQ(formatRanks({}), "none");
  EXPECT_EQ(formatRanks({3}), "3");
  EXPECT_EQ(formatRanks({15, 8, 9, 10, 11, 12, 13, 14}), "8–15");
  EXPECT_EQ(formatRanks({1, 3, 5, 6, 7, 3}), "1, 3, 5–7");
  EXPECT_EQ(formatRanks({4, 5}), "4, 5");
  EXPECT_EQ(groupClass("tp-12"), "tp");
  EXPECT_EQ(groupClass("world"), "world");
  EXPECT_EQ(groupClass("tp-x"), "tp-x");
}

TEST(Json, DiagnosisContractFields) {
  DiagnoseResult r;
  Finding f;
  f.kind = FindingKind::Hang;
  f.severity = Severity::Critical;
  f.rank = 1;
  f.collective = CollectiveRef{"tp-0", 7, "all_reduce"};
  f.message = "m";
  f.cite("collectives", {{"rank", int64_t{0}}, {"group_name", std::string("tp-0")}, {"seq", int64_t{7}}});
  f.number("ratio", 0.1234567);
  r.findings.push_back(f);
  const auto j = nlohmann::json::parse(diagnosisToJson(r, "run.db"));
  EXPECT_EQ(j["version"], kDiagnosisJsonVersion);
  const auto& x = j["findings"][0];
  EXPECT_EQ(x["kind"], "hang");
  EXPECT_EQ(x["severity"], "critical");
  EXPECT_EQ(x["rank"], 1);
  EXPECT_EQ(x["step"], -1);
  EXPECT_EQ(x["layer"], -1);
  EXPECT_EQ(x["collective"]["group"], "tp-0");
  EXPECT_EQ(x["collective"]["seq"], 7);
  EXPECT_EQ(x["collective"]["op"], "all_reduce");
  EXPECT_EQ(x["evidence"]["rows"][0]["table"], "collectives");
  EXPECT_EQ(x["evidence"]["rows"][0]["key"]["group_name"], "tp-0");
  EXPECT_DOUBLE_EQ(x["evidence"]["numbers"]["ratio"].get<double>(), 0.123457);  // 6 significant digits
}

}  // namespace
}  // namespace tpscope::analysis
