#include "tpscope/analysis/nonfinite.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <set>
#include <tuple>

#include "evidence_util.h"
#include "tpscope/analysis/collectives.h"
#include "tpscope/analysis/pipeline.h"
#include "tpscope/tracedb/query.h"
#include "tpscope/vocabulary/alert_kinds.h"
#include "tpscope/vocabulary/collective_ops.h"
#include "tpscope/vocabulary/nonfinite_order.h"

namespace tpscope::analysis {

using tracedb::Query;
using tracedb::Phase;

namespace {

// Orders candidate origins: step, time (events with a time first), higher layer, NaN before Inf, more elements,
// smaller rank.
bool earlier(const NonFiniteEvent& a, const NonFiniteEvent& b) {
  if (a.step != b.step) return a.step < b.step;
  if (a.tsNs.has_value() != b.tsNs.has_value()) return a.tsNs.has_value();
  if (a.tsNs && *a.tsNs != *b.tsNs) return *a.tsNs < *b.tsNs;
  if (a.layer != b.layer) return vocabulary::producedBefore(a.layer, b.layer);
  if (a.isNan() != b.isNan()) return a.isNan();
  const int64_t na = a.nanCount + a.infCount, nb = b.nanCount + b.infCount;
  if (na != nb) return na > nb;
  if (a.rank != b.rank) return a.rank < b.rank;
  return a.param < b.param;
}

std::string phaseFromAlert(const std::string& kind, const std::string& evidence) {
  const auto j = nlohmann::json::parse(evidence, nullptr, false);
  if (j.is_object()) {
    if (auto it = j.find("phase"); it != j.end() && it->is_string()) return it->get<std::string>();
  }
  if (kind.find("activation") != std::string::npos) return std::string(tracedb::phaseName(Phase::Forward));
  if (kind.find("grad") != std::string::npos) return std::string(tracedb::phaseName(Phase::Backward));
  return "";
}

int64_t jsonCount(const std::string& evidence, const char* key) {
  const auto j = nlohmann::json::parse(evidence, nullptr, false);
  if (j.is_object())
    if (auto it = j.find(key); it != j.end() && it->is_number_integer()) return it->get<int64_t>();
  return 0;
}

struct Coll {
  int rank;
  std::string group;
  int64_t seq;
  std::string op;
  int64_t enqueue, done;
  int step;
  Phase phase;
  int layer;
  std::string dtype;
};

// NaN and Inf travel only in floating-point payloads: an integer flag (the health policy's skip/stop vote) or a
// payload-free barrier carries nothing. An unknown dtype (imported traces) is assumed to carry data.
bool carriesValues(const Coll& c) {
  const std::string& d = c.dtype;
  if (d.empty() || d == "other") return true;
  return d.starts_with("float") || d.starts_with("bfloat") || d == "half" || d == "double" || d.starts_with("complex");
}

// The evidence a carrier leaves on a receiver in the same step. A forward or backward collective of a
// tensor-parallel (non-DP) group carries activations or activation gradients: every later activation and gradient
// of the receiver turns non-finite, so its own gradient or activation records must show it. A DP gradient bucket or
// an optimizer-phase collective (clip norm, loss mean, replica check) carries reduced gradients or scalars, which
// the receiver's pre-reduction gradient records never see: only its step statistics (global norm, loss) or a later
// step can show them — except where the parameters are sharded over that group's mesh dimension (FSDP2: `shardDims`,
// RunInfo::gradShardDims): there a backward reduce-scatter (or all-reduce) writes the very shard the rank's gradient
// rows are taken from, so those rows show it; its backward all-gathers carry parameters, finite until the update.
// Phase::None (unknown) is consistent with either.
bool consistentCarrier(const Coll& c, const NonFiniteEvent& receiverFirst, const std::set<std::string>& shardDims) {
  if (receiverFirst.step > c.step) return true;  // the value is in the receiver's state from then on
  const std::string cls = groupClass(c.group);
  const bool activationCarrier = (c.phase == Phase::Forward || c.phase == Phase::Backward) && cls != "dp";
  const bool stateCarrier = c.phase != Phase::Forward && !activationCarrier;
  const bool receiverInPass = receiverFirst.source != "step_stats";
  if (c.phase == Phase::None) return true;
  if (receiverInPass && c.phase == Phase::Backward && shardDims.count(cls) &&
      (vocabulary::namesOp(c.op, vocabulary::CollectiveOp::ReduceScatter) ||
       vocabulary::namesOp(c.op, vocabulary::CollectiveOp::AllReduce)) &&
      receiverFirst.phase == tracedb::phaseName(Phase::Backward))
    return true;  // a gradient reduce-scattered into the shard its rows read
  return receiverInPass ? activationCarrier : stateCarrier;
}

// 1. Non-finite values in the per-parameter gradient statistics (backward, before any reduction).
tracedb::Status readGradEvents(tracedb::Reader& reader, std::vector<NonFiniteEvent>& events) {
  Query q(reader,
          "SELECT g.rank, g.step, s.value, g.layer, g.nan_count, g.inf_count, g.numel FROM grad_stats g"
          " LEFT JOIN strings s ON s.id = g.param WHERE g.nan_count > 0 OR g.inf_count > 0",
          "table 'grad_stats'");
  return q.each([&](Query& r) {
    NonFiniteEvent e;
    e.source = "grad_stats";
    e.rank = r.i32(0);
    e.step = r.i32(1);
    e.param = r.text(2);
    e.layer = r.i32(3);
    e.phase = tracedb::phaseName(Phase::Backward);
    e.nanCount = r.i64(4);
    e.infCount = r.i64(5);
    e.numel = r.i64(6);
    events.push_back(std::move(e));
  });
}

// A gradient's non-finite counts as grad_stats holds them, by (rank, step, param): the one source of those counts (a
// nonfinite_grad alert's evidence repeats them for the live log).
struct GradCounts {
  int64_t nan, inf, numel;
};
using GradCountsByParam = std::map<std::tuple<int, int, std::string>, GradCounts>;

GradCountsByParam gradCounts(const std::vector<NonFiniteEvent>& gradEvents) {
  GradCountsByParam out;
  for (const NonFiniteEvent& e : gradEvents)
    out.try_emplace({e.rank, e.step, e.param}, GradCounts{e.nanCount, e.infCount, e.numel});
  return out;
}

// 2. The live rules' non-finite alerts (activations with the time the output was produced; gradients).
// `pipeline`: the run is pipeline-parallel, so an activation alert's micro-batch says where the value was born.
// A gradient alert's counts are its gradient's in grad_stats (`grads`); the evidence's only where grad_stats has no
// row of that gradient (an activation's, a run recorded without gradient statistics).
tracedb::Status readAlertEvents(tracedb::Reader& reader, std::vector<NonFiniteEvent>& events, bool pipeline,
                                const GradCountsByParam& grads) {
  const std::string sql = "SELECT rank, step, layer, param, ts_ns, kind, evidence FROM alerts WHERE kind LIKE '" +
                          std::string(vocabulary::alert_kinds::kNonfinitePrefix) +
                          "%' OR kind LIKE 'nan%' OR kind LIKE 'inf%'";
  Query q(reader, sql, "table 'alerts'");
  return q.each([&](Query& r) {
    NonFiniteEvent e;
    e.source = "alerts";
    e.rank = r.i32(0);
    e.step = r.i32(1);
    e.layer = r.i32(2);
    e.param = r.text(3);
    const std::string kind = r.text(5), evidence = r.text(6);
    e.phase = phaseFromAlert(kind, evidence);
    // An activation alert carries the time the output was produced; a gradient alert the time the rule checked
    // (after the reductions): only a bound on when the rank held it, not the moment it was born.
    if (e.phase == tracedb::phaseName(Phase::Backward))
      e.boundNs = r.i64(4);
    else
      e.tsNs = r.i64(4);
    if (pipeline && e.tsNs) {
      const auto j = nlohmann::json::parse(evidence, nullptr, false);
      if (j.is_object())
        if (auto it = j.find("micro_batch"); it != j.end() && it->is_number_integer()) e.microbatch = it->get<int>();
    }
    const auto grad = e.phase == tracedb::phaseName(Phase::Backward) ? grads.find({e.rank, e.step, e.param})
                                                                      : grads.end();
    if (grad != grads.end()) {
      e.nanCount = grad->second.nan;
      e.infCount = grad->second.inf;
      e.numel = grad->second.numel;
    } else {
      e.nanCount = jsonCount(evidence, "nan_count");
      e.infCount = jsonCount(evidence, "inf_count");
      e.numel = jsonCount(evidence, "numel");
    }
    if (e.nanCount == 0 && e.infCount == 0) {
      const bool infKind = kind.find("inf") != std::string::npos &&
                           kind.find(vocabulary::alert_kinds::kNonfinitePrefix) == std::string::npos;
      if (infKind)
        e.infCount = 1;
      else
        e.nanCount = 1;
    }
    if (e.step >= 0) events.push_back(std::move(e));
  });
}

// 3. Non-finite step statistics (loss, global grad norm), and each rank's step windows: the latest time a record of
// that step can stand for (the bound of a receiver's evidence in the spread below).
tracedb::Status readStepStatEvents(tracedb::Reader& reader, std::vector<NonFiniteEvent>& events,
                                   std::map<std::pair<int, int>, int64_t>& stepEnd, std::set<int>& recordedSteps) {
  // SQLite stores NaN as NULL. A NULL loss or grad_norm is a NaN where the rank records that column at other steps
  // (tpscope-train always does); ±Inf is stored as it is. Per column: 2 ±Inf, 1 NULL, 0 otherwise.
  struct Row {
    int rank, step;
    std::optional<int64_t> endNs;
    int loss, norm;
  };
  std::vector<Row> rows;
  std::map<int, std::pair<bool, bool>> has;  // rank → records a loss, a grad_norm at some step
  // One plain scan, the ranks' columns judged here: a GROUP BY joined back searched the primary key once per row.
  Query q(reader,
          "SELECT rank, step, end_ns,"
          " CASE WHEN abs(loss) > 1.7976931348623157e308 THEN 2 WHEN loss IS NULL THEN 1 ELSE 0 END,"
          " CASE WHEN abs(grad_norm) > 1.7976931348623157e308 THEN 2 WHEN grad_norm IS NULL THEN 1 ELSE 0 END"
          " FROM step_stats",
          "table 'step_stats'");
  auto s = q.each([&](Query& r) {
    const Row row{r.i32(0), r.i32(1), r.optI64(2), r.i32(3), r.i32(4)};
    auto& [loss, norm] = has[row.rank];
    loss = loss || row.loss != 1;
    norm = norm || row.norm != 1;
    rows.push_back(row);
  });
  if (!s) return s;
  // In (rank, step) order, the order the events came in before (through the primary key).
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::tie(a.rank, a.step) < std::tie(b.rank, b.step);
  });
  for (const Row& row : rows) {
    recordedSteps.insert(row.step);
    if (row.endNs) stepEnd[{row.rank, row.step}] = *row.endNs;
    const auto [hasLoss, hasNorm] = has.at(row.rank);
    const int loss = row.loss == 1 && !hasLoss ? 0 : row.loss;
    const int norm = row.norm == 1 && !hasNorm ? 0 : row.norm;
    if (loss == 0 && norm == 0) continue;
    NonFiniteEvent e;
    e.source = "step_stats";
    e.rank = row.rank;
    e.step = row.step;
    e.param = norm != 0 ? "grad_norm" : "loss";
    ((norm != 0 ? norm : loss) == 1 ? e.nanCount : e.infCount) = 1;
    if (row.endNs) e.boundNs = *row.endNs;
    events.push_back(std::move(e));
  }
  return tracedb::Status::ok();
}

