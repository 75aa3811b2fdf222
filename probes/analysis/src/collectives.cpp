#include "tpscope/analysis/collectives.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <set>
#include <unordered_map>

#include "analysis_internal.h"

namespace tpscope::analysis {


std::string canonicalOp(std::string_view op) {
  std::string s;
  for (char c : op) s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (std::string_view prefix : {"c10d::", "nccl::", "nccl:", "gloo:"})
    if (std::string_view(s).starts_with(prefix)) s.erase(0, prefix.size());
  while (!s.empty() && s.front() == '_') s.erase(0, 1);
  while (!s.empty() && s.back() == '_') s.pop_back();
  for (std::string_view suffix : {"_coalesced", "_into_tensor", "_tensor", "_base", "_single"})
    if (std::string_view(s).ends_with(suffix)) s.erase(s.size() - suffix.size());
  std::string squeezed;
  for (char c : s)
    if (c != '_') squeezed += c;
  if (squeezed == "allreduce") return "all_reduce";
  if (squeezed == "allgather") return "all_gather";
  if (squeezed == "reducescatter") return "reduce_scatter";
  if (squeezed == "alltoall" || squeezed == "alltoallv") return "all_to_all";
  if (squeezed == "sendrecv") return "send_recv";
  return s;
}

double busBandwidthFactor(const std::string& op, int n) {
  if (n < 1) return 0;
  const double nn = n;
  const std::string o = canonicalOp(op);
  if (o == "all_reduce") return 2.0 * (nn - 1) / nn;
  // nccl-tests: every rank sends or receives (n−1)/n of the message.
  if (o == "all_gather" || o == "reduce_scatter" || o == "all_to_all" || o == "gather" || o == "scatter")
    return (nn - 1) / nn;
  if (o == "barrier") return 0;
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

}  // namespace

CollectiveAnalysis detail::analyzeCollectives(const detail::CollectiveTable& table, const RunInfo& info) {
  CollectiveAnalysis out;
  std::map<std::pair<std::string, std::string>, GroupOpAccum> accums;
  std::unordered_map<int, RankStraggling> straggling;
  std::unordered_map<int, double> waitVariance;  // σ²_r of the significance test
  std::set<int> allSteps;
  std::vector<CollectiveArrival> arrivals;

  std::unordered_map<int, int64_t> uncertainty;
  for (const auto& r : info.ranks) uncertainty[r.rank] = r.clockUncertaintyNs;

  const int64_t modelElements = info.model && info.model->complete()
                                    ? info.model->microBatchSize * info.model->seqLen * info.model->hidden
                                    : 0;

  std::string group, op, dtype;
  int64_t seq = INT64_MIN;
  std::vector<Record> recs;

  auto flush = [&]() {
    if (recs.empty()) return;
    const tracedb::GroupInfo* g = info.group(group);
    const int n = g && !g->ranks.empty() ? static_cast<int>(g->ranks.size()) : static_cast<int>(recs.size());
    GroupOpAccum& acc = accums[{group, op}];
    acc.stats.group = group;
    acc.stats.op = op;
    acc.stats.groupSize = n;
    if (acc.dtype.empty()) acc.dtype = dtype;

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
      allSteps.insert(step);
    }
    const int64_t skew = maxArr - minArr;
    CollectiveArrival arrival{group, seq, op, step, -1, skew, 0, completed ? minDur : 0};
    if (recs.size() >= 2) {
      const int64_t clock = uncertainty[firstRank] + uncertainty[lastRank];
      const bool decided = skew > clock;
      int64_t totalWait = 0;
      for (const Record& r : recs) {
        RankStraggling& rs = straggling[r.rank];
        rs.rank = r.rank;
        if (decided) {
          ++rs.collectives;
          const int64_t w = maxArr - r.enqueue;
          rs.waitedNs += w;
          totalWait += w;
        }
      }
      if (decided) {
        const double w = static_cast<double>(totalWait), pLast = 1.0 / static_cast<double>(recs.size());
        for (const Record& r : recs) {
          straggling[r.rank].expectedWaitNs += w * pLast;
          waitVariance[r.rank] += w * w * pLast * (1 - pLast);
        }
        RankStraggling& last = straggling[lastRank];
        ++last.lastCount;
        last.causedWaitNs += totalWait;
        arrival.lastRank = lastRank;
        arrival.totalWaitNs = totalWait;
        ++out.stragglers.decided;
      } else {
        ++out.stragglers.undecided;
      }
    }
    arrivals.push_back(arrival);

    if (completed == 0) {
      ++acc.stats.incomplete;
    } else {
      const int64_t size = op == "all_gather" || op == "allgather" ? maxBytes * n : maxBytes;
      CollectiveStats& s = acc.stats;
      if (s.count == 0 || minDur < s.minLatencyNs) s.minLatencyNs = minDur;
      s.maxLatencyNs = std::max(s.maxLatencyNs, minDur);
      ++s.count;
      s.bytes += size;
      s.totalNs += sumDur / completed;
      s.latencyNs += minDur;
      s.maxSkewNs = std::max(s.maxSkewNs, skew);
      acc.skewSum += skew;
      ++acc.skewCount;
      const bool gather = op == "all_gather" || op == "allgather";
      if (modelElements > 0 && (gather ? maxNumel * n : maxNumel) == modelElements) {
        ++acc.modelSized;
        acc.modelSizedBytes += size;
      }
      ++acc.sizeHistogram[maxBytes];
    }
    recs.clear();
  };

