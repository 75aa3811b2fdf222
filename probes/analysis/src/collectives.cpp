#include "tpscope/analysis/collectives.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <unordered_map>

#include "analysis_internal.h"

namespace tpscope::analysis {


double busBandwidthFactor(const std::string& op, int n) {
  if (n < 1) return 0;
  const double nn = n;
  if (op == "all_reduce" || op == "allreduce") return 2.0 * (nn - 1) / nn;
  if (op == "all_gather" || op == "allgather" || op == "reduce_scatter" || op == "all_to_all" || op == "alltoall")
    return (nn - 1) / nn;
  if (op == "barrier") return 0;
  return 1;  // broadcast, reduce, send, recv, gather, scatter
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
  std::map<int64_t, int64_t> sizeHistogram;  // bytes → count
  std::string dtype;
};

}  // namespace

CollectiveAnalysis detail::analyzeCollectives(const detail::CollectiveTable& table, const RunInfo& info) {
  CollectiveAnalysis out;
  std::map<std::pair<std::string, std::string>, GroupOpAccum> accums;
  std::unordered_map<int, RankStraggling> straggling;
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
      if (modelElements > 0 && maxNumel == modelElements) ++acc.modelSized;
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
    st.busbwGbps = st.algbwGbps * busBandwidthFactor(st.op, st.groupSize);
    out.stats.push_back(st);
  }

  // Stragglers.
  for (auto& [rank, rs] : straggling) out.stragglers.ranks.push_back(rs);
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

  // TP model check: all-reduces of "tp-*" groups.
  TpModelCheck& tp = out.tp;
  if (info.model) {
    tp.model = *info.model;
    tp.haveModel = info.model->complete();
  }
  int tpGroups = 0;
  double perStep = 0, modelPerStep = 0, bytesPerStep = 0, bytes = 0, latency = 0;
  int n = 0;
  std::map<int64_t, int64_t> sizes;
  std::string tpDtype;
  for (auto& [key, acc] : accums) {
    if (groupClass(key.first) != "tp" || (key.second != "all_reduce" && key.second != "allreduce")) continue;
    ++tpGroups;
    const double steps = std::max<int64_t>(1, acc.stats.steps);
    perStep += static_cast<double>(acc.stats.count) / steps;
    modelPerStep += static_cast<double>(acc.modelSized) / steps;
    bytesPerStep += static_cast<double>(acc.stats.bytes) / steps;
    bytes += static_cast<double>(acc.stats.bytes);
    latency += static_cast<double>(acc.stats.latencyNs);
    n = acc.stats.groupSize;
    for (auto [b, c] : acc.sizeHistogram) sizes[b] += c;
    if (tpDtype.empty()) tpDtype = acc.dtype;
  }
  if (tpGroups > 0) {
    tp.measuredPerStep = perStep / tpGroups;
    tp.measuredModelSizedPerStep = modelPerStep / tpGroups;
    tp.measuredBytesPerStep = bytesPerStep / tpGroups;
    int64_t best = 0;
    for (auto [b, c] : sizes)
      if (c > best) {
        best = c;
        tp.measuredBytesEach = b;
      }
    tp.busbwGbps = latency > 0 ? bytes / latency * busBandwidthFactor("all_reduce", n) : 0.0;
  }
  if (tp.haveModel) {
    tp.expectedPerStep = int64_t{4} * tp.model.layers * tp.model.gradAccumSteps;
    tp.expectedElements = tp.model.microBatchSize * tp.model.seqLen * tp.model.hidden;
    tp.expectedBytesPerStep = tp.expectedPerStep * tp.expectedElements * elementSize(tpDtype);
    tp.matches = tpGroups > 0 && !tp.model.sequenceParallel &&
                 std::llround(tp.measuredModelSizedPerStep) == tp.expectedPerStep;
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