// The origin among the sorted events: the earliest event of the earliest step. A NaN at the same step beats an Inf.
NonFiniteEvent pickOrigin(const std::vector<NonFiniteEvent>& events) {
  NonFiniteEvent origin = events.front();
  for (const auto& e : events) {
    if (e.step != origin.step) break;
    if (e.isNan() && !origin.isNan() && !origin.tsNs) {
      origin = e;
      break;
    }
  }
  return origin;
}

// History of the origin's parameter on its rank: its last finite norm and the median of up to 20 before it.
tracedb::Status addOriginHistory(tracedb::Reader& reader, NonFiniteEvent& origin) {
  if (origin.source != "grad_stats") return tracedb::Status::ok();
  const auto id = reader.stringId(origin.param);
  if (!id) return tracedb::Status::ok();
  Query q(reader,
          "SELECT l2_norm FROM grad_stats WHERE rank = ? AND param = ? AND step < ? AND nan_count = 0 AND"
          " inf_count = 0 ORDER BY step DESC LIMIT 20",
          "table 'grad_stats'");
  q.bind(1, int64_t{origin.rank}).bind(2, int64_t{*id}).bind(3, int64_t{origin.step});
  std::vector<double> hist;
  auto s = q.each([&](Query& r) { hist.push_back(r.f64(0)); });
  if (!s) return s;
  if (!hist.empty()) {
    origin.prevNorm = hist.front();
    std::vector<double> sorted = hist;
    std::nth_element(sorted.begin(), sorted.begin() + static_cast<long>(sorted.size() / 2), sorted.end());
    origin.medianNorm = sorted[sorted.size() / 2];
  }
  return tracedb::Status::ok();
}

