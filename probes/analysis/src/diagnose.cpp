#include "tpscope/analysis/diagnose.h"

#include <algorithm>
#include <map>

#include "tpscope/analysis/breakdown.h"
#include "tpscope/analysis/collectives.h"
#include "tpscope/analysis/crash.h"
#include "tpscope/analysis/desync.h"
#include "tpscope/analysis/nonfinite.h"
#include "tpscope/analysis/run_info.h"
#include "analysis_internal.h"
#include "evidence_util.h"

namespace tpscope::analysis {

namespace {

using detail::f;

std::string ms(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g ms", static_cast<double>(ns) / 1e6);
  return buf;
}
std::string pct(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", v);
  return buf;
}

std::vector<Finding> stragglerFindings(const CollectiveAnalysis& ca, const DiagnoseOptions& o) {
  std::vector<Finding> out;
  const StragglerReport& sr = ca.stragglers;
  int64_t commTotal = 0;
  for (const auto& s : ca.stats) commTotal += s.totalNs * s.groupSize;
  // Waiting propagates: a rank held up by the straggler arrives late at its next collective with others. Only the
  // top rank and those that caused at least 75 % as much waiting are named.
  const int64_t top = sr.ranks.empty() ? 0 : sr.ranks.front().causedWaitNs;
  int64_t allCaused = 0;
  for (const RankStraggling& r : sr.ranks) allCaused += r.causedWaitNs;
  for (const RankStraggling& r : sr.ranks) {
    if (r.causedWaitNs * 4 < top * 3) continue;
    // A rank slow once per step is last at its slow collective and at chance elsewhere (a quarter of the time among
    // four ranks): below half of them, but the waiting is mostly on it.
    const bool mostlyLast = r.lastPct() >= o.stragglerLastPct;
    const bool causedMost =
        100.0 * static_cast<double>(r.causedWaitNs) >= o.stragglerDominantWaitPct * static_cast<double>(allCaused);
    if (r.collectives < o.stragglerMinCollectives || !(mostlyLast || causedMost)) continue;
    const double waitPct = commTotal > 0 ? 100.0 * static_cast<double>(r.causedWaitNs) / commTotal : 0.0;
    if (waitPct < o.stragglerMinWaitPct) continue;
    Finding fd;
    fd.kind = FindingKind::Straggler;
    fd.severity = Severity::Warning;
    fd.rank = r.rank;
    fd.message = "rank " + std::to_string(r.rank) + " arrives last at " + pct(r.lastPct()) + " of its collectives (" +
                 std::to_string(r.lastCount) + " of " + std::to_string(r.collectives) + "); the others wait " +
                 ms(r.causedWaitNs) + " in total on it";
    if (sr.steps > 0) fd.message += " (" + ms(r.causedWaitNs / sr.steps) + " per step)";
    std::vector<int> waiters;
    for (const CollectiveArrival& a : ca.worst) {
      if (a.lastRank != r.rank) continue;
      fd.cite("collectives", {f("rank", int64_t{r.rank}), f("group_name", a.group), f("seq", a.seq)});
      if (!fd.collective) fd.collective = CollectiveRef{a.group, a.seq, a.op};
    }
    for (const RankStraggling& other : sr.ranks)
      if (other.rank != r.rank) waiters.push_back(other.rank);
    std::sort(waiters.begin(), waiters.end());
    fd.ranks = waiters;
    fd.number("last_count", r.lastCount)
        .number("collectives", r.collectives)
        .number("last_pct", r.lastPct())
        .number("caused_wait_ns", r.causedWaitNs)
        .number("caused_wait_pct_of_comm", waitPct);
    out.push_back(std::move(fd));
  }
  return out;
}

std::vector<Finding> overheadFindings(const Breakdown& b, const DiagnoseOptions& o) {
  std::vector<Finding> out;
  auto make = [&](int rank, const TimeShares& t, int steps) {
    const double p = t.commOverheadPct();
    if (p < o.commOverheadInfoPct) return;
    Finding fd;
    fd.kind = FindingKind::CommOverhead;
    fd.severity = p >= o.commOverheadWarnPct ? Severity::Warning : Severity::Info;
    fd.rank = rank;
    fd.message = std::string(rank >= 0 ? "rank " + std::to_string(rank) : std::string("the run")) + ": " + pct(p) +
                 " of step time is exposed communication (comm " + pct(t.pct(t.commNs)) + ", overlapped with compute " +
                 pct(t.pct(t.commNs - t.exposedCommNs)) + ")";
    if (rank >= 0) fd.cite("spans", {f("rank", int64_t{rank})});
    fd.number("step_ns", t.stepNs)
        .number("comm_ns", t.commNs)
        .number("exposed_comm_ns", t.exposedCommNs)
        .number("compute_ns", t.computeNs)
        .number("comm_overhead_pct", p)
        .number("steps", int64_t{steps});
    out.push_back(std::move(fd));
  };
  for (const RankBreakdown& r : b.ranks) make(r.rank, r.time, r.steps);
  if (b.ranks.size() > 1) make(-1, b.run, static_cast<int>(b.steps.size()));
  return out;
}

}  // namespace

DiagnoseResult diagnose(tracedb::Reader& reader, const DiagnoseOptions& options) {
  DiagnoseResult result;
  std::vector<Finding> all;
  auto info = loadRunInfo(reader);
  if (!info) {
    result.errors.push_back("run info: " + info.error());
    return result;
  }
  auto take = [&](const char* name, auto&& produce) {
    auto r = produce();
    if (!r) result.errors.push_back(std::string(name) + ": " + r.error());
    else for (auto& fd : *r) all.push_back(std::move(fd));
  };
  using Findings = tracedb::Result<std::vector<Finding>>;
  take("crash", [&]() -> Findings {
    auto ends = analyzeRankEnds(reader, *info);
    if (!ends) return ends.status();
    return crashFindings(reader, *ends, *info);
  });
  auto table = detail::loadCollectives(reader);
  if (!table) result.errors.push_back("collectives: " + table.error());
  take("desync", [&]() -> Findings {
    if (!table) return std::vector<Finding>{};
    auto r = detail::analyzeDesync(reader, *info, *table);
    if (!r) return r.status();
    return desyncFindings(*r, *info);
  });
  take("nonfinite", [&]() -> Findings {
    auto r = analyzeNonFinite(reader, *info);
    if (!r) return r.status();
    return nonFiniteFindings(*r, *info);
  });
  take("anomalies", [&]() -> Findings {
    auto r = analyzeAnomalies(reader, *info, options.anomalies);
    if (!r) return r.status();
    return anomalyFindings(*r, *info);
  });
  take("stragglers", [&]() -> Findings {
    if (!table) return std::vector<Finding>{};
    return stragglerFindings(detail::analyzeCollectives(*table, *info), options);
  });
  take("breakdown", [&]() -> Findings {
    auto r = computeBreakdown(reader);
    if (!r) return r.status();
    return overheadFindings(*r, options);
  });

  sortFindings(all);
  std::map<FindingKind, int64_t> perKind;
  std::map<std::string, int64_t> omitted;
  for (auto& fd : all) {
    if (++perKind[fd.kind] > options.maxFindingsPerKind) {
      ++omitted[std::string(findingKindName(fd.kind))];
      continue;
    }
    result.findings.push_back(std::move(fd));
  }
  result.omitted.assign(omitted.begin(), omitted.end());
  return result;
}

}  // namespace tpscope::analysis
