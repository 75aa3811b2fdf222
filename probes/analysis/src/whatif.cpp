#include "tpscope/analysis/whatif.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "tpscope/analysis/breakdown.h"
#include "tpscope/analysis/collectives.h"
#include "tpscope/analysis/pipeline.h"
#include "tpscope/analysis/run_info.h"
#include "tpscope/analysis/units_text.h"
#include "tpscope/vocabulary/spike_baseline.h"
#include "tpscope/tracedb/query.h"
#include "whatif_graph.h"

namespace tpscope::analysis {

namespace {

using detail::WhatIfEdit;
using detail::WhatIfGraph;
using detail::WhatIfPathSegment;
using detail::WhatIfReplay;
using SegmentKey = std::pair<int, int>;  // (lane, event): the work segment before that event

// Everything the changes share: the graph, the baseline replay, the measured steps and their critical paths.
struct Context {
  const Breakdown* breakdown = nullptr;
  WhatIfGraph g;
  WhatIfReplay base;
  std::set<int> steps;                                // measured
  std::vector<std::vector<WhatIfPathSegment>> paths;  // baseline critical path of each measured step
  PipelineReport pipeline;
  std::map<int, int> stageOfRank;  // pipeline runs
  std::vector<double> baseSteps;   // replayed step times, per measured step
};

// Per measured step (in step order), the mean over ranks of its window: measured, or replayed (`markNs`). Breakdown
// step i has marks 2i (begin) and 2i + 1 (end) (buildWhatIfGraph adds them in that order).
std::vector<double> stepTimesNs(const Context& c, const std::vector<int64_t>* markNs) {
  std::map<int, std::pair<double, int>> byStep;
  for (size_t i = 0; i < c.breakdown->steps.size(); ++i) {
    const StepBreakdown& s = c.breakdown->steps[i];
    if (!c.steps.count(s.step)) continue;
    auto& [sum, n] = byStep[s.step];
    sum += markNs != nullptr ? static_cast<double>((*markNs)[2 * i + 1] - (*markNs)[2 * i])
                             : static_cast<double>(s.endNs - s.beginNs);
    ++n;
  }
  std::vector<double> out;
  for (const auto& [step, sn] : byStep) out.push_back(sn.first / sn.second);
  return out;
}

std::set<int> measuredSteps(const Breakdown& b) {
  std::set<int> steps;
  for (const StepBreakdown& s : b.steps) steps.insert(s.step);
  if (steps.size() > 2) steps.erase(steps.begin());  // the first step carries the process's warm-up
  return steps;
}

// The earliest replayed begin of `step` over the ranks: where its critical path starts.
int64_t stepBeginNs(const Context& c, const WhatIfReplay& r, int step) {
  int64_t begin = INT64_MAX;
  for (size_t i = 0; i < c.breakdown->steps.size(); ++i)
    if (c.breakdown->steps[i].step == step) begin = std::min(begin, r.markNs[2 * i]);
  return begin;
}

// The critical path of one step: from the latest replayed end of the step over the ranks back to its earliest begin.
std::vector<WhatIfPathSegment> stepPath(const Context& c, const WhatIfReplay& r, int step) {
  int endMark = -1;
  for (size_t i = 0; i < c.breakdown->steps.size(); ++i) {
    if (c.breakdown->steps[i].step != step) continue;
    if (endMark < 0 || r.markNs[2 * i + 1] > r.markNs[endMark]) endMark = static_cast<int>(2 * i + 1);
  }
  if (endMark < 0) return {};
  const detail::WhatIfMark& m = c.g.marks[endMark];
  return detail::criticalPath(c.g, r, m.lane, m.event, stepBeginNs(c, r, step));
}

// Replays `edit`; the saving per step against the baseline, and the ranks whose baseline critical-path segments
// the edit shortens.
void replayChange(const Context& c, const WhatIfEdit& edit, double measuredNs, WhatIfChange& out) {
  const WhatIfReplay r = detail::replay(c.g, edit);
  const std::vector<double> changed = stepTimesNs(c, &r.markNs);
  std::vector<double> savings;
  for (size_t i = 0; i < changed.size(); ++i) savings.push_back(c.baseSteps[i] - changed[i]);
  out.savingNs = vocabulary::medianOf(savings);
  out.predictedStepNs = measuredNs - out.savingNs;
  std::set<int> ranks;
  for (const auto& path : c.paths)
    for (const WhatIfPathSegment& s : path) {
      const bool shorter =
          s.coll >= 0
              ? edit.transfer && edit.transfer(s.coll, c.g.colls[s.coll].transferNs) < c.g.colls[s.coll].transferNs
              : edit.work && edit.work(s.lane, s.event, c.g.workNs(s.lane, s.event)) < c.g.workNs(s.lane, s.event);
      if (shorter) ranks.insert(s.rank);
    }
  out.ranks.assign(ranks.begin(), ranks.end());
}

// ---- straggler ------------------------------------------------------------------------------------------------

// The work segments of each (rank, measured step) on the rank's primary lane: the events after the step's begin mark
// up to its end mark.
std::map<std::pair<int, int>, std::vector<int>> stepSegments(const Context& c) {
  std::map<std::pair<int, int>, std::vector<int>> out;
  for (size_t i = 0; i < c.breakdown->steps.size(); ++i) {
    const StepBreakdown& s = c.breakdown->steps[i];
    if (!c.steps.count(s.step)) continue;
    const detail::WhatIfMark& b = c.g.marks[2 * i];
    const detail::WhatIfMark& e = c.g.marks[2 * i + 1];
    auto& list = out[{s.rank, s.step}];
    for (int ev = b.event + 1; ev <= e.event; ++ev) list.push_back(ev);
  }
  return out;
}

struct StragglerPlan {
  int rank = -1;
  double excessNs = 0;                 // over the measured steps
  std::map<SegmentKey, int64_t> work;  // new durations
};

// The plan for one rank: each segment at its peers' median where their segments correspond, else the step scaled.
StragglerPlan planFor(const Context& c, int rank, const std::vector<int>& peers,
                      const std::map<std::pair<int, int>, std::vector<int>>& segs) {
  StragglerPlan p;
  p.rank = rank;
  const int lane = c.g.primaryLane.at(rank);
  for (int step : c.steps) {
    auto mine = segs.find({rank, step});
    if (mine == segs.end()) continue;
    std::vector<std::vector<int64_t>> peerDur;
    for (int q : peers) {
      auto it = segs.find({q, step});
      if (it == segs.end()) continue;
      std::vector<int64_t> d;
      for (int ev : it->second) d.push_back(c.g.workNs(c.g.primaryLane.at(q), ev));
      peerDur.push_back(std::move(d));
    }
    if (peerDur.empty()) continue;
    const auto& ev = mine->second;
    bool same = true;
    for (const auto& d : peerDur) same = same && d.size() == ev.size();
    if (same) {
      for (size_t k = 0; k < ev.size(); ++k) {
        std::vector<double> v;
        for (const auto& d : peerDur) v.push_back(static_cast<double>(d[k]));
        const int64_t med = static_cast<int64_t>(vocabulary::medianOf(v));
        const int64_t own = c.g.workNs(lane, ev[k]);
        if (own > med) {
          p.work[{lane, ev[k]}] = med;
          p.excessNs += static_cast<double>(own - med);
        }
      }
      continue;
    }
    std::vector<double> totals;
    for (const auto& d : peerDur) {
      double t = 0;
      for (int64_t x : d) t += static_cast<double>(x);
      totals.push_back(t);
    }
    double own = 0;
    for (int e : ev) own += static_cast<double>(c.g.workNs(lane, e));
    const double med = vocabulary::medianOf(totals);
    if (own <= med || own <= 0) continue;
    for (int e : ev) p.work[{lane, e}] = static_cast<int64_t>(std::llround(c.g.workNs(lane, e) * med / own));
    p.excessNs += own - med;
  }
  return p;
}

void addStraggler(const Context& c, double measuredNs, WhatIfReport& out) {
  const auto segs = stepSegments(c);
  std::map<int, std::vector<int>> byStage;  // peers: the ranks of one stage (all ranks without PP)
  for (int r = 0; r < static_cast<int>(c.g.primaryLane.size()); ++r) {
    if (c.g.primaryLane[r] < 0) continue;
    auto it = c.stageOfRank.find(r);
    byStage[it == c.stageOfRank.end() ? 0 : it->second].push_back(r);
  }
  StragglerPlan best;
  for (const auto& [stage, ranks] : byStage)
    for (int r : ranks) {
      if (ranks.size() < 2) continue;
      std::vector<int> peers;
      for (int q : ranks)
        if (q != r) peers.push_back(q);
      StragglerPlan p = planFor(c, r, peers, segs);
      if (p.excessNs > best.excessNs) best = std::move(p);
    }
  if (best.rank < 0) {
    out.notes.push_back("straggler: no rank works longer than its peers (or no rank has peers)");
    return;
  }
  WhatIfChange ch;
  ch.kind = WhatIfChangeKind::Straggler;
  ch.rank = best.rank;
  char buf[200];
  std::snprintf(buf, sizeof buf, "rank %d's work at its peers' median (%.2f ms more per step)", best.rank,
                best.excessNs / 1e6 / std::max<size_t>(1, c.steps.size()));
  ch.description = buf;
  WhatIfEdit edit;
  edit.work = [&best](int lane, int event, int64_t measured) {
    auto it = best.work.find({lane, event});
    return it == best.work.end() ? measured : it->second;
  };
  replayChange(c, edit, measuredNs, ch);
  out.changes.push_back(std::move(ch));
}

// ---- pipeline -------------------------------------------------------------------------------------------------

// Pass spans ("forward mb K" / "backward mb K") per rank.
tracedb::Result<std::map<int, std::vector<std::pair<int64_t, int64_t>>>> readPasses(tracedb::Reader& reader) {
  std::map<int, std::vector<std::pair<int64_t, int64_t>>> out;
  tracedb::Query q(reader,
                   "SELECT s.rank, s.begin_ns, s.begin_ns + s.dur_ns FROM spans s JOIN strings n ON n.id = s.name "
                   "WHERE s.kind = 0 AND (n.value LIKE 'forward mb %' OR n.value LIKE 'backward mb %')",
                   "pipeline pass spans");
  auto st = q.each([&](tracedb::Query& r) { out[r.i32(0)].push_back({r.i64(1), r.i64(2)}); });
  if (!st) return st;
  for (auto& [rank, list] : out) std::sort(list.begin(), list.end());
  return out;
}

bool insidePass(const std::vector<std::pair<int64_t, int64_t>>& passes, int64_t t) {
  auto it = std::upper_bound(passes.begin(), passes.end(), std::make_pair(t, INT64_MAX));
  return it != passes.begin() && t < std::prev(it)->second;
}

// Every stage's work inside its passes scaled to the stages' mean own compute: the layers re-split so that each stage
// carries the same work, the total kept.
tracedb::Status addStageImbalance(tracedb::Reader& reader, const Context& c, double measuredNs, WhatIfReport& out) {
  const PipelineReport& p = c.pipeline;
  double mean = 0;
  int n = 0;
  for (const auto& s : p.perStage)
    if (s.ownComputeNs > 0) {
      mean += s.ownComputeNs;
      ++n;
    }
  if (n < 2 || p.longestStage < 0) return {};
  mean /= n;
  auto passes = readPasses(reader);
  if (!passes) return passes.status();
  std::map<SegmentKey, int64_t> work;
  for (const auto& stage : p.perStage) {
    if (stage.ownComputeNs <= 0) continue;
    const double factor = mean / stage.ownComputeNs;
    for (int rank : stage.ranks) {
      if (rank >= static_cast<int>(c.g.primaryLane.size()) || c.g.primaryLane[rank] < 0) continue;
      const int lane = c.g.primaryLane[rank];
      const auto& ev = c.g.lanes[lane].events;
      for (size_t e = 1; e < ev.size(); ++e) {
        const int64_t d = c.g.workNs(lane, static_cast<int>(e));
        if (d > 0 && insidePass((*passes)[rank], ev[e].t - d / 2))
          work[{lane, static_cast<int>(e)}] = static_cast<int64_t>(std::llround(d * factor));
      }
    }
  }
  const PipelineStageBubble& longest = p.perStage.at(static_cast<size_t>(p.longestStage));
  WhatIfChange ch;
  ch.kind = WhatIfChangeKind::StageImbalance;
  ch.stage = longest.stage;
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "every stage's compute at the stages' mean %.2f ms per step (longest: stage %d, %.2f ms)", mean / 1e6,
                longest.stage, longest.ownComputeNs / 1e6);
  ch.description = buf;
  WhatIfEdit edit;
  edit.work = [&work](int lane, int event, int64_t measured) {
    auto it = work.find({lane, event});
    return it == work.end() ? measured : it->second;
  };
  replayChange(c, edit, measuredNs, ch);
  out.changes.push_back(std::move(ch));
  return {};
}

void addPipelineBubble(const Context& c, double measuredNs, WhatIfReport& out) {
  const PipelineReport& p = c.pipeline;
  double window = 0, compute = 0;
  for (const auto& s : p.perStage) {
    window = std::max(window, s.stepNs);
    compute = std::max(compute, s.computeNs);
  }
  const double b = p.analyticBubblePct / 100.0;
  if (window <= 0 || b >= 1) return;
  WhatIfChange ch;
  ch.kind = WhatIfChangeKind::PipelineBubble;
  ch.replayed = false;
  ch.savingNs = std::max(0.0, window - compute / (1 - b));
  ch.predictedStepNs = measuredNs - ch.savingNs;
  for (const auto& [rank, stage] : c.stageOfRank) ch.ranks.push_back(rank);
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "pipeline window %.2f ms → %.2f ms: the %s bubble at its analytic %.1f %% (the longest "
                "stage idles %.1f %%)",
                window / 1e6, (window - ch.savingNs) / 1e6, p.schedule.c_str(), p.analyticBubblePct,
                100.0 * (1 - compute / window));
  ch.description = buf;
  out.changes.push_back(std::move(ch));
}