// The collectives of the origin step and the next one (the spread's candidates), by enqueue time.
tracedb::Status readCollectives(tracedb::Reader& reader, int step, std::vector<Coll>& colls) {
  Query q(reader,
          "SELECT rank, group_name, seq, op, enqueue_ns, coalesce(end_ns, start_ns, enqueue_ns), step, phase, layer,"
          " coalesce(dtype, '') FROM collectives WHERE step BETWEEN ? AND ? ORDER BY enqueue_ns",
          "table 'collectives'");
  q.bind(1, int64_t{step}).bind(2, int64_t{step} + 1);
  return q.each([&](Query& r) {
    colls.push_back(Coll{r.i32(0), r.text(1), r.i64(2), r.text(3), r.i64(4), r.i64(5), r.i32(6),
                         static_cast<Phase>(r.i32(7)), r.i32(8), r.text(9)});
  });
}

// The origin time: the alert's time; else, for gradients, the first backward collective of the origin rank at the
// origin layer or below (backward reaches that layer then); else the first collective of the step. INT64_MAX: none.
int64_t originTime(const NonFiniteEvent& origin, const std::vector<Coll>& colls) {
  if (origin.tsNs) return *origin.tsNs;
  auto firstOf = [&](auto&& pred) -> const Coll* {
    for (const Coll& c : colls)
      if (c.rank == origin.rank && c.step == origin.step && pred(c)) return &c;
    return nullptr;
  };
  const bool bwd = origin.phase == tracedb::phaseName(Phase::Backward);
  const Coll* pick = firstOf([&](const Coll& c) {
    return bwd && c.phase == Phase::Backward && (origin.layer < 0 || c.layer <= origin.layer);
  });
  if (!pick) pick = firstOf([&](const Coll& c) { return !bwd || c.phase == Phase::Backward; });
  if (!pick) pick = firstOf([](const Coll&) { return true; });
  return pick ? pick->enqueue : INT64_MAX;
}

