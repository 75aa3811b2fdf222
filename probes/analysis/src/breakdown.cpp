#include "tpscope/analysis/breakdown.h"

#include <algorithm>
#include <map>
#include <atomic>
#include <set>
#include <thread>

#include "breakdown_internal.h"
#include "device_lanes.h"
#include "intervals.h"
#include "tpscope/analysis/summary.h"
#include "tpscope/tracedb/query.h"
#include "tpscope/tracedb/summary.h"
#include "workers.h"

namespace tpscope::analysis {

using detail::DeviceLanes;
using detail::Interval;
using detail::IntervalSet;
using detail::workerCount;
using tracedb::Query;

TimeShares& TimeShares::operator+=(const TimeShares& o) {
  stepNs += o.stepNs;
  computeNs += o.computeNs;
  commNs += o.commNs;
  exposedCommNs += o.exposedCommNs;
  otherNs += o.otherNs;
  idleNs += o.idleNs;
  memcpyNs += o.memcpyNs;
  idleHostWaitNs += o.idleHostWaitNs;
  idleKernelWaitNs += o.idleKernelWaitNs;
  idleOtherNs += o.idleOtherNs;
  return *this;
}

const char* lanesName(Lanes lanes) { return lanes == Lanes::Device ? "device" : "host"; }

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

// The compute and communication spans of one thread (a lane): on one thread a communication span nested in a
// compute span is time that compute span spent blocked, not overlap.
struct Lane {
  std::vector<Interval> compute, comm;
};

struct RankData {
  std::map<int64_t, Lane> lanes;  // by thread
  std::vector<Interval> records;  // collective records [start, end): overlap whatever runs meanwhile
  std::vector<Interval> other;
  std::map<int, Interval> stepSpans;        // step label → [min begin, max end] of its Step spans
  std::vector<Interval> unlabelledStepSpans;
  std::map<int, Interval> spanSteps;        // step label → extent of the spans labelled with it
  std::map<int, Interval> stepStats;
  int64_t first = INT64_MAX, last = INT64_MIN;
  DeviceLanes device;  // its GPU-stream spans and their launches (ranks with device lanes only)
};


using RankMap = std::map<int, RankData>;

// The lanes of kind thread_kinds::kCudaStream, as (rank, thread).
struct DeviceLaneSet {
  std::set<std::pair<int, int64_t>> lanes;
  std::set<int> ranks;
};

tracedb::Result<DeviceLaneSet> loadDeviceLanes(tracedb::Reader& reader) {
  DeviceLaneSet out;
  Query q(reader, "SELECT rank, thread FROM threads WHERE kind = ?", "table 'threads'");
  q.bind(1, tracedb::thread_kinds::kCudaStream);
  auto s = q.each([&](Query& row) {
    out.lanes.emplace(row.i32(0), row.i64(1));
    out.ranks.insert(row.i32(0));
  });
  if (!s) return s;
  return out;
}

// Scans spans with id in [fromId, toId] into per-rank data.
tracedb::Status scanSpans(tracedb::Reader& reader, const DeviceLaneSet& devices, int64_t fromId, int64_t toId,
                          RankMap& data, detail::PhaseIntervals* phases) {
  reader.preferMemoryMap();
  Query q(reader,
          "SELECT rank, thread, kind, begin_ns, dur_ns, step, coalesce(correlation, -1), phase FROM spans"
          " WHERE id BETWEEN ? AND ?",
          "table 'spans'");
  q.bind(1, fromId).bind(2, toId);
  int lastRank = INT32_MIN;
  int64_t lastThread = INT64_MIN;
  RankData* rd = nullptr;
  Lane* lane = nullptr;
  bool rankHasDevice = false, onDevice = false;
  int lastStep = INT32_MIN;
  Interval* extent = nullptr;
  return q.each([&](Query& row) {
    const int rank = row.i32(0);
    const int64_t thread = row.i64(1);
    if (rank != lastRank || rd == nullptr) {
      rd = &data[rank];
      lastRank = rank;
      lastStep = INT32_MIN;
      extent = nullptr;
      lane = nullptr;
      rankHasDevice = devices.ranks.count(rank) > 0;
    }
    if (thread != lastThread || lane == nullptr) {  // merged files hold spans in (rank, thread, begin) order
      lane = &rd->lanes[thread];
      lastThread = thread;
      onDevice = rankHasDevice && devices.lanes.count({rank, thread}) > 0;
    }
    const int64_t b = row.i64(3);
    const int64_t e = b + std::max<int64_t>(0, row.i64(4));
    const int step = row.i32(5);
    if (phases != nullptr && row.i32(2) != static_cast<int>(tracedb::SpanKind::Step))  // phaseBusyFromRecords's
      (*phases)[{rank, row.i32(2), row.i32(7)}].emplace_back(b, b + row.i64(4));

    rd->first = std::min(rd->first, b);
    rd->last = std::max(rd->last, e);
    if (rankHasDevice) {  // the device-lane view, kept beside the host view until the rank's lanes are decided
      const int64_t correlation = row.i64(6);
      if (onDevice) rd->device.addSpan(row.i32(2), b, e, correlation);
      else if (correlation >= 0) rd->device.addLaunch(correlation, b);
    }
    switch (categoryOf(row.i32(2))) {
      case Category::Compute:
        lane->compute.emplace_back(b, e);
        break;
      case Category::Comm:
        lane->comm.emplace_back(b, e);
        break;
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
}

void mergeInto(RankMap& into, RankMap&& from) {
  for (auto& [rank, src] : from) {
    RankData& dst = into[rank];
    auto append = [](std::vector<Interval>& a, std::vector<Interval>& b) {
      if (a.empty()) a = std::move(b);
      else a.insert(a.end(), b.begin(), b.end());
    };
    for (auto& [thread, lane] : src.lanes) {
      Lane& d = dst.lanes[thread];
      append(d.compute, lane.compute);
      append(d.comm, lane.comm);
    }
    append(dst.records, src.records);
    append(dst.other, src.other);
    append(dst.unlabelledStepSpans, src.unlabelledStepSpans);
    for (auto& [step, iv] : src.stepSpans) {
      auto [it, fresh] = dst.stepSpans.try_emplace(step, iv);
      if (!fresh) extend(it->second, iv.first, iv.second);
    }
    for (auto& [step, iv] : src.spanSteps) {
      auto [it, fresh] = dst.spanSteps.try_emplace(step, iv);
      if (!fresh) extend(it->second, iv.first, iv.second);
    }
    dst.first = std::min(dst.first, src.first);
    dst.last = std::max(dst.last, src.last);
    dst.device.mergeFrom(std::move(src.device));
  }
}

// The step windows of one rank (see breakdown.h) and the rule that made them.
std::vector<std::pair<int, Interval>> stepWindows(RankData& rd, StepSource& source) {
  std::vector<std::pair<int, Interval>> windows;
  source = StepSource::WholeRun;
  if (!rd.stepSpans.empty() || !rd.unlabelledStepSpans.empty()) {
    source = StepSource::StepSpans;
    windows.assign(rd.stepSpans.begin(), rd.stepSpans.end());
    std::sort(rd.unlabelledStepSpans.begin(), rd.unlabelledStepSpans.end());
    for (const Interval& iv : rd.unlabelledStepSpans) windows.emplace_back(-1, iv);
  } else if (!rd.stepStats.empty()) {
    source = StepSource::StepStats;
    windows.assign(rd.stepStats.begin(), rd.stepStats.end());
  } else if (!rd.spanSteps.empty()) {
    source = StepSource::SpanSteps;
    windows.assign(rd.spanSteps.begin(), rd.spanSteps.end());
  } else if (rd.first < rd.last) {
    windows.emplace_back(-1, Interval(rd.first, rd.last));
  }
  return windows;
}

// The sets a rank's shares are measured on: C, M, B and, on device lanes, Y and the idle split (breakdown.h).
struct LaneSets {
  Lanes lanes = Lanes::Host;
  IntervalSet compute, comm, busy, memory;
  detail::IdleSplit idle;
};

// Host lanes. Compute: per thread, its compute spans minus its own communication spans (a TP all-reduce issued
// inside "attention forward" blocks that thread: exposed, not overlapped); then the union over threads.
// Communication: every comm span and collective record; what another thread computes meanwhile overlaps it.
LaneSets hostSets(RankData& rd) {
  std::vector<Interval> computeSelf, commAll = std::move(rd.records);
  for (auto& [thread, lane] : rd.lanes) {
    if (lane.comm.empty()) {
      computeSelf.insert(computeSelf.end(), lane.compute.begin(), lane.compute.end());
    } else {
      const IntervalSet blocked(lane.comm);
      const IntervalSet self = IntervalSet(std::move(lane.compute)).subtract(blocked);
      computeSelf.insert(computeSelf.end(), self.intervals().begin(), self.intervals().end());
      commAll.insert(commAll.end(), lane.comm.begin(), lane.comm.end());
    }
  }
  rd.lanes.clear();
  LaneSets sets;
  sets.compute = IntervalSet(std::move(computeSelf));
  sets.comm = IntervalSet(std::move(commAll));
  sets.busy = sets.compute.unite(sets.comm).unite(IntervalSet(std::move(rd.other)));
  return sets;
}

// Device lanes: GPU work only; the idle split covers [lo, hi), which holds every window.
LaneSets deviceSets(RankData& rd, int64_t lo, int64_t hi) {
  LaneSets sets;
  sets.lanes = Lanes::Device;
  sets.compute = IntervalSet(std::move(rd.device.compute));
  sets.comm = IntervalSet(std::move(rd.device.comm));
  sets.memory = IntervalSet(std::move(rd.device.memory));
  sets.busy = sets.compute.unite(sets.comm).unite(sets.memory);
  sets.idle = detail::splitIdle(sets.busy, rd.device, lo, hi);
  rd.device = DeviceLanes();
  rd.lanes.clear();
  return sets;
}

// The windows of one rank and its shares in each (see breakdown.h). Consumes the rank's intervals.
auto breakdownOfRank(int rank, RankData& rd) {
  struct Result {
    StepSource source = StepSource::WholeRun;
    RankBreakdown rank;
    std::vector<StepBreakdown> steps;
  } out;
  const std::vector<std::pair<int, Interval>> windows = stepWindows(rd, out.source);
  int64_t lo = rd.first, hi = rd.last;
  for (const auto& [step, w] : windows) {
    lo = std::min(lo, w.first);
    hi = std::max(hi, w.second);
  }
  const LaneSets sets = rd.device.active() ? deviceSets(rd, lo, hi) : hostSets(rd);
  const IntervalSet both = sets.compute.intersect(sets.comm);
  out.rank.rank = rank;
  out.rank.lanes = sets.lanes;
  for (const auto& [step, w] : windows) {
    StepBreakdown sb;
    sb.rank = rank;
    sb.step = step;
    sb.beginNs = w.first;
    sb.endNs = w.second;
    TimeShares& t = sb.time;
    t.stepNs = w.second - w.first;
    t.computeNs = sets.compute.measure(w.first, w.second);
    t.commNs = sets.comm.measure(w.first, w.second);
    const int64_t overlap = both.measure(w.first, w.second);
    const int64_t busyNs = sets.busy.measure(w.first, w.second);
    t.exposedCommNs = t.commNs - overlap;
    t.otherNs = busyNs - t.computeNs - t.exposedCommNs;
    t.idleNs = t.stepNs - busyNs;
    t.memcpyNs = sets.memory.measure(w.first, w.second);
    t.idleHostWaitNs = sets.idle.hostWait.measure(w.first, w.second);
    t.idleKernelWaitNs = sets.idle.kernelWait.measure(w.first, w.second);
    t.idleOtherNs = sets.idle.other.measure(w.first, w.second);
    out.rank.time += t;
    ++out.rank.steps;
    out.steps.push_back(sb);
  }
  return out;
}

}  // namespace

tracedb::Result<Breakdown> computeBreakdown(tracedb::Reader& reader) {
  auto summary = tracedb::readSummary(reader, kSummaryVersion);
  if (!summary) return summary.status();
  if (*summary) return breakdownFromSummary(**summary);
  return computeBreakdownFromRecords(reader);
}

tracedb::Result<Breakdown> computeBreakdownFromRecords(tracedb::Reader& reader) {
  return detail::breakdownAndPhases(reader, nullptr);
}

tracedb::Result<Breakdown> detail::breakdownAndPhases(tracedb::Reader& reader, PhaseIntervals* phases) {
  RankMap data;
  auto devices = loadDeviceLanes(reader);
  if (!devices) return devices.status();
  {
    auto ids = reader.spanIdRange();
    if (!ids) return ids.status();
    const int64_t minId = ids->first, maxId = ids->last;
    const unsigned workers = workerCount(maxId - minId + 1);
    if (workers <= 1) {
      if (auto s = scanSpans(reader, *devices, minId, maxId, data, phases); !s) return s;
    } else {
      std::vector<RankMap> parts(workers);
      std::vector<PhaseIntervals> partPhases(workers);
      auto s = detail::scanIdRanges(reader, minId, maxId, workers,
                                    [&](tracedb::Reader& own, int64_t from, int64_t to, unsigned w) {
                                      return scanSpans(own, *devices, from, to, parts[w],
                                                       phases != nullptr ? &partPhases[w] : nullptr);
                                    });
      if (!s) return s;
      for (auto& part : parts) mergeInto(data, std::move(part));
      if (phases != nullptr)
        for (auto& part : partPhases)
          for (auto& [key, iv] : part) {
            auto& into = (*phases)[key];
            into.insert(into.end(), iv.begin(), iv.end());
          }
    }
  }
  {
    Query q(reader,
            "SELECT rank, coalesce(start_ns, enqueue_ns), end_ns FROM collectives WHERE end_ns IS NOT NULL",
            "table 'collectives'");
    auto s = q.each([&](Query& row) {
      RankData& rd = data[row.i32(0)];
      const int64_t b = row.i64(1), e = row.i64(2);
      rd.records.emplace_back(b, e);
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

  // Per rank (independent: in parallel for large runs).
  using RankResult = decltype(breakdownOfRank(0, std::declval<RankData&>()));
  std::vector<std::pair<int, RankData*>> ranks;
  size_t spans = 0;
  for (auto& [rank, rd] : data) {
    ranks.emplace_back(rank, &rd);
    spans += rd.records.size() + rd.other.size() + rd.device.starts.size();
    for (const auto& [thread, lane] : rd.lanes) spans += lane.compute.size() + lane.comm.size();
  }
  std::vector<RankResult> results(ranks.size());
  std::atomic<size_t> next{0};
  auto work = [&]() {
    for (size_t i; (i = next.fetch_add(1)) < ranks.size();) results[i] = breakdownOfRank(ranks[i].first, *ranks[i].second);
  };
  const unsigned workers = std::min<size_t>(workerCount(static_cast<int64_t>(spans)), ranks.size());
  std::vector<std::thread> threads;
  for (unsigned w = 1; w < workers; ++w) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();

  Breakdown out;
  for (size_t i = 0; i < results.size(); ++i) {
    if (i == 0) out.source = results[i].source;
    out.run += results[i].rank.time;
    out.ranks.push_back(results[i].rank);
    out.ranks.back().source = results[i].source;
    out.steps.insert(out.steps.end(), results[i].steps.begin(), results[i].steps.end());
  }
  return out;
}

}  // namespace tpscope::analysis