// ---- communication --------------------------------------------------------------------------------------------

void addCommOverlapped(const Context& c, double measuredNs, WhatIfReport& out) {
  WhatIfChange ch;
  ch.kind = WhatIfChangeKind::CommOverlapped;
  ch.description =
      "every transfer hidden behind compute (collectives and point-to-point; ranks still wait for each other)";
  WhatIfEdit edit;
  edit.transfer = [](int, int64_t) { return int64_t{0}; };
  replayChange(c, edit, measuredNs, ch);
  out.changes.push_back(std::move(ch));
}

std::string collectiveClass(const detail::WhatIfCollective& c) {
  return (c.p2p ? std::string("p2p") : groupClass(c.group)) + ":" + c.op;
}

bool matchesClass(const detail::WhatIfCollective& c, const std::string& want) {
  return want.find(':') == std::string::npos ? c.op == canonicalOpName(want) : collectiveClass(c) == want;
}

void addBusbw(const Context& c, const WhatIfOptions& o, double measuredNs, WhatIfReport& out) {
  std::string target = o.collective;
  if (target.empty()) {  // the class with the most transfer on the critical paths
    std::map<std::string, int64_t> onPath;
    for (const auto& path : c.paths)
      for (const auto& s : path)
        if (s.coll >= 0) onPath[collectiveClass(c.g.colls[s.coll])] += s.durNs;
    for (const auto& [cls, ns] : onPath)
      if (target.empty() || ns > onPath[target]) target = cls;
  }
  int matched = 0;
  for (const auto& coll : c.g.colls) matched += matchesClass(coll, target) ? 1 : 0;
  if (target.empty() || matched == 0) {
    out.notes.push_back("collective_busbw: no collective " +
                        (target.empty() ? std::string("on the critical path") : target));
    return;
  }
  const double busbw = *o.busbwGbps;
  WhatIfChange ch;
  ch.kind = WhatIfChangeKind::CollectiveBusbw;
  ch.collective = target;
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s at a bus bandwidth of %g GB/s (%d collectives)", target.c_str(), busbw, matched);
  ch.description = buf;
  WhatIfEdit edit;
  edit.transfer = [&c, target, busbw](int i, int64_t measured) {
    const auto& coll = c.g.colls[i];
    const double factor = busBandwidthFactor(coll.busOp, coll.groupSize);
    if (!matchesClass(coll, target) || coll.bytes <= 0 || factor <= 0) return measured;
    return static_cast<int64_t>(std::llround(static_cast<double>(coll.bytes) * factor / busbw));
  };
  replayChange(c, edit, measuredNs, ch);
  out.changes.push_back(std::move(ch));
}