struct Arrival {
  int64_t t = INT64_MAX;
  const Coll* via = nullptr;
  int from = -1;
};

// Causal search (earliest arrival over (rank, time)). A rank r reached at time t passes the value on through a
// collective c of its own if: r entered c at or after t; c's payload can carry it (carriesValues); and for each
// other member m: m's own records show a non-finite value (a rank that never does is not in the path), no later
// than c completed (m's first record's bound, within the two ranks' clock uncertainty), of a kind that such a
// carrier leaves (consistentCarrier). Each receiver keeps its earliest carrier.
std::map<int, Arrival> searchSpread(const NonFiniteEvent& origin, int64_t t0, const std::vector<Coll>& colls,
                                    const std::map<int, NonFiniteEvent>& first, const RunInfo& info) {
  std::map<std::pair<std::string, int64_t>, std::vector<const Coll*>> bySeq;
  std::map<int, std::vector<const Coll*>> byRank;  // each rank's own records, in `colls` order
  for (const Coll& c : colls) {
    bySeq[{c.group, c.seq}].push_back(&c);
    byRank[c.rank].push_back(&c);
  }
  std::map<int, int64_t> slack;  // clock uncertainty per rank (merged files are aligned within it)
  for (const auto& ri : info.ranks) slack[ri.rank] = ri.clockUncertaintyNs;
  std::map<int, Arrival> reached;
  reached[origin.rank] = Arrival{t0, nullptr, -1};
  using Item = std::pair<int64_t, int>;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> frontier;
  if (t0 != INT64_MAX) frontier.emplace(t0, origin.rank);
  while (!frontier.empty()) {
    auto [t, r] = frontier.top();
    frontier.pop();
    if (reached[r].t < t) continue;
    for (const Coll* own : byRank[r]) {
      const Coll& c = *own;
      if (c.enqueue < t || !carriesValues(c)) continue;
      for (const Coll* m : bySeq[{c.group, c.seq}]) {
        auto fe = first.find(m->rank);
        if (m->rank == r || fe == first.end() || fe->second.step < c.step) continue;
        const NonFiniteEvent& seen = fe->second;
        const int64_t done = m->done;  // the receiver holds the result when its own copy of the collective ends
        if (seen.boundNs && done > *seen.boundNs + slack[r] + slack[m->rank]) continue;
        if (!consistentCarrier(c, seen, info.gradShardDims)) continue;
        Arrival& a = reached[m->rank];
        if (done < a.t) {
          a = Arrival{done, &c, r};
          frontier.emplace(done, m->rank);
        }
      }
    }
  }
  return reached;
}

