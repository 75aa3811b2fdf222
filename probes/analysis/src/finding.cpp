#include "tpscope/analysis/finding.h"

#include <algorithm>
#include <array>
#include <tuple>

namespace tpscope::analysis {

namespace {
constexpr std::array<std::string_view, kFindingKindCount> kKindNames = {
    "nan_origin", "inf_origin", "grad_spike", "loss_spike", "replica_divergence",
    "desync",     "hang",       "straggler",  "crash",      "comm_overhead", "stage_imbalance",
    "pipeline_hang", "silent_corruption", "replay"};
}  // namespace

std::string_view findingKindName(FindingKind kind) { return kKindNames.at(static_cast<size_t>(kind)); }

std::optional<FindingKind> parseFindingKind(std::string_view name) {
  for (size_t i = 0; i < kKindNames.size(); ++i)
    if (kKindNames[i] == name) return static_cast<FindingKind>(i);
  return std::nullopt;
}

Finding& Finding::cite(std::string table, std::vector<EvidenceField> key) {
  if (evidence.rows.size() < kMaxEvidenceRows)
    evidence.rows.push_back(EvidenceRow{std::move(table), std::move(key)});
  else
    ++evidence.rowsOmitted;
  return *this;
}

Finding& Finding::number(std::string name, EvidenceValue value) {
  evidence.numbers.push_back(EvidenceField{std::move(name), std::move(value)});
  return *this;
}

bool findingLess(const Finding& a, const Finding& b) {
  const std::string& ga = a.collective ? a.collective->group : std::string();
  const std::string& gb = b.collective ? b.collective->group : std::string();
  const int64_t sa = a.collective ? a.collective->seq : -1;
  const int64_t sb = b.collective ? b.collective->seq : -1;
  return std::tie(a.severity, a.kind, a.step, a.rank, a.layer, ga, sa, a.message) <
         std::tie(b.severity, b.kind, b.step, b.rank, b.layer, gb, sb, b.message);
}

void sortFindings(std::vector<Finding>& findings) { std::stable_sort(findings.begin(), findings.end(), findingLess); }

}  // namespace tpscope::analysis