// ---- the critical path listed ---------------------------------------------------------------------------------

// The median (by its mean window over the ranks) of the measured steps among `among`; of every measured step when
// none of `among` is measured.
int medianStep(const Context& c, const std::vector<int>& among) {
  std::vector<std::pair<double, int>> byTime;
  for (int step : c.steps) {
    if (!among.empty() && std::find(among.begin(), among.end(), step) == among.end()) continue;
    double sum = 0;
    int n = 0;
    for (const auto& s : c.breakdown->steps)
      if (s.step == step) {
        sum += static_cast<double>(s.endNs - s.beginNs);
        ++n;
      }
    if (n > 0) byTime.push_back({sum / n, step});
  }
  if (byTime.empty()) return among.empty() ? -1 : medianStep(c, {});
  std::sort(byTime.begin(), byTime.end());
  return byTime[(byTime.size() - 1) / 2].second;
}

// Where a path segment lies: replayed start (to cut it at the step's begin), measured start on the file's clock, and
// its lane's thread. Work: from the end of the lane's event before to the event; a transfer: from the arrival of the
// member it was measured on. Device lanes' times are moved back by the rank's clock shift.
struct Placed {
  int64_t replayedNs = 0, measuredNs = 0;
  int thread = -1;
};

Placed place(const Context& c, const WhatIfPathSegment& s) {
  Placed p;
  int lane = s.lane;
  if (s.coll >= 0) {
    const detail::WhatIfArrival& a = c.g.arrivals[c.base.lastMember[s.coll]];
    lane = a.lane;
    p.measuredNs = a.measuredNs;
    p.replayedNs = a.lane >= 0 ? c.base.time[a.lane][a.event] : a.measuredNs;
  } else {
    const detail::WhatIfEvent& before = c.g.lanes[lane].events[s.event - 1];
    p.measuredNs = std::max(before.t, before.tEnd);
    p.replayedNs = c.base.time[lane][s.event - 1];
  }
  if (lane >= 0) p.thread = c.g.lanes[lane].thread;
  auto shift = c.g.clockShiftNs.find(s.rank);
  if (shift != c.g.clockShiftNs.end()) p.measuredNs -= shift->second;
  return p;
}