// The hops, one per carrier, in time order; the affected ranks the search reached (receivers) and those it did not.
void recordSpread(std::map<int, Arrival>& reached, const std::map<int, NonFiniteEvent>& first, int originRank,
                  NonFiniteReport& out) {
  std::map<std::tuple<int64_t, std::string, int64_t>, SpreadHop> hops;
  for (const auto& [rank, a] : reached) {
    if (a.via == nullptr) continue;
    SpreadHop& hop = hops[{a.t, a.via->group, a.via->seq}];
    hop.collective = CollectiveRef{a.via->group, a.via->seq, a.via->op};
    hop.step = a.via->step;
    hop.fromRank = a.from;
    hop.toRanks.push_back(rank);
  }
  for (auto& [key, hop] : hops) out.spread.push_back(std::move(hop));
  for (const auto& [rank, e] : first) {
    if (rank == originRank) continue;
    if (reached.count(rank) && reached[rank].via != nullptr) out.receivers.push_back(rank);
    else out.unexplained.push_back(rank);
  }
}

// One incident: its events (sorted by `earlier`), their origin and the spread from it.
tracedb::Result<NonFiniteReport> analyzeIncident(tracedb::Reader& reader, const RunInfo& info,
                                                 const std::vector<NonFiniteEvent>& events) {
  NonFiniteReport out;
  // Grad stats beat step stats at equal position: the step_stats event carries no layer and sorts last anyway.
  std::map<int, NonFiniteEvent> first;
  for (const auto& e : events) first.try_emplace(e.rank, e);
  for (auto& [r, e] : first) out.firstPerRank.push_back(e);
  NonFiniteEvent origin = pickOrigin(events);
  if (auto s = addOriginHistory(reader, origin); !s) return s;
  out.origin = origin;

  // Spread: collectives of the origin step and the next one.
  std::vector<Coll> colls;
  if (auto s = readCollectives(reader, origin.step, colls); !s) return s;
  auto reached = searchSpread(origin, originTime(origin, colls), colls, first, info);
  recordSpread(reached, first, origin.rank, out);
  return out;
}

}  // namespace

