#include "tpscope/analysis/collectives.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <set>
#include <unordered_map>

#include "analysis_internal.h"
#include "tpscope/vocabulary/collective_ops.h"

namespace tpscope::analysis {

using vocabulary::CollectiveOp;

std::string canonicalOpName(std::string_view op) {
  if (const auto known = vocabulary::canonicalOp(op); known != CollectiveOp::Unknown)
    return std::string(vocabulary::opName(known));
  std::string s;  // an op the catalogue does not know: its bare name, lower-cased, grouped as it is
  for (char c : op.substr(op.rfind(':') + 1)) s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  while (!s.empty() && s.front() == '_') s.erase(0, 1);
  while (!s.empty() && s.back() == '_') s.pop_back();
  return s;
}

double busBandwidthFactor(std::string_view op, int n) {
  if (n < 1) return 0;
  const double nn = n;
  switch (vocabulary::canonicalOp(op)) {
    case CollectiveOp::AllReduce: return 2.0 * (nn - 1) / nn;
    // nccl-tests: every rank sends or receives (n−1)/n of the message.
    case CollectiveOp::AllGather:
    case CollectiveOp::ReduceScatter:
    case CollectiveOp::AllToAll:
    case CollectiveOp::Gather:
    case CollectiveOp::Scatter: return (nn - 1) / nn;
    case CollectiveOp::Barrier: return 0;
    default: break;
  }
  return 1;  // broadcast, reduce, send, recv, send_recv: the whole message crosses one link
}

namespace {

struct Record {
  int rank;
  int64_t bytes;
  int64_t numel;
  int64_t enqueue;
  std::optional<int64_t> start, end;
  int step;
};

int64_t elementSize(const std::string& dtype) {
  if (dtype == "float64" || dtype == "double" || dtype == "int64" || dtype == "long") return 8;
  if (dtype == "float16" || dtype == "half" || dtype == "bfloat16" || dtype == "int16") return 2;
  if (dtype == "int8" || dtype == "uint8" || dtype == "bool") return 1;
  return 4;
}

struct GroupOpAccum {
  CollectiveStats stats;
  int64_t skewSum = 0;
  int64_t skewCount = 0;
  std::set<int> steps;
  // TP model inputs
  int64_t modelSized = 0;
  int64_t modelSizedBytes = 0;
  std::map<int64_t, int64_t> sizeHistogram;  // bytes → count
  std::string dtype;
};

// What the pass over the collectives accumulates: per (group, op), per rank, per collective.
struct Accumulation {
  std::map<std::pair<std::string, std::string>, GroupOpAccum> accums;  // (group, op)
  std::unordered_map<int, RankStraggling> straggling;
  std::map<std::pair<int, std::string>, GroupStraggling> byGroup;  // (rank, group)
  std::unordered_map<int, double> waitVariance;  // σ²_r of the significance test
  std::unordered_map<int, std::map<int, double>> stepExcess;  // rank → step → Σ (caused waiting − its chance share)
  std::set<int> allSteps;
  std::vector<CollectiveArrival> arrivals;
  int64_t decided = 0, undecided = 0;
};

// One collective: the ranks' records of one (group, seq).
struct OneCollective {
  std::string group, op, dtype;
  int64_t seq = 0;
  std::vector<Record> recs;
};

// Who arrived last and who waited for whom, when the arrival skew exceeds the two ranks' clock uncertainty (else
// undecided). Every member gets a straggling entry either way; fills the collective's arrival when decided.
void attributeWaiting(const std::vector<Record>& recs, int64_t maxArr, int lastRank, int64_t skew, int64_t clock,
                      Accumulation& a, CollectiveArrival& arrival) {
  auto inGroup = [&](int rank) -> GroupStraggling& {
    GroupStraggling& g = a.byGroup[{rank, arrival.group}];
    g.group = arrival.group;
    return g;
  };
  for (const Record& r : recs) a.straggling[r.rank].rank = r.rank;
  if (skew <= clock) {
    ++a.undecided;
    return;
  }
  int64_t totalWait = 0;
  for (const Record& r : recs) {
    RankStraggling& rs = a.straggling[r.rank];
    ++rs.collectives;
    const int64_t w = maxArr - r.enqueue;
    rs.waitedNs += w;
    totalWait += w;
  }
  const double w = static_cast<double>(totalWait), pLast = 1.0 / static_cast<double>(recs.size());
  for (const Record& r : recs) {
    a.straggling[r.rank].expectedWaitNs += w * pLast;
    GroupStraggling& g = inGroup(r.rank);
    ++g.collectives;
    g.expectedWaitNs += w * pLast;
    a.waitVariance[r.rank] += w * w * pLast * (1 - pLast);
    a.stepExcess[r.rank][arrival.step] += (r.rank == lastRank ? w : 0.0) - w * pLast;
  }
  RankStraggling& last = a.straggling[lastRank];
  ++last.lastCount;
  last.causedWaitNs += totalWait;
  last.lagNs += totalWait / static_cast<int64_t>(recs.size() - 1);
  for (const Record& r : recs)
    if (r.rank != lastRank) a.straggling[r.rank].waitedOn[lastRank] += maxArr - r.enqueue;
  GroupStraggling& g = inGroup(lastRank);
  ++g.lastCount;
  g.causedWaitNs += totalWait;
  g.worst.emplace_back(arrival.seq, totalWait);
  std::sort(g.worst.begin(), g.worst.end(), [](const auto& x, const auto& y) {
    return x.second != y.second ? x.second > y.second : x.first < y.first;
  });
  if (g.worst.size() > 4) g.worst.pop_back();
  arrival.lastRank = lastRank;
  arrival.totalWaitNs = totalWait;
  ++a.decided;
}

// Adds one collective to its (group, op) statistics and to the straggler accounting.
void accumulate(const OneCollective& c, const RunInfo& info, const std::unordered_map<int, int64_t>& uncertainty,
                int64_t modelElements, Accumulation& a) {
  const std::vector<Record>& recs = c.recs;
  const tracedb::GroupInfo* g = info.group(c.group);
  const int n = g && !g->ranks.empty() ? static_cast<int>(g->ranks.size()) : static_cast<int>(recs.size());
  GroupOpAccum& acc = a.accums[{c.group, c.op}];
  acc.stats.group = c.group;
  acc.stats.op = c.op;
  acc.stats.groupSize = n;
  if (acc.dtype.empty()) acc.dtype = c.dtype;

  int64_t maxBytes = 0, maxNumel = 0;
  int64_t minArr = INT64_MAX, maxArr = INT64_MIN;
  int lastRank = -1, firstRank = -1;
  int64_t minDur = INT64_MAX, sumDur = 0, completed = 0;
  int step = -1;
  for (const Record& r : recs) {
    maxBytes = std::max(maxBytes, r.bytes);
    maxNumel = std::max(maxNumel, r.numel);
    if (r.enqueue > maxArr || (r.enqueue == maxArr && r.rank < lastRank)) {
      maxArr = r.enqueue;
      lastRank = r.rank;
    }
    if (r.enqueue < minArr) {
      minArr = r.enqueue;
      firstRank = r.rank;
    }
    if (r.end) {
      const int64_t d = std::max<int64_t>(0, *r.end - r.start.value_or(r.enqueue));
      minDur = std::min(minDur, d);
      sumDur += d;
      ++completed;
    }
    if (r.step >= 0) step = r.step;
  }
  if (step >= 0) {
    acc.steps.insert(step);
    a.allSteps.insert(step);
  }
  const int64_t skew = maxArr - minArr;
  CollectiveArrival arrival{c.group, c.seq, c.op, step, -1, skew, 0, completed ? minDur : 0};
  // A pipeline message (group "p2p-<src>-<dst>") whose send is posted after its receive is the schedule's
  // dependency, measured by the pipeline analysis (pipeline.h), not a rank arriving late at a collective. So is the
  // order of arrival in a group that spans stages (the stages' loss and norm all-reduce after the flush: the stage
  // that runs the last backward pass, stage 0 in GPipe and 1F1B, arrives last; its balance is stage_imbalance).
  const bool schedule = isPointToPointGroup(c.group) || info.spansStages(c.group);
  if (recs.size() >= 2 && !schedule) {
    auto clockOf = [&](int rank) {
      auto it = uncertainty.find(rank);
      return it == uncertainty.end() ? int64_t{0} : it->second;
    };
    attributeWaiting(recs, maxArr, lastRank, skew, clockOf(firstRank) + clockOf(lastRank), a, arrival);
  }
  a.arrivals.push_back(arrival);

  if (completed == 0) {
    ++acc.stats.incomplete;
    return;
  }
  const bool gather = vocabulary::namesOp(c.op, CollectiveOp::AllGather);
  const int64_t size = gather ? maxBytes * n : maxBytes;
  CollectiveStats& st = acc.stats;
  if (st.count == 0 || minDur < st.minLatencyNs) st.minLatencyNs = minDur;
  st.maxLatencyNs = std::max(st.maxLatencyNs, minDur);
  ++st.count;
  st.bytes += size;
  st.totalNs += sumDur / completed;
  st.latencyNs += minDur;
  st.maxSkewNs = std::max(st.maxSkewNs, skew);
  acc.skewSum += skew;
  ++acc.skewCount;
  if (modelElements > 0 && (gather ? maxNumel * n : maxNumel) == modelElements) {
    ++acc.modelSized;
    acc.modelSizedBytes += size;
  }
  ++acc.sizeHistogram[maxBytes];
}

// Per (group, op): steps, mean skew, algorithm and bus bandwidth.
std::vector<CollectiveStats> finishStats(Accumulation& a, const RunInfo& info) {
  std::vector<CollectiveStats> out;
  for (auto& [key, acc] : a.accums) {
    CollectiveStats& st = acc.stats;
    st.steps = static_cast<int64_t>(acc.steps.size());
    st.meanSkewNs = acc.skewCount ? acc.skewSum / acc.skewCount : 0;
    st.algbwGbps = st.latencyNs > 0 ? static_cast<double>(st.bytes) / static_cast<double>(st.latencyNs) : 0.0;
    // An emulated op moved what its underlying op moves (a reduce-scatter done as an all-reduce: 2(n−1)/n, not
    // (n−1)/n, of the message per rank).
    if (auto it = info.emulatedOps.find(canonicalOpName(st.op)); it != info.emulatedOps.end())
      st.emulatedBy = it->second;
    st.busbwGbps = st.algbwGbps * busBandwidthFactor(st.emulatedBy.empty() ? st.op : st.emulatedBy, st.groupSize);
    out.push_back(st);
  }
  return out;
}

// The step-clustered test (collectives.h): z over the steps' excesses d_s, Σ d_s / √(Σ d_s²).
void stepTest(const std::map<int, double>& excess, RankStraggling& rs) {
  double sum = 0, squares = 0;
  for (const auto& [step, d] : excess) {
    if (step < 0) continue;
    sum += d;
    squares += d * d;
    ++rs.stepsCounted;
    if (d > 0) ++rs.stepsLate;
  }
  rs.zStep = squares > 0 ? sum / std::sqrt(squares) : 0.0;
  rs.pStep = 0.5 * std::erfc(rs.zStep / std::sqrt(2.0));
}

// Stragglers: each rank's one-sided significance of the waiting it caused, most waiting first; the 20 collectives
// with the most total waiting.
void finishStragglers(Accumulation& a, CollectiveAnalysis& out) {
  out.stragglers.decided = a.decided;
  out.stragglers.undecided = a.undecided;
  for (auto& [rank, rs] : a.straggling) {
    const double sigma = std::sqrt(a.waitVariance[rank]);
    rs.z = sigma > 0 ? (static_cast<double>(rs.causedWaitNs) - rs.expectedWaitNs) / sigma : 0.0;
    rs.pValue = 0.5 * std::erfc(rs.z / std::sqrt(2.0));
    stepTest(a.stepExcess[rank], rs);
    for (auto it = a.byGroup.lower_bound({rank, std::string()}); it != a.byGroup.end() && it->first.first == rank; ++it)
      rs.groups.push_back(it->second);
    out.stragglers.ranks.push_back(rs);
  }
  std::sort(out.stragglers.ranks.begin(), out.stragglers.ranks.end(), [](const auto& x, const auto& y) {
    return x.causedWaitNs != y.causedWaitNs ? x.causedWaitNs > y.causedWaitNs : x.rank < y.rank;
  });
  out.stragglers.steps = static_cast<int64_t>(a.allSteps.size());
  std::vector<CollectiveArrival>& arrivals = a.arrivals;
  // Only the first 20 are kept: a partial sort (a run has one arrival per collective, hundreds of thousands). The
  // order is total ((group, seq) names one collective), so they are the 20 a full sort puts first.
  const auto kept = static_cast<std::ptrdiff_t>(std::min<size_t>(arrivals.size(), 20));
  std::partial_sort(arrivals.begin(), arrivals.begin() + kept, arrivals.end(), [](const auto& x, const auto& y) {
    return x.totalWaitNs != y.totalWaitNs ? x.totalWaitNs > y.totalWaitNs
                                          : std::tie(x.group, x.seq) < std::tie(y.group, y.seq);
  });
  arrivals.resize(static_cast<size_t>(kept));
  out.worst = std::move(arrivals);
}

// TP model check: the collectives of "tp-*" groups, per group and step, against what the model predicts.
TpModelCheck checkTpModel(const Accumulation& a, const RunInfo& info) {
  TpModelCheck tp;
  if (info.model) {
    tp.model = *info.model;
    tp.haveModel = info.model->complete();
  }
  std::set<std::string> tpGroups;
  double perStep = 0, modelPerStep = 0, gatherPerStep = 0, scatterPerStep = 0, modelBytesPerStep = 0;
  double arBytes = 0, arLatency = 0;
  int n = 0;
  std::map<int64_t, int64_t> sizes;
  std::string tpDtype;
  for (auto& [key, acc] : a.accums) {
    if (groupClass(key.first) != "tp") continue;
    tpGroups.insert(key.first);
    if (tpDtype.empty()) tpDtype = acc.dtype;
    const double steps = static_cast<double>(std::max<int64_t>(1, acc.stats.steps));
    const std::string& o = key.second;
    modelBytesPerStep += static_cast<double>(acc.modelSizedBytes) / steps;
    if (vocabulary::namesOp(o, CollectiveOp::AllGather)) gatherPerStep += static_cast<double>(acc.modelSized) / steps;
    if (vocabulary::namesOp(o, CollectiveOp::ReduceScatter))
      scatterPerStep += static_cast<double>(acc.modelSized) / steps;
    if (!vocabulary::namesOp(o, CollectiveOp::AllReduce)) continue;
    perStep += static_cast<double>(acc.stats.count) / steps;
    modelPerStep += static_cast<double>(acc.modelSized) / steps;
    arBytes += static_cast<double>(acc.stats.bytes);
    arLatency += static_cast<double>(acc.stats.latencyNs);
    n = acc.stats.groupSize;
    for (auto [b, c] : acc.sizeHistogram) sizes[b] += c;
  }
  if (!tpGroups.empty()) {
    const double g = static_cast<double>(tpGroups.size());
    tp.measuredPerStep = perStep / g;
    tp.measuredModelSizedPerStep = modelPerStep / g;
    tp.measuredAllGatherPerStep = gatherPerStep / g;
    tp.measuredReduceScatterPerStep = scatterPerStep / g;
    tp.measuredBytesPerStep = modelBytesPerStep / g;
    int64_t best = 0;
    for (auto [b, c] : sizes)
      if (c > best) {
        best = c;
        tp.measuredBytesEach = b;
      }
    const double factor = busBandwidthFactor(vocabulary::opName(CollectiveOp::AllReduce), n);
    tp.busbwGbps = arLatency > 0 ? arBytes / arLatency * factor : 0.0;
  }
  if (tp.haveModel) {
    const ModelConfig& m = tp.model;
    const int64_t perLayer = m.activationCheckpointing ? 6 : 4, v = m.vocabParallel ? 1 : 0;
    const int64_t micro = m.gradAccumSteps;
    if (m.sequenceParallel) {
      tp.expectedAllGatherPerStep = micro * (perLayer * m.layers + 2 * v);
      tp.expectedReduceScatterPerStep = micro * (perLayer * m.layers + 2 * v);
    } else {
      tp.expectedPerStep = micro * (perLayer * m.layers + 2 * v);
    }
    tp.expectedElements = m.microBatchSize * m.seqLen * m.hidden;
    tp.expectedBytesPerStep = (tp.expectedPerStep + tp.expectedAllGatherPerStep + tp.expectedReduceScatterPerStep) *
                              tp.expectedElements * elementSize(tpDtype);
    tp.matches = !tpGroups.empty() && std::llround(tp.measuredModelSizedPerStep) == tp.expectedPerStep &&
                 std::llround(tp.measuredAllGatherPerStep) == tp.expectedAllGatherPerStep &&
                 std::llround(tp.measuredReduceScatterPerStep) == tp.expectedReduceScatterPerStep;
  }
  return tp;
}

}  // namespace

CollectiveAnalysis detail::analyzeCollectives(const detail::CollectiveTable& table, const RunInfo& info) {
  std::unordered_map<int, int64_t> uncertainty;
  for (const auto& r : info.ranks) uncertainty[r.rank] = r.clockUncertaintyNs;
  const int64_t modelElements = info.model && info.model->complete()
                                    ? info.model->microBatchSize * info.model->seqLen * info.model->hidden
                                    : 0;
  Accumulation a;
  OneCollective c;
  table.forEachCollective([&](size_t b, size_t e) {
    const detail::CollectiveRecord& first = table.rows[b];
    c.group = table.str(first.group);
    c.seq = first.seq;
    c.op = table.str(first.op);
    c.dtype = table.str(first.dtype);
    c.recs.clear();
    for (size_t i = b; i < e; ++i) {
      const detail::CollectiveRecord& r = table.rows[i];
      // The arrival: the host's enqueue, or the kernel's start where the run's collectives were timed on the GPU.
      const int64_t arrival = info.deviceArrival && r.hasStart() ? r.startNs : r.enqueueNs;
      c.recs.push_back(Record{r.rank, r.bytes, r.numel, arrival,
                              r.hasStart() ? std::optional<int64_t>(r.startNs) : std::nullopt,
                              r.hasEnd() ? std::optional<int64_t>(r.endNs) : std::nullopt, r.step});
    }
    if (!c.recs.empty()) accumulate(c, info, uncertainty, modelElements, a);
  });
  CollectiveAnalysis out;
  out.stats = finishStats(a, info);
  finishStragglers(a, out);
  out.tp = checkTpModel(a, info);
  return out;
}

}  // namespace tpscope::analysis

namespace tpscope::analysis {

tracedb::Result<CollectiveAnalysis> analyzeCollectives(tracedb::Reader& reader, const RunInfo& info) {
  auto table = detail::loadCollectives(reader);
  if (!table) return table.status();
  return detail::analyzeCollectives(*table, info);
}

}  // namespace tpscope::analysis