void listPath(const Context& c, const std::vector<int>& among, WhatIfReport& out) {
  out.criticalStep = medianStep(c, among);
  if (out.criticalStep < 0) return;
  auto path = stepPath(c, c.base, out.criticalStep);
  std::reverse(path.begin(), path.end());
  const int64_t begin = stepBeginNs(c, c.base, out.criticalStep);
  for (const auto& s : path) {
    WhatIfSegment seg;
    seg.rank = s.rank;
    seg.durNs = s.durNs;
    const Placed at = place(c, s);
    seg.thread = at.thread;
    seg.startNs = at.measuredNs;
    if (at.replayedNs < begin) {  // the walk's last stretch crossed the step's begin (it ends after it): cut there
      const int64_t cut = begin - at.replayedNs;
      seg.durNs -= cut;
      seg.startNs += cut;
    }
    seg.endNs = seg.startNs + seg.durNs;
    if (s.coll >= 0) {
      seg.kind = "transfer";
      seg.what = c.g.colls[s.coll].group + " " + c.g.colls[s.coll].op;
    } else {
      seg.kind = "compute";
      if (c.g.device) seg.what = "stream " + std::to_string(c.g.lanes[s.lane].thread);
    }
    out.criticalPathNs += seg.durNs;
    WhatIfSegment* last = out.criticalPath.empty() ? nullptr : &out.criticalPath.back();
    if (last != nullptr && last->rank == seg.rank && last->thread == seg.thread && last->kind == seg.kind &&
        last->what == seg.what) {
      last->durNs += seg.durNs;
      last->endNs = std::max(last->endNs, seg.endNs);
      ++last->count;
    } else {
      out.criticalPath.push_back(std::move(seg));
    }
  }
}