tracedb::Result<NonFiniteReport> analyzeNonFinite(tracedb::Reader& reader, const RunInfo& info) {
  std::vector<NonFiniteEvent> events;
  std::map<std::pair<int, int>, int64_t> stepEnd;
  std::set<int> recordedSteps;  // steps some rank recorded step statistics for
  if (auto s = readGradEvents(reader, events); !s) return s;
  if (auto s = readAlertEvents(reader, events, pipelineStages(reader) > 1, gradCounts(events)); !s) return s;
  if (auto s = readStepStatEvents(reader, events, stepEnd, recordedSteps); !s) return s;
  for (NonFiniteEvent& e : events) {
    if (e.tsNs)
      e.boundNs = e.tsNs;
    else if (!e.boundNs)
      if (auto it = stepEnd.find({e.rank, e.step}); it != stepEnd.end()) e.boundNs = it->second;
  }
  if (events.empty()) return NonFiniteReport{};
  std::sort(events.begin(), events.end(), earlier);

  // Incidents: a recorded step with no non-finite record on any rank between two that have some (the policy skipped
  // the step, so the state stayed finite) ends one; the next non-finite value is born anew, not spread.
  std::vector<std::pair<int, std::vector<NonFiniteEvent>>> incidents;  // (the clean step before it, its events)
  for (NonFiniteEvent& e : events) {
    if (!incidents.empty()) {
      const int last = incidents.back().second.back().step;
      const auto clean = recordedSteps.upper_bound(last);
      if (clean == recordedSteps.end() || *clean >= e.step) {
        incidents.back().second.push_back(std::move(e));
        continue;
      }
      incidents.emplace_back(*std::prev(recordedSteps.lower_bound(e.step)), std::vector<NonFiniteEvent>{});
    } else {
      incidents.emplace_back(-1, std::vector<NonFiniteEvent>{});
    }
    incidents.back().second.push_back(std::move(e));
  }
  auto out = analyzeIncident(reader, info, incidents.front().second);
  if (!out) return out;
  for (size_t i = 1; i < incidents.size(); ++i) {
    auto later = analyzeIncident(reader, info, incidents[i].second);
    if (!later) return later;
    later->afterCleanStep = incidents[i].first;
    out->later.push_back(std::move(*later));
  }
  return out;
}

