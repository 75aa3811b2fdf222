#include "tpscope/analysis/diagnose.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "tpscope/analysis/breakdown.h"
#include "tpscope/analysis/collectives.h"
#include "tpscope/analysis/crash.h"
#include "tpscope/analysis/desync.h"
#include "tpscope/analysis/nonfinite.h"
#include "tpscope/analysis/pipeline.h"
#include "tpscope/analysis/replay.h"
#include "tpscope/analysis/run_info.h"
#include "tpscope/analysis/sdc.h"
#include "tpscope/analysis/units_text.h"
#include "tpscope/tracedb/query.h"
#include "analysis_internal.h"
#include "evidence_util.h"
#include "stragglers.h"
#include "workers.h"

namespace tpscope::analysis {

namespace {

using detail::field;

using text::pct;

// Bytes per step of TP communication beyond the analytic model, in % of the model (nullopt: no comparable model).
std::optional<double> tpExcessPct(const TpModelCheck& tp) {
  if (!tp.haveModel || tp.expectedBytesPerStep <= 0 || tp.measuredBytesPerStep <= 0) return std::nullopt;
  return 100.0 * (tp.measuredBytesPerStep - static_cast<double>(tp.expectedBytesPerStep)) /
         static_cast<double>(tp.expectedBytesPerStep);
}

std::vector<Finding> overheadFindings(const Breakdown& b, const TpModelCheck* tp, const DiagnoseOptions& o) {
  std::vector<Finding> out;
  const std::optional<double> excess = tp ? tpExcessPct(*tp) : std::nullopt;
  auto make = [&](int rank, const TimeShares& t, int steps) {
    const double p = t.commOverheadPct();
    if (p < o.commOverheadInfoPct) return;
    // No compute recorded at all (an imported Flight Recorder folder holds collectives only): nothing says what the
    // communication could have overlapped, so its share of the collectives' own hull is not an overhead.
    if (t.computeNs <= 0) return;
    Finding fd;
    fd.kind = FindingKind::CommOverhead;
    const bool unexplained = excess && *excess > o.tpExcessPct;
    fd.severity = p >= o.commOverheadWarnPct && unexplained ? Severity::Warning : Severity::Info;
    fd.rank = rank;
    fd.message = std::string(rank >= 0 ? "rank " + std::to_string(rank) : std::string("the run")) + ": " + pct(p) +
                 " of step time is exposed communication (comm " + pct(t.pct(t.commNs)) + ", overlapped with compute " +
                 pct(t.pct(t.commNs - t.exposedCommNs)) + ")";
    if (unexplained)
      fd.details.push_back("TP communication is " + pct(*excess) + " above what the TP model of the config expects");
    if (rank >= 0) fd.cite("spans", {field("rank", int64_t{rank})});
    fd.number("step_ns", t.stepNs)
        .number("comm_ns", t.commNs)
        .number("exposed_comm_ns", t.exposedCommNs)
        .number("compute_ns", t.computeNs)
        .number("comm_overhead_pct", p)
        .number("steps", int64_t{steps});
    if (excess) fd.number("tp_excess_pct", *excess);
    out.push_back(std::move(fd));
  };
  for (const RankBreakdown& r : b.ranks) make(r.rank, r.time, r.steps);
  if (b.ranks.size() > 1) make(-1, b.run, static_cast<int>(b.steps.size()));
  return out;
}

// A rank that died never enters its next collectives: its peers' hang there is a consequence of the crash, not a
// second cause. A hang all of whose missing ranks crashed becomes secondary (error), so the crash is named first.
// A rank that only stopped recording early (error: no crash in its exit, e.g. stopped by the hang watchdog while
// stuck outside any collective) is the hang's missing rank, not a crash that explains it.
void markHangsCausedByCrashes(std::vector<Finding>& all) {
  std::set<int> crashed;
  for (const Finding& fd : all)
    if (fd.kind == FindingKind::Crash && fd.severity == Severity::Critical && fd.rank >= 0) crashed.insert(fd.rank);
  if (crashed.empty()) return;
  for (Finding& fd : all) {
    if (fd.kind != FindingKind::Hang || fd.severity != Severity::Critical || fd.ranks.empty()) continue;
    if (!std::all_of(fd.ranks.begin(), fd.ranks.end(), [&](int r) { return crashed.count(r) > 0; })) continue;
    fd.severity = Severity::Error;
    fd.details.push_back(rankList(fd.ranks) + " crashed before entering it: a consequence of the crash, not a cause");
    for (auto& n : fd.evidence.numbers)
      if (n.name == "secondary") n.value = int64_t{1};
  }
}

}  // namespace

DiagnoseResult diagnose(tracedb::Reader& reader, const DiagnoseOptions& options) {
  DiagnoseResult result;
  std::vector<Finding> all;
  // The collectives are loaded once and feed the run info, the rank ends, desync and the collective analysis. Where
  // they cannot be loaded, the run info and the rank ends read the file themselves and what fails is reported as
  // before.
  auto table = detail::loadCollectives(reader);
  auto info = table ? detail::loadRunInfo(reader, *table) : loadRunInfo(reader);
  if (!info) {
    result.errors.push_back("run info: " + info.error());
    return result;
  }
  // The anomaly analysis reads only its own tables and the run info: it runs alongside the others (workers.h), and
  // its findings take their place below.
  detail::Concurrently<AnomalyReport> anomalies(
      reader, [&](tracedb::Reader& own) { return analyzeAnomalies(own, *info, options.anomalies); });
  auto take = [&](const char* name, auto&& produce) {
    auto r = produce();
    if (!r) result.errors.push_back(std::string(name) + ": " + r.error());
    else for (auto& fd : *r) all.push_back(std::move(fd));
  };
  using Findings = tracedb::Result<std::vector<Finding>>;
  take("crash", [&]() -> Findings {
    auto ends = table ? detail::analyzeRankEnds(reader, *info, *table) : analyzeRankEnds(reader, *info);
    if (!ends) return ends.status();
    return crashFindings(reader, *ends, *info);
  });
  if (!table) result.errors.push_back("collectives: " + table.error());
  take("desync", [&]() -> Findings {
    if (!table) return std::vector<Finding>{};
    auto r = detail::analyzeDesync(reader, *info, *table);
    if (!r) return r.status();
    result.reports.desync = std::move(*r);
    return desyncFindings(*result.reports.desync, *info);
  });
  take("nonfinite", [&]() -> Findings {
    auto r = analyzeNonFinite(reader, *info);
    if (!r) return r.status();
    result.reports.nonfinite = std::move(*r);
    return nonFiniteFindings(*result.reports.nonfinite, *info);
  });
  take("silent corruption", [&]() -> Findings { return silentCorruptionFindings(reader); });
  take("replay", [&]() -> Findings { return replayFindings(reader); });
  // The breakdown and the collective analysis feed both the straggler and the overhead rules: computed once, here
  // while the anomaly analysis runs.
  auto breakdown = computeBreakdown(reader);
  std::optional<CollectiveAnalysis> collectives;
  if (table) collectives = detail::analyzeCollectives(*table, *info);
  std::optional<AnomalyReport> anomalyReport;
  take("anomalies", [&]() -> Findings {
    auto r = anomalies.get();
    if (!r) return r.status();
    anomalyReport = std::move(*r);
    return anomalyFindings(*anomalyReport, *info);
  });
  if (!breakdown) result.errors.push_back("breakdown: " + breakdown.error());
  // Per rank, its threads' wait for a CPU per step: the host's scheduling noise in lateness and compute times.
  auto cpuWait = detail::cpuWaitPerStep(reader);
  if (!cpuWait) result.errors.push_back("cpu wait: " + cpuWait.error());
  const std::map<int, double> noCpuWait;
  const std::map<int, double>& cpuWaitOr = cpuWait ? *cpuWait : noCpuWait;
  take("stragglers", [&]() -> Findings {
    if (!collectives) return std::vector<Finding>{};
    return detail::stragglerFindings(*collectives, *info, breakdown ? &*breakdown : nullptr, cpuWaitOr, options);
  });
  take("breakdown", [&]() -> Findings {
    if (!breakdown) return std::vector<Finding>{};
    return overheadFindings(*breakdown, collectives ? &collectives->tp : nullptr, options);
  });
  take("pipeline", [&]() -> Findings {
    auto r = analyzePipeline(reader);
    if (!r) return r.status();
    result.reports.pipeline = std::move(*r);
    return pipelineFindings(*result.reports.pipeline, cpuWaitOr);
  });
  if (breakdown) result.reports.breakdown = std::move(*breakdown);
  result.reports.collectives = std::move(collectives);
  result.reports.info = std::move(*info);

  // Replicas that a NaN or one rank's gradient spike parted are that fault's consequence, not a corruption.
  explainDivergences(all, result.reports.nonfinite ? &*result.reports.nonfinite : nullptr,
                     anomalyReport ? &*anomalyReport : nullptr, options.anomalies);
  markHangsCausedByCrashes(all);
  namePipelineHangs(reader, all);  // a hang on a pipeline message, in pipeline terms
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
  const DiagnoseReports& rep = result.reports;
  auto ptr = [](const auto& optional) { return optional ? &*optional : nullptr; };
  result.chain = buildChain(result.findings, {ptr(rep.info), ptr(rep.breakdown), ptr(rep.collectives),
                                              ptr(rep.desync), ptr(rep.nonfinite)});
  return result;
}

}  // namespace tpscope::analysis