tracedb::Status loadPipeline(tracedb::Reader& reader, Context& c) {
  auto p = analyzePipeline(reader);
  if (!p) return p.status();
  c.pipeline = std::move(*p);
  if (!c.pipeline.present) return {};
  for (const auto& s : c.pipeline.perStage)
    for (int r : s.ranks) c.stageOfRank[r] = s.stage;
  return {};
}

}  // namespace

const char* whatIfChangeName(WhatIfChangeKind kind) {
  switch (kind) {
    case WhatIfChangeKind::Straggler:
      return "straggler";
    case WhatIfChangeKind::StageImbalance:
      return "stage_imbalance";
    case WhatIfChangeKind::CommOverlapped:
      return "comm_overlapped";
    case WhatIfChangeKind::PipelineBubble:
      return "pipeline_bubble";
    case WhatIfChangeKind::CollectiveBusbw:
      return "collective_busbw";
  }
  return "unknown";
}

tracedb::Result<WhatIfReport> analyzeWhatIf(tracedb::Reader& reader, const WhatIfOptions& options) {
  auto breakdown = computeBreakdown(reader);
  if (!breakdown) return breakdown.status();
  auto info = loadRunInfo(reader);
  if (!info) return info.status();
  auto graph = detail::buildWhatIfGraph(reader, *breakdown, *info);
  if (!graph) return graph.status();
  Context c;
  c.breakdown = &*breakdown;
  c.g = std::move(*graph);
  c.steps = measuredSteps(*breakdown);
  if (auto st = loadPipeline(reader, c); !st) return st;
  c.base = detail::replay(c.g, {});
  for (int step : c.steps) c.paths.push_back(stepPath(c, c.base, step));
  c.baseSteps = stepTimesNs(c, &c.base.markNs);

  WhatIfReport out;
  out.steps = static_cast<int>(c.steps.size());
  out.firstStep = c.steps.empty() ? -1 : *c.steps.begin();
  out.device = c.g.device;
  out.measuredStepNs = vocabulary::medianOf(stepTimesNs(c, nullptr));
  out.replayedStepNs = vocabulary::medianOf(c.baseSteps);
  out.boundBlocks = c.g.boundBlocks;
  out.unboundBlocks = c.g.unboundBlocks;
  out.unboundRecords = c.g.unboundRecords;
  out.collectives = static_cast<int64_t>(c.g.colls.size());
  out.forced = c.base.forced;
  if (out.steps == 0) return out;
  addStraggler(c, out.measuredStepNs, out);
  if (c.pipeline.present) {
    if (auto st = addStageImbalance(reader, c, out.measuredStepNs, out); !st) return st;
  } else {
    out.notes.push_back("stage_imbalance, pipeline_bubble: the run has no pipeline stages");
  }
  addCommOverlapped(c, out.measuredStepNs, out);
  if (c.pipeline.present) addPipelineBubble(c, out.measuredStepNs, out);
  if (options.busbwGbps) addBusbw(c, options, out.measuredStepNs, out);
  listPath(c, options.pathSteps, out);
  return out;
}

