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
#include "tpscope/analysis/run_info.h"
#include "tpscope/analysis/sdc.h"
#include "tpscope/vocabulary/spike_baseline.h"
#include "tpscope/tracedb/query.h"
#include "analysis_internal.h"
#include "evidence_util.h"
#include "workers.h"

namespace tpscope::analysis {

namespace {

using detail::field;

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

// Linux CFS's default scheduling period on a host of `cpus` CPUs: sched_latency = 6 ms × (1 + log2 CPUs), the CPUs
// capped at 8. Where every CPU runs a rank, another thread's turn on a core (the launcher, a recorder's flush, the OS)
// holds one rank back by up to about this much at a time.
double schedulerPeriodNs(int cpus) {
  const int capped = std::clamp(cpus, 1, 8);
  int log2 = 0;
  while ((2 << log2) <= capped) ++log2;
  return 6e6 * (1 + log2);
}

// Mean step time over the ranks' step windows (0 without a breakdown).
double meanStepNs(const Breakdown* b) {
  if (b == nullptr || b->steps.empty()) return 0;
  return static_cast<double>(b->run.stepNs) / static_cast<double>(b->steps.size());
}

// Per rank, its threads' wait for a CPU per step: the recorder's run delay (counter_names::kRunDelay, sampled at each
// step's end) from its first sample to its last, over the steps between them. Ranks with fewer than two samples (an
// older recorder, another tool's trace) are absent.
tracedb::Result<std::map<int, double>> cpuWaitPerStep(tracedb::Reader& reader) {
  std::map<int, double> out;
  tracedb::Query q(reader,
                   "SELECT c.rank, min(c.value), max(c.value), count(*) FROM counters c JOIN strings n ON n.id = c.name"
                   " WHERE n.value = ? GROUP BY c.rank",
                   "table 'counters'");
  q.bind(1, tracedb::counter_names::kRunDelay);
  auto s = q.each([&](tracedb::Query& r) {
    if (r.i64(3) >= 2) out[r.i32(0)] = (r.f64(2) - r.f64(1)) / static_cast<double>(r.i64(3) - 1);
  });
  if (!s) return s;
  return out;
}

// How much longer per step `rank` waited for a CPU than the other ranks (their median); nullopt without the figures.
std::optional<double> cpuWaitExcess(const std::map<int, double>& cpuWait, int rank) {
  const auto own = cpuWait.find(rank);
  if (own == cpuWait.end()) return std::nullopt;
  std::vector<double> others;
  for (const auto& [r, ns] : cpuWait)
    if (r != rank) others.push_back(ns);
  if (others.empty()) return std::nullopt;
  return own->second - vocabulary::medianOf(std::move(others));
}

std::vector<Finding> stragglerFindings(const CollectiveAnalysis& ca, const RunInfo& info, const Breakdown* b,
                                       const std::map<int, double>& cpuWait, const DiagnoseOptions& o) {
  std::vector<Finding> out;
  const StragglerReport& sr = ca.stragglers;
  // Waiting propagates: a rank held up by the straggler arrives late at its next collective with others (its DP
  // all-reduce, where the whole DP group waits on it: more waiting than the straggler itself causes in a small TP
  // group). Such a rank passes lateness on: it waited on another rank at least half as long as it is late itself,
  // and that rank did not wait on it as much. It is a victim, not a straggler.
  std::map<int, const RankStraggling*> byRank;
  for (const RankStraggling& r : sr.ranks) byRank[r.rank] = &r;
  std::set<int> victims;
  for (const RankStraggling& r : sr.ranks)
    for (const auto& [on, ns] : r.waitedOn) {
      const auto s = byRank.find(on);
      if (s == byRank.end() || 2 * ns < r.lagNs) continue;
      const auto back = s->second->waitedOn.find(r.rank);
      const int64_t sOnR = back != s->second->waitedOn.end() ? back->second : 0;
      if (2 * sOnR < s->second->lagNs) victims.insert(r.rank);
    }
  // Of the others, only the top rank and those that caused at least 75 % as much waiting are named.
  int64_t top = 0;
  for (const RankStraggling& r : sr.ranks)
    if (!victims.count(r.rank)) top = std::max(top, r.causedWaitNs);
  const double alpha = o.stragglerAlpha / static_cast<double>(std::max<size_t>(1, sr.ranks.size()));
  const double stepNs = meanStepNs(b);
  for (const RankStraggling& r : sr.ranks) {
    if (r.causedWaitNs * 4 < top * 3 || r.collectives < o.stragglerMinCollectives ||
        r.pValue >= o.stragglerLargeAlpha || victims.count(r.rank))
      continue;
    // The ranks that waited on it: the other members of its groups.
    std::set<int> waiters;
    for (const auto& g : info.groups)
      if (std::find(g.ranks.begin(), g.ranks.end(), r.rank) != g.ranks.end())
        for (int m : g.ranks)
          if (m != r.rank) waiters.insert(m);
    // Material: the waiting it caused beyond what chance would have put on it, per step (summed over the ranks that
    // waited: the rank-time the job lost), against the mean step time.
    const double excess = std::max(0.0, static_cast<double>(r.causedWaitNs) - r.expectedWaitNs);
    const double perStep = excess / static_cast<double>(std::max<int64_t>(1, sr.steps));
    const double costPct = stepNs > 0 ? 100.0 * perStep / stepNs : 0.0;
    // A large effect needs less evidence: few steps cannot make a rank significant at the run's bound, however late.
    const bool large = stepNs > 0 && costPct >= o.stragglerLargeStepPct;
    if (r.pValue >= alpha && !large) continue;
    // On an oversubscribed host (more ranks than CPUs) ranks take turns on the cores: one lags by the luck of
    // scheduling, so only a large lag is a fault there.
    const tracedb::RankInfo* ri = info.rank(r.rank);
    const bool crowded = ri != nullptr && info.oversubscribed(ri->host);
    // Where every CPU runs a rank, the OS takes a core from a rank a scheduling period at a time: in a short run a few
    // such turns make a large lag by chance. There a lag that is not significant at the run's bound is a fault only
    // when each waiting rank loses more per step than one scheduling period.
    const bool full = ri != nullptr && info.cpusFull(ri->host);
    const double period = full ? schedulerPeriodNs(info.hostCpus.at(ri->host)) : 0;
    const double lagPerStep = perStep / static_cast<double>(std::max<size_t>(1, waiters.size()));
    const bool schedulerSized = full && r.pValue >= alpha && lagPerStep < period;
    // Late because its threads waited for a CPU (run queue), beyond what the other ranks waited, at least half
    // as long as it is late (the waiting it caused per step and waiting rank): where every CPU runs a rank, that is
    // the host's scheduling, not a fault.
    const std::optional<double> cpuExcess = cpuWaitExcess(cpuWait, r.rank);
    const double latePerStep = static_cast<double>(r.causedWaitNs) / static_cast<double>(std::max<int64_t>(1, sr.steps)) /
                               static_cast<double>(std::max<size_t>(1, waiters.size()));
    const bool cpuSized = cpuExcess && latePerStep > 0 && *cpuExcess >= 0.5 * latePerStep;
    Finding fd;
    fd.kind = FindingKind::Straggler;
    // Significant but small (a rank that shares its core with others, say): a figure, not a fault.
    fd.severity = costPct >= (crowded ? o.stragglerLargeStepPct : o.stragglerMinStepPct) && !schedulerSized &&
                          !(cpuSized && full)
                      ? Severity::Warning
                      : Severity::Info;
    fd.rank = r.rank;
    fd.message = "rank " + std::to_string(r.rank) + " arrives last at " + pct(r.lastPct()) + " of its collectives (" +
                 std::to_string(r.lastCount) + " of " + std::to_string(r.collectives) + "); the others wait " +
                 ms(r.causedWaitNs) + " in total on it";
    if (sr.steps > 0) fd.message += " (" + ms(r.causedWaitNs / sr.steps) + " per step)";
    // Beyond chance, the waiting ranks lose `perStep` ns per step between them; told as a share of their own time
    // (their steps, each a mean step long), within which each one's waiting lies — not of one step.
    const size_t waiting = waiters.empty() ? std::max<size_t>(1, sr.ranks.size()) - 1 : waiters.size();
    const double sharePct = stepNs > 0 && waiting > 0 ? 100.0 * perStep / (stepNs * static_cast<double>(waiting)) : 0.0;
    char why[240];
    std::snprintf(why, sizeof why,
                  "chance would make it cause %s of waiting (z = %.1f, p = %.2g); beyond that, the %zu %s waiting "
                  "on it %s %s per step, %.1f%% of %s time",
                  ms(static_cast<int64_t>(r.expectedWaitNs)).c_str(), r.z, r.pValue, waiting,
                  waiting == 1 ? "rank" : "ranks", waiting == 1 ? "loses" : "lose",
                  ms(static_cast<int64_t>(perStep)).c_str(), sharePct, waiting == 1 ? "its" : "their");
    fd.details.push_back(why);
    if (schedulerSized)
      fd.details.push_back("every CPU of host " + ri->host + " runs a rank: a lag of " +
                           ms(static_cast<int64_t>(lagPerStep)) + " per step, within one scheduling period (" +
                           ms(static_cast<int64_t>(period)) + "), over " +
                           std::to_string(r.collectives) + " collectives may be the scheduler's: a longer run decides");
    if (cpuSized)
      fd.details.push_back("its threads waited " + ms(static_cast<int64_t>(cpuWait.at(r.rank))) +
                           " per step for a CPU, " + ms(static_cast<int64_t>(*cpuExcess)) +
                           " more than the other ranks: " +
                           (full ? "every CPU of host " + ri->host + " runs a rank, so this is the host's scheduling"
                                 : std::string("another thread or process on its host holds its CPU")));
    if (crowded)
      fd.details.push_back("host " + ri->host + " runs more ranks than its " +
                           std::to_string(info.hostCpus.at(ri->host)) +
                           " CPUs: a lag under a quarter of a step per step is scheduling, not a fault");
    for (const CollectiveArrival& a : ca.worst) {
      if (a.lastRank != r.rank) continue;
      fd.cite("collectives", {field("rank", int64_t{r.rank}), field("group_name", a.group), field("seq", a.seq)});
      if (!fd.collective) fd.collective = CollectiveRef{a.group, a.seq, a.op};
    }
    if (waiters.empty())
      for (const RankStraggling& other : sr.ranks)
        if (other.rank != r.rank) waiters.insert(other.rank);
    fd.ranks.assign(waiters.begin(), waiters.end());
    fd.number("last_count", r.lastCount)
        .number("collectives", r.collectives)
        .number("last_pct", r.lastPct())
        .number("caused_wait_ns", r.causedWaitNs)
        .number("expected_wait_ns", r.expectedWaitNs)
        .number("z", r.z)
        .number("p_value", r.pValue)
        .number("step_cost_pct", costPct)
        .number("waiting_share_pct", sharePct);
    if (cpuExcess) fd.number("cpu_wait_excess_ns_per_step", *cpuExcess);
    out.push_back(std::move(fd));
  }
  return out;
}

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
  take("stragglers", [&]() -> Findings {
    if (!collectives) return std::vector<Finding>{};
    auto cpuWait = cpuWaitPerStep(reader);
    if (!cpuWait) return cpuWait.status();
    return stragglerFindings(*collectives, *info, breakdown ? &*breakdown : nullptr, *cpuWait, options);
  });
  take("breakdown", [&]() -> Findings {
    if (!breakdown) return std::vector<Finding>{};
    return overheadFindings(*breakdown, collectives ? &collectives->tp : nullptr, options);
  });
  take("pipeline", [&]() -> Findings {
    auto r = analyzePipeline(reader);
    if (!r) return r.status();
    result.reports.pipeline = std::move(*r);
    return pipelineFindings(*result.reports.pipeline);
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