  table.forEachCollective([&](size_t b, size_t e) {
    const detail::CollectiveRecord& first = table.rows[b];
    group = table.str(first.group);
    seq = first.seq;
    op = table.str(first.op);
    dtype = table.str(first.dtype);
    for (size_t i = b; i < e; ++i) {
      const detail::CollectiveRecord& c = table.rows[i];
      recs.push_back(Record{c.rank, c.bytes, c.numel, c.enqueueNs,
                            c.hasStart() ? std::optional<int64_t>(c.startNs) : std::nullopt,
                            c.hasEnd() ? std::optional<int64_t>(c.endNs) : std::nullopt, c.step});
    }
    flush();
  });

  for (auto& [key, acc] : accums) {
    CollectiveStats& st = acc.stats;
    st.steps = static_cast<int64_t>(acc.steps.size());
    st.meanSkewNs = acc.skewCount ? acc.skewSum / acc.skewCount : 0;
    st.algbwGbps = st.latencyNs > 0 ? static_cast<double>(st.bytes) / static_cast<double>(st.latencyNs) : 0.0;
    // An emulated op moved what its underlying op moves (a reduce-scatter done as an all-reduce: 2(n−1)/n, not
    // (n−1)/n, of the message per rank).
    if (auto it = info.emulatedOps.find(canonicalOp(st.op)); it != info.emulatedOps.end()) st.emulatedBy = it->second;
    st.busbwGbps = st.algbwGbps * busBandwidthFactor(st.emulatedBy.empty() ? st.op : st.emulatedBy, st.groupSize);
    out.stats.push_back(st);
  }

  // Stragglers.
  for (auto& [rank, rs] : straggling) {
    const double sigma = std::sqrt(waitVariance[rank]);
    rs.z = sigma > 0 ? (static_cast<double>(rs.causedWaitNs) - rs.expectedWaitNs) / sigma : 0.0;
    rs.pValue = 0.5 * std::erfc(rs.z / std::sqrt(2.0));
    out.stragglers.ranks.push_back(rs);
  }
  std::sort(out.stragglers.ranks.begin(), out.stragglers.ranks.end(), [](const auto& a, const auto& b) {
    return a.causedWaitNs != b.causedWaitNs ? a.causedWaitNs > b.causedWaitNs : a.rank < b.rank;
  });
  out.stragglers.steps = static_cast<int64_t>(allSteps.size());
  std::sort(arrivals.begin(), arrivals.end(), [](const auto& a, const auto& b) {
    return a.totalWaitNs != b.totalWaitNs ? a.totalWaitNs > b.totalWaitNs
                                          : std::tie(a.group, a.seq) < std::tie(b.group, b.seq);
  });
  if (arrivals.size() > 20) arrivals.resize(20);
  out.worst = std::move(arrivals);

  // TP model check: the collectives of "tp-*" groups, per group and step.
  TpModelCheck& tp = out.tp;
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
  for (auto& [key, acc] : accums) {
    if (groupClass(key.first) != "tp") continue;
    tpGroups.insert(key.first);
    if (tpDtype.empty()) tpDtype = acc.dtype;
    const double steps = static_cast<double>(std::max<int64_t>(1, acc.stats.steps));
    const std::string& o = key.second;
    modelBytesPerStep += static_cast<double>(acc.modelSizedBytes) / steps;
    if (o == "all_gather" || o == "allgather") gatherPerStep += static_cast<double>(acc.modelSized) / steps;
    if (o == "reduce_scatter") scatterPerStep += static_cast<double>(acc.modelSized) / steps;
    if (o != "all_reduce" && o != "allreduce") continue;
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
    tp.busbwGbps = arLatency > 0 ? arBytes / arLatency * busBandwidthFactor("all_reduce", n) : 0.0;
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