namespace {
using Json = nlohmann::ordered_json;

double ms(double ns) {
  return std::round(ns / 1e3) / 1e3;
}  // ms with µs resolution
double pct(double part, double whole) {
  return whole > 0 ? std::round(1e4 * part / whole) / 100 : 0.0;
}
}  // namespace

std::string whatIfToJson(const WhatIfReport& r, const std::string& file, int indent) {
  Json changes = Json::array();
  for (const auto& ch : r.changes) {
    Json x{{"change", whatIfChangeName(ch.kind)},
           {"description", ch.description},
           {"predicted_step_ms", ms(ch.predictedStepNs)},
           {"saving_ms", ms(ch.savingNs)},
           {"saving_pct", pct(ch.savingNs, r.measuredStepNs)},
           {"ranks", ch.ranks},
           {"replayed", ch.replayed}};
    if (ch.rank >= 0) x["rank"] = ch.rank;
    if (ch.stage >= 0) x["stage"] = ch.stage;
    if (!ch.collective.empty()) x["collective"] = ch.collective;
    changes.push_back(std::move(x));
  }
  Json path = Json::array();
  for (const auto& s : r.criticalPath)
    path.push_back(Json{{"rank", s.rank},
                        {"kind", s.kind},
                        {"what", s.what},
                        {"ms", ms(s.durNs)},
                        {"segments", s.count},
                        {"thread", s.thread},
                        {"start_ns", s.startNs},
                        {"end_ns", s.endNs}});
  Json out{{"file", file},
           {"steps", r.steps},
           {"first_step", r.firstStep},
           {"lanes", r.device ? "device" : "host"},
           {"measured_step_ms", ms(r.measuredStepNs)},
           {"replayed_step_ms", ms(r.replayedStepNs)},
           {"replay_gap_pct", pct(r.replayedStepNs - r.measuredStepNs, r.measuredStepNs)},
           {"changes", changes},
           {"critical_step", r.criticalStep},
           {"critical_path", path},
           {"model", Json{{"collectives", r.collectives},
                          {"blocks_bound", r.boundBlocks},
                          {"blocks_unbound", r.unboundBlocks},
                          {"records_unbound", r.unboundRecords},
                          {"forced_releases", r.forced}}},
           {"notes", r.notes}};
  return out.dump(indent) + "\n";
}

std::string criticalPathSummary(const WhatIfReport& r) {
  if (r.criticalPath.empty()) return "";
  int64_t compute = 0, transfer = 0;
  for (const auto& s : r.criticalPath) (s.kind == "transfer" ? transfer : compute) += s.durNs;
  return "critical path of step " + std::to_string(r.criticalStep) + ": " + text::ms(static_cast<double>(r.criticalPathNs)) +
         " ms, compute " + text::ms(static_cast<double>(compute)) + " ms, transfer " +
         text::ms(static_cast<double>(transfer)) + " ms";
}

}  // namespace tpscope::analysis