namespace {
using detail::field;

using detail::threeDigits;

// One incident's findings: its origin (critical), with the spread; a rank the spread does not explain (error).
// `next`: the next incident, whose value was born anew (its consequences are not this one's), or null.
void incidentFindings(const NonFiniteReport& report, const RunInfo& info, const NonFiniteReport* next,
                      std::vector<Finding>& out) {
  if (!report.origin) return;
  const NonFiniteEvent& o = *report.origin;
  Finding fd;
  fd.kind = o.isNan() ? FindingKind::NanOrigin : FindingKind::InfOrigin;
  fd.severity = Severity::Critical;
  fd.rank = o.rank;
  fd.step = o.step;
  fd.layer = o.layer;
  fd.ranks = report.receivers;
  std::string where = "rank " + std::to_string(o.rank);
  if (auto d = info.describeRank(o.rank); !d.empty()) where += " (" + d + ")";
  where += " step " + std::to_string(o.step);
  if (o.layer >= 0) where += " layer " + std::to_string(o.layer);
  if (!o.param.empty()) where += " " + o.param;
  if (o.source == "grad_stats") where += " grad";
  else if (!o.phase.empty()) where += " (" + o.phase + ")";
  if (o.microbatch >= 0) where += " of micro-batch " + std::to_string(o.microbatch);
  fd.message = std::string("first ") + (o.isNan() ? "NaN" : "Inf") +
               (report.afterCleanStep >= 0
                    ? " since step " + std::to_string(report.afterCleanStep) + " (finite on every rank): " + where
                    : ": " + where);
  std::string line = "first non-finite value: ";
  if (o.nanCount > 0) line += std::to_string(o.nanCount) + " NaN";
  if (o.nanCount > 0 && o.infCount > 0) line += " and ";
  if (o.infCount > 0) line += std::to_string(o.infCount) + " Inf";
  if (o.numel > 0) line += " in " + std::to_string(o.numel) + " elements";
  line += " (" + o.source + ")";
  if (o.prevNorm) {
    line += "; rank " + std::to_string(o.rank) + "'s grad norm was " + threeDigits(*o.prevNorm) + " the step before";
    if (o.medianNorm) line += " (median " + threeDigits(*o.medianNorm) + ")";
  }
  fd.details.push_back(line);
  if (!report.spread.empty()) {
    std::string sp = "spread:";
    for (size_t i = 0; i < report.spread.size(); ++i) {
      const SpreadHop& h = report.spread[i];
      sp += (i ? ";" : "") + std::string(" step ") + std::to_string(h.step) + " " + h.collective.op + " group " +
            h.collective.group + " seq " + std::to_string(h.collective.seq) + " from rank " +
            std::to_string(h.fromRank) + " → " + rankList(h.toRanks);
    }
    fd.details.push_back(sp);
    fd.collective = report.spread.front().collective;
  }
  if (!report.receivers.empty())
    fd.details.push_back(rankList(report.receivers) + " only received it through collectives");
  if (!report.unexplained.empty())
    fd.details.push_back(rankList(report.unexplained) +
                         " also show non-finite values that no collective of the origin explains (a second origin?)");
  if (o.source == "grad_stats")
    fd.cite("grad_stats", {field("rank", int64_t{o.rank}), field("step", int64_t{o.step}), field("param", o.param)});
  else if (o.source == "alerts")
    // The alert row's time: a backward alert's is kept as the bound (readAlertEvents), not as tsNs.
    fd.cite("alerts", {field("rank", int64_t{o.rank}), field("step", int64_t{o.step}),
                       field("ts_ns", o.tsNs.value_or(o.boundNs.value_or(-1)))});
  else
    fd.cite("step_stats", {field("rank", int64_t{o.rank}), field("step", int64_t{o.step})});
  for (const SpreadHop& h : report.spread)
    fd.cite("collectives", {field("rank", int64_t{h.fromRank}), field("group_name", h.collective.group),
                            field("seq", h.collective.seq)});
  for (const NonFiniteEvent& e : report.firstPerRank) {
    if (e.rank == o.rank) continue;
    if (e.source == "grad_stats")
      fd.cite("grad_stats", {field("rank", int64_t{e.rank}), field("step", int64_t{e.step}), field("param", e.param)});
  }
  fd.number("nan_count", o.nanCount);
  fd.number("inf_count", o.infCount);
  fd.number("numel", o.numel);
  if (o.prevNorm) fd.number("prev_l2_norm", *o.prevNorm);
  if (o.medianNorm) fd.number("median_l2_norm", *o.medianNorm);
  fd.number("affected_ranks", static_cast<int64_t>(report.firstPerRank.size()));
  if (o.microbatch >= 0) fd.number("microbatch", int64_t{o.microbatch});
  if (report.afterCleanStep >= 0) {
    fd.details.push_back("step " + std::to_string(report.afterCleanStep) +
                         " was recorded finite on every rank after the last non-finite one: this value was born anew, "
                         "not spread");
    fd.number("after_clean_step", int64_t{report.afterCleanStep});
  }
  if (next != nullptr && next->origin) {
    fd.number("next_origin_step", int64_t{next->origin->step});
    fd.number("incident_last_step", int64_t{next->afterCleanStep - 1});  // the steps it held the value
  }
  out.push_back(std::move(fd));
  // A second origin: affected ranks the spread path does not explain, each its own finding.
  for (const NonFiniteEvent& e : report.firstPerRank) {
    if (std::find(report.unexplained.begin(), report.unexplained.end(), e.rank) == report.unexplained.end()) continue;
    Finding s;
    s.kind = e.isNan() ? FindingKind::NanOrigin : FindingKind::InfOrigin;
    s.severity = Severity::Error;
    s.rank = e.rank;
    s.step = e.step;
    s.layer = e.layer;
    s.message = std::string("non-finite value on rank ") + std::to_string(e.rank) + " step " + std::to_string(e.step) +
                (e.param.empty() ? "" : " " + e.param) + " not explained by the spread from rank " +
                std::to_string(o.rank);
    if (e.source == "grad_stats")
      s.cite("grad_stats", {field("rank", int64_t{e.rank}), field("step", int64_t{e.step}), field("param", e.param)});
    s.number("nan_count", e.nanCount);
    s.number("inf_count", e.infCount);
    out.push_back(std::move(s));
  }
}

}  // namespace

const NonFiniteReport* incidentAt(const NonFiniteReport* report, int rank, int step) {
  if (report == nullptr) return nullptr;
  auto isIt = [&](const NonFiniteReport& r) { return r.origin && r.origin->rank == rank && r.origin->step == step; };
  if (isIt(*report)) return report;
  for (const auto& later : report->later)
    if (isIt(later)) return &later;
  return nullptr;
}

std::vector<Finding> nonFiniteFindings(const NonFiniteReport& report, const RunInfo& info) {
  std::vector<Finding> out;
  for (size_t i = 0; i <= report.later.size(); ++i) {
    const NonFiniteReport& r = i == 0 ? report : report.later[i - 1];
    incidentFindings(r, info, i < report.later.size() ? &report.later[i] : nullptr, out);
  }
  return out;
}

}  // namespace tpscope::analysis
