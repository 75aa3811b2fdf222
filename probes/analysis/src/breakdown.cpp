#include "tpscope/analysis/breakdown.h"

#include <algorithm>
#include <map>

#include "intervals.h"
#include "sql_query.h"

namespace tpscope::analysis {

using detail::Interval;
using detail::IntervalSet;
using detail::Query;

TimeShares& TimeShares::operator+=(const TimeShares& o) {
  stepNs += o.stepNs;
  computeNs += o.computeNs;
  commNs += o.commNs;
  exposedCommNs += o.exposedCommNs;
  otherNs += o.otherNs;
  idleNs += o.idleNs;
  return *this;
}

const char* stepSourceName(StepSource source) {
  switch (source) {
    case StepSource::StepSpans: return "step_spans";
    case StepSource::StepStats: return "step_stats";
    case StepSource::SpanSteps: return "span_steps";
    case StepSource::WholeRun: return "whole_run";
  }
  return "whole_run";
}

namespace {

enum class Category : uint8_t { Compute, Comm, Other, Step };

constexpr Category categoryOf(int kind) {
  switch (kind) {
    case 0: case 3: case 6: case 7: case 8: return Category::Compute;  // compute optimizer kernel memcpy memset
    case 1: case 9: return Category::Comm;                             // comm nccl_kernel
    case 4: return Category::Step;
    default: return Category::Other;                                   // data checkpoint other wait (and unknown)
  }
}

void extend(Interval& i, int64_t b, int64_t e) {
  i.first = std::min(i.first, b);
  i.second = std::max(i.second, e);
}

struct RankData {
  std::vector<Interval> compute, comm, other;
  std::map<int, Interval> stepSpans;        // step label → [min begin, max end] of its Step spans
  std::vector<Interval> unlabelledStepSpans;
  std::map<int, Interval> spanSteps;        // step label → extent of the spans labelled with it
  std::map<int, Interval> stepStats;
  int64_t first = INT64_MAX, last = INT64_MIN;
};

}  // namespace

tracedb::Result<Breakdown> computeBreakdown(tracedb::Reader& reader) {
  std::map<int, RankData> data;
  {
    Query q(reader, "SELECT rank, kind, begin_ns, dur_ns, step FROM spans", "table 'spans'");
    int lastRank = INT32_MIN;
    RankData* rd = nullptr;
    int lastStep = INT32_MIN;
    Interval* extent = nullptr;
    auto s = q.each([&](Query& row) {
      const int rank = row.i32(0);
      if (rank != lastRank || rd == nullptr) {
        rd = &data[rank];
        lastRank = rank;
        lastStep = INT32_MIN;
        extent = nullptr;
      }
      const int64_t b = row.i64(2);
      const int64_t e = b + std::max<int64_t>(0, row.i64(3));
      const int step = row.i32(4);
      rd->first = std::min(rd->first, b);
      rd->last = std::max(rd->last, e);
      switch (categoryOf(row.i32(1))) {
        case Category::Compute: rd->compute.emplace_back(b, e); break;
        case Category::Comm: rd->comm.emplace_back(b, e); break;
        case Category::Other: rd->other.emplace_back(b, e); break;
        case Category::Step:
          if (step >= 0) {
            auto [it, fresh] = rd->stepSpans.try_emplace(step, b, e);
            if (!fresh) extend(it->second, b, e);
          } else {
            rd->unlabelledStepSpans.emplace_back(b, e);
          }
          return;
      }
      if (step >= 0) {
        if (step != lastStep || extent == nullptr) {
          auto [it, fresh] = rd->spanSteps.try_emplace(step, b, e);
          extent = &it->second;
          lastStep = step;
          if (fresh) return;
        }
        extend(*extent, b, e);
      }
    });
    if (!s) return s;
  }
  {
    Query q(reader,
            "SELECT rank, coalesce(start_ns, enqueue_ns), end_ns FROM collectives WHERE end_ns IS NOT NULL",
            "table 'collectives'");
    auto s = q.each([&](Query& row) {
      RankData& rd = data[row.i32(0)];
      const int64_t b = row.i64(1), e = row.i64(2);
      rd.comm.emplace_back(b, e);
      rd.first = std::min(rd.first, b);
      rd.last = std::max(rd.last, e);
    });
    if (!s) return s;
  }
  {
    Query q(reader,
            "SELECT rank, step, begin_ns, end_ns FROM step_stats WHERE begin_ns IS NOT NULL AND end_ns IS NOT NULL"
            " AND end_ns > begin_ns",
            "table 'step_stats'");
    auto s = q.each([&](Query& row) { data[row.i32(0)].stepStats[row.i32(1)] = Interval(row.i64(2), row.i64(3)); });
    if (!s) return s;
  }

  Breakdown out;
  bool firstRank = true;
  for (auto& [rank, rd] : data) {
    // The windows.
    std::vector<std::pair<int, Interval>> windows;
    StepSource source;
    if (!rd.stepSpans.empty() || !rd.unlabelledStepSpans.empty()) {
      source = StepSource::StepSpans;
      windows.assign(rd.stepSpans.begin(), rd.stepSpans.end());
      std::sort(rd.unlabelledStepSpans.begin(), rd.unlabelledStepSpans.end());
      for (size_t i = 0; i < rd.unlabelledStepSpans.size(); ++i)
        windows.emplace_back(-1, rd.unlabelledStepSpans[i]);
    } else if (!rd.stepStats.empty()) {
      source = StepSource::StepStats;
      windows.assign(rd.stepStats.begin(), rd.stepStats.end());
    } else if (!rd.spanSteps.empty()) {
      source = StepSource::SpanSteps;
      windows.assign(rd.spanSteps.begin(), rd.spanSteps.end());
    } else {
      source = StepSource::WholeRun;
      if (rd.first < rd.last) windows.emplace_back(-1, Interval(rd.first, rd.last));
    }
    if (firstRank) {
      out.source = source;
      firstRank = false;
    }

    const IntervalSet compute(std::move(rd.compute));
    const IntervalSet comm(std::move(rd.comm));
    const IntervalSet other(std::move(rd.other));
    const IntervalSet both = compute.intersect(comm);
    const IntervalSet busy = compute.unite(comm).unite(other);

    RankBreakdown rb;
    rb.rank = rank;
    for (const auto& [step, w] : windows) {
      StepBreakdown sb;
      sb.rank = rank;
      sb.step = step;
      sb.beginNs = w.first;
      sb.endNs = w.second;
      TimeShares& t = sb.time;
      t.stepNs = w.second - w.first;
      t.computeNs = compute.measure(w.first, w.second);
      t.commNs = comm.measure(w.first, w.second);
      const int64_t overlap = both.measure(w.first, w.second);
      const int64_t busyNs = busy.measure(w.first, w.second);
      t.exposedCommNs = t.commNs - overlap;
      t.otherNs = busyNs - t.computeNs - t.exposedCommNs;
      t.idleNs = t.stepNs - busyNs;
      rb.time += t;
      ++rb.steps;
      out.steps.push_back(sb);
    }
    out.run += rb.time;
    out.ranks.push_back(rb);
  }
  return out;
}

}  // namespace tpscope::analysis
