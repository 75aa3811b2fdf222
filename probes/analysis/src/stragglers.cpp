#include "stragglers.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <set>
#include <string>

#include "evidence_util.h"
#include "tpscope/analysis/units_text.h"
#include "tpscope/tracedb/query.h"
#include "tpscope/vocabulary/spike_baseline.h"

namespace tpscope::analysis::detail {

namespace {

using text::pct;

std::string ms(int64_t ns) { return threeDigits(static_cast<double>(ns) / 1e6) + " ms"; }

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

// How much longer per step `rank` waited for a CPU than the other ranks (their median); nullopt without the figures.
std::optional<double> cpuWaitExcess(const std::map<int, double>& cpuWait, int rank) {
  const auto own = cpuWait.find(rank);
  const std::optional<double> others = medianCpuWait(cpuWait, [&](int r) { return r != rank; });
  if (own == cpuWait.end() || !others) return std::nullopt;
  return own->second - *others;
}

// Waiting propagates: a rank held up by the straggler arrives late at its next collective with others (its DP
// all-reduce, where the whole DP group waits on it: more waiting than the straggler itself causes in a small TP
// group). Such a rank passes lateness on: it waited on another rank at least half as long as it is late itself, and
// that rank did not wait on it as much. It is a victim, not a straggler.
std::set<int> victimsOf(const StragglerReport& sr) {
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
  return victims;
}

// The ranks that waited on `rank`: the other members of its groups.
std::set<int> groupPeers(const RunInfo& info, int rank) {
  std::set<int> peers;
  for (const auto& g : info.groups)
    if (std::find(g.ranks.begin(), g.ranks.end(), rank) != g.ranks.end())
      for (int m : g.ranks)
        if (m != rank) peers.insert(m);
  return peers;
}

// What one straggler costs and why its host may explain it.
struct StragglerCase {
  const RankStraggling& r;
  std::set<int> waiters;     // the ranks that waited on it (groupPeers)
  double perStep = 0;        // waiting caused beyond chance per step, summed over the waiting ranks
  double costPct = 0;        // perStep against the mean step time
  const tracedb::RankInfo* ri = nullptr;
  bool crowded = false;      // its host runs more ranks than CPUs
  bool full = false;         // every CPU of its host runs a rank
  double period = 0;         // the host's scheduling period (full only)
  double lagPerStep = 0;     // perStep per waiting rank
  bool schedulerSized = false;  // not significant at the run's bound, and within one scheduling period
  std::optional<double> cpuExcess = std::nullopt;  // its threads' wait for a CPU per step beyond the other ranks'
  bool cpuSized = false;     // that wait is at least half its lateness
  std::optional<double> hostWait = std::nullopt;  // the other ranks of its host: their wait for a CPU per step
  bool hostNoiseSized = false;                    // lagPerStep under hostWait: within the host's scheduling noise
  bool stepSignificant = true;  // late step after step: the step-clustered test at the run's bound (collectives.h)
  bool large = false;           // costPct ≥ stragglerLargeStepPct: a quarter of a step per step
  bool fewSteps = false;        // too few steps for the arrival test (p ≥ stragglerLargeAlpha), late in each one
};

// Late in each of at least two steps, by more than the scheduler can make: how a large effect is told where the run
// has too few steps for the arrival test (a TP pair that crashed after two steps: p = 0.08 at best, however late).
// Lateness comes from the CPU (the rank waited for one: the run delay) or from the rank's own work (it computed or
// slept longer). Beyond chance by kSchedulerPeriods scheduling periods per step and more than its host's ranks waited
// for a CPU, while its own wait does not explain half of it, it is the rank's own work. A healthy rank is late at a
// step by chance half the time, by up to a period at a time.
constexpr double kSchedulerPeriods = 2.0;
bool beyondTheScheduler(const StragglerCase& c) {
  const RankStraggling& r = c.r;
  if (r.stepsCounted < 2 || r.stepsLate < r.stepsCounted || !c.large || c.cpuSized) return false;
  return c.lagPerStep >= kSchedulerPeriods * c.period && (!c.hostWait || c.lagPerStep >= *c.hostWait);
}

// Material: the waiting it caused beyond what chance would have put on it, per step (summed over the ranks that
// waited: the rank-time the job lost), against the mean step time. On an oversubscribed host (more ranks than CPUs)
// ranks take turns on the cores: one lags by the luck of scheduling, so only a large lag is a fault there. Where
// every CPU runs a rank, the OS takes a core from a rank a scheduling period at a time: in a short run a few such
// turns make a large lag by chance; there a lag that is not significant at the run's bound is a fault only when each
// waiting rank loses more per step than one scheduling period. Late because its threads waited for a CPU (run
// queue), beyond what the other ranks waited, at least half as long as it is late (the waiting it caused per step
// and waiting rank): where every CPU runs a rank, that is the host's scheduling, not a fault. There, too, a rank late
// at many collectives but not step after step (the step-clustered test, collectives.h, not significant at the run's
// bound) is late in bursts — a stretch in which the scheduler favoured another rank, a hiccup that delays several
// collectives of one step: a figure, unless the effect is large. Wherever a host's other ranks each wait for a CPU,
// per step, longer than this rank's lag beyond chance per waiting rank, each rank's progress is gated by when the OS
// runs it by more than the lag: the lag is within the host's scheduling noise (measured, not the theoretical period
// above), a figure unless the effect is large. A host with CPUs to spare waits near zero, and the rule is inert.
StragglerCase judge(const RankStraggling& r, const StragglerReport& sr, const RunInfo& info, double stepNs,
                    double alpha, const std::map<int, double>& cpuWait) {
  StragglerCase c{.r = r, .waiters = groupPeers(info, r.rank)};
  const double excess = std::max(0.0, static_cast<double>(r.causedWaitNs) - r.expectedWaitNs);
  const double steps = static_cast<double>(std::max<int64_t>(1, sr.steps));
  const double waiting = static_cast<double>(std::max<size_t>(1, c.waiters.size()));
  c.perStep = excess / steps;
  c.costPct = stepNs > 0 ? 100.0 * c.perStep / stepNs : 0.0;
  c.ri = info.rank(r.rank);
  c.crowded = c.ri != nullptr && info.oversubscribed(c.ri->host);
  c.full = c.ri != nullptr && info.cpusFull(c.ri->host);
  c.period = c.full ? schedulerPeriodNs(info.hostCpus.at(c.ri->host)) : 0;
  c.lagPerStep = c.perStep / waiting;
  c.schedulerSized = c.full && r.pValue >= alpha && c.lagPerStep < c.period;
  c.cpuExcess = cpuWaitExcess(cpuWait, r.rank);
  if (c.ri != nullptr)  // the other ranks of its host
    c.hostWait = medianCpuWait(cpuWait, [&](int q) {
      const tracedb::RankInfo* qi = info.rank(q);
      return q != r.rank && qi != nullptr && qi->host == c.ri->host;
    });
  c.hostNoiseSized = c.hostWait && c.lagPerStep < *c.hostWait;
  const double latePerStep = static_cast<double>(r.causedWaitNs) / steps / waiting;
  c.cpuSized = c.cpuExcess && latePerStep > 0 && *c.cpuExcess >= 0.5 * latePerStep;
  // Where every CPU runs a rank, the OS hands a core to one rank for a stretch of steps: there the lateness must
  // also hold step after step. Without step numbers (an import) there is no step to cluster on.
  c.stepSignificant = !c.full || r.stepsCounted < 2 || r.pStep < alpha;
  return c;
}

// The details that say why the host may explain the lag.
void addHostDetails(Finding& fd, const StragglerCase& c, const RunInfo& info, const std::map<int, double>& cpuWait) {
  const RankStraggling& r = c.r;
  if (c.schedulerSized)
    fd.details.push_back("every CPU of host " + c.ri->host + " runs a rank: a lag of " +
                         ms(static_cast<int64_t>(c.lagPerStep)) + " per step, within one scheduling period (" +
                         ms(static_cast<int64_t>(c.period)) + "), over " + std::to_string(r.collectives) +
                         " collectives may be the scheduler's: a longer run decides");
  if (c.cpuSized)
    fd.details.push_back("its threads waited " + ms(static_cast<int64_t>(cpuWait.at(r.rank))) +
                         " per step for a CPU, " + ms(static_cast<int64_t>(*c.cpuExcess)) +
                         " more than the other ranks: " +
                         (c.full ? "every CPU of host " + c.ri->host + " runs a rank, so this is the host's scheduling"
                                 : std::string("another thread or process on its host holds its CPU")));
  if (c.hostNoiseSized)
    fd.details.push_back(
        "the other ranks of host " + c.ri->host + " wait " + ms(static_cast<int64_t>(*c.hostWait)) +
        " per step for a CPU (their median): a lag of " + ms(static_cast<int64_t>(c.lagPerStep)) +
        " per step beyond chance is within that scheduling noise" +
        (c.large ? std::string() : ", not a fault short of a quarter of a step: a host with CPUs to spare decides"));
  if (c.crowded)
    fd.details.push_back("host " + c.ri->host + " runs more ranks than its " +
                         std::to_string(info.hostCpus.at(c.ri->host)) +
                         " CPUs: a lag under a quarter of a step per step is scheduling, not a fault");
}

// The finding of one straggler: its message, the cost told as a share of the waiting ranks' own time (their steps,
// each a mean step long, within which each one's waiting lies — not of one step), the host's part, the worst
// collectives it arrived last at, and its figures.
Finding stragglerFinding(const StragglerCase& c, const CollectiveAnalysis& ca, const RunInfo& info, double stepNs,
                         const std::map<int, double>& cpuWait, const DiagnoseOptions& o) {
  const RankStraggling& r = c.r;
  const StragglerReport& sr = ca.stragglers;
  Finding fd;
  fd.kind = FindingKind::Straggler;
  // Significant but small (a rank that shares its core with others, say): a figure, not a fault.
  const bool fault = c.costPct >= (c.crowded ? o.stragglerLargeStepPct : o.stragglerMinStepPct) && !c.schedulerSized &&
                     !(c.cpuSized && c.full) && (c.stepSignificant || c.large) && (c.large || !c.hostNoiseSized);
  fd.severity = fault ? Severity::Warning : Severity::Info;
  fd.rank = r.rank;
  fd.message = "rank " + std::to_string(r.rank) + " arrives last at " + pct(r.lastPct()) + " of its collectives (" +
               std::to_string(r.lastCount) + " of " + std::to_string(r.collectives) + "); the others wait " +
               ms(r.causedWaitNs) + " in total on it";
  if (sr.steps > 0) fd.message += " (" + ms(r.causedWaitNs / sr.steps) + " per step)";
  const size_t waiting = c.waiters.empty() ? std::max<size_t>(1, sr.ranks.size()) - 1 : c.waiters.size();
  const double sharePct =
      stepNs > 0 && waiting > 0 ? 100.0 * c.perStep / (stepNs * static_cast<double>(waiting)) : 0.0;
  char why[240];
  std::snprintf(why, sizeof why,
                "chance would make it cause %s of waiting (z = %.1f, p = %.2g); beyond that, the %zu %s waiting "
                "on it %s %s per step, %.1f%% of %s time",
                ms(static_cast<int64_t>(r.expectedWaitNs)).c_str(), r.z, r.pValue, waiting,
                waiting == 1 ? "rank" : "ranks", waiting == 1 ? "loses" : "lose",
                ms(static_cast<int64_t>(c.perStep)).c_str(), sharePct, waiting == 1 ? "its" : "their");
  fd.details.push_back(why);
  if (c.full && r.stepsCounted >= 2) {  // where the step test applies (judge)
    char steps[320];
    std::snprintf(
        steps, sizeof steps, "late beyond its chance share in %lld of %lld steps (step-clustered z = %.1f, p = %.2g)%s",
        static_cast<long long>(r.stepsLate), static_cast<long long>(r.stepsCounted), r.zStep, r.pStep,
        c.stepSignificant || c.fewSteps ? ""
                                        : ": not significant step by step at the run's bound — where every CPU runs a "
                                          "rank, lateness that comes in stretches is the scheduler's; a longer run "
                                          "decides");
    fd.details.push_back(steps);
  }
  if (c.fewSteps)
    fd.details.push_back(
        "too few steps for the arrival test; late in each of its " + std::to_string(r.stepsCounted) + " steps, by " +
        ms(static_cast<int64_t>(c.lagPerStep)) + " per step beyond chance" +
        (c.period > 0 ? ", over " + threeDigits(c.lagPerStep / c.period) + " scheduling periods" : std::string()) +
        ", and not for want of a CPU: its own work made it late");
  addHostDetails(fd, c, info, cpuWait);
  for (const CollectiveArrival& a : ca.worst) {
    if (a.lastRank != r.rank) continue;
    fd.cite("collectives", {EvidenceField{"rank", int64_t{r.rank}}, EvidenceField{"group_name", a.group},
                            EvidenceField{"seq", a.seq}});
    if (!fd.collective) fd.collective = CollectiveRef{a.group, a.seq, a.op};
  }
  std::set<int> waiters = c.waiters;
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
      .number("step_cost_pct", c.costPct)
      .number("waiting_share_pct", sharePct)
      .number("steps_late", r.stepsLate)
      .number("steps_counted", r.stepsCounted)
      .number("z_step", r.zStep)
      .number("p_step", r.pStep);
  if (c.cpuExcess) fd.number("cpu_wait_excess_ns_per_step", *c.cpuExcess);
  if (c.hostWait) fd.number("host_cpu_wait_ns_per_step", *c.hostWait);
  fd.number("lag_ns_per_step", c.lagPerStep);
  return fd;
}

}  // namespace

std::optional<double> medianCpuWait(const std::map<int, double>& cpuWait, const std::function<bool(int)>& keep) {
  std::vector<double> kept;
  for (const auto& [r, ns] : cpuWait)
    if (keep(r)) kept.push_back(ns);
  if (kept.empty()) return std::nullopt;
  return vocabulary::medianOf(std::move(kept));
}

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

std::vector<Finding> stragglerFindings(const CollectiveAnalysis& ca, const RunInfo& info, const Breakdown* b,
                                       const std::map<int, double>& cpuWait, const DiagnoseOptions& o) {
  std::vector<Finding> out;
  const StragglerReport& sr = ca.stragglers;
  const std::set<int> victims = victimsOf(sr);
  // Of the others, only the top rank and those that caused at least 75 % as much waiting are named.
  int64_t top = 0;
  for (const RankStraggling& r : sr.ranks)
    if (!victims.count(r.rank)) top = std::max(top, r.causedWaitNs);
  const double alpha = o.stragglerAlpha / static_cast<double>(std::max<size_t>(1, sr.ranks.size()));
  const double stepNs = meanStepNs(b);
  for (const RankStraggling& r : sr.ranks) {
    if (r.causedWaitNs * 4 < top * 3 || r.collectives < o.stragglerMinCollectives || victims.count(r.rank)) continue;
    StragglerCase c = judge(r, sr, info, stepNs, alpha, cpuWait);
    // A large effect needs less evidence: few steps cannot make a rank significant at the run's bound, however late.
    c.large = stepNs > 0 && c.costPct >= o.stragglerLargeStepPct;
    if (r.pValue >= alpha && !c.large) continue;
    // Too few steps for even that: late in each, by more than the scheduler can make.
    c.fewSteps = r.pValue >= o.stragglerLargeAlpha;
    if (c.fewSteps && !beyondTheScheduler(c)) continue;
    out.push_back(stragglerFinding(c, ca, info, stepNs, cpuWait, o));
  }
  return out;
}

}  // namespace tpscope::analysis::detail
