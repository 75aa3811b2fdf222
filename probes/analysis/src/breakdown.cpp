#include "tpscope/analysis/breakdown.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

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

// Scans spans with id in [fromId, toId] into per-rank data. Where `left` is given, it is called with a rank when the
// scan moves on from it to another (data[rank] may be taken out then), before the next rank's first span.
tracedb::Status scanSpans(tracedb::Reader& reader, const DeviceLaneSet& devices, int64_t fromId, int64_t toId,
                          RankMap& data, detail::PhaseIntervals* phases,
                          const std::function<void(int rank)>& left = {}) {
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
      if (rd != nullptr && left) left(lastRank);
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

void detail::takePhaseRows(PhaseIntervals& phases, int rank, std::vector<tracedb::PhaseSummaryRow>& out) {
  for (auto it = phases.lower_bound({rank, INT_MIN, INT_MIN}); it != phases.end() && std::get<0>(it->first) == rank;
       it = phases.erase(it))
    out.push_back({rank, std::get<1>(it->first), std::get<2>(it->first), IntervalSet(std::move(it->second)).total()});
}

namespace {

// The collective records and step_stats windows of every rank (small beside its spans).
tracedb::Status readRecordsAndStepStats(tracedb::Reader& reader, RankMap& data) {
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
  Query q(reader,
          "SELECT rank, step, begin_ns, end_ns FROM step_stats WHERE begin_ns IS NOT NULL AND end_ns IS NOT NULL"
          " AND end_ns > begin_ns",
          "table 'step_stats'");
  return q.each([&](Query& row) { data[row.i32(0)].stepStats[row.i32(1)] = Interval(row.i64(2), row.i64(3)); });
}

// A rank's records and step_stats windows (`extras`, as read above) added to its spans' data.
void addRecordsAndStepStats(RankData& rd, const RankMap& extras, int rank) {
  auto it = extras.find(rank);
  if (it == extras.end()) return;
  const RankData& x = it->second;
  rd.records.insert(rd.records.end(), x.records.begin(), x.records.end());
  for (const auto& [step, w] : x.stepStats) rd.stepStats.emplace(step, w);
  rd.first = std::min(rd.first, x.first);
  rd.last = std::max(rd.last, x.last);
}

using RankResult = decltype(breakdownOfRank(0, std::declval<RankData&>()));

// `from`'s intervals appended to `into`'s, key by key.
void appendPhases(detail::PhaseIntervals& into, detail::PhaseIntervals& from) {
  for (auto& [key, iv] : from) {
    auto& to = into[key];
    to.insert(to.end(), iv.begin(), iv.end());
  }
}

// Every rank of `data` broken down (independent: in parallel for large runs), consuming its intervals.
std::map<int, RankResult> breakdownOfRanks(RankMap& data) {
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
  std::map<int, RankResult> out;
  for (size_t i = 0; i < ranks.size(); ++i) out.emplace(ranks[i].first, std::move(results[i]));
  return out;
}

// The run's breakdown from its ranks' results, in rank order.
Breakdown assemble(std::map<int, RankResult>& results) {
  Breakdown out;
  for (auto& [rank, r] : results) {
    if (out.ranks.empty()) out.source = r.source;
    out.run += r.rank.time;
    out.ranks.push_back(r.rank);
    out.ranks.back().source = r.source;
    out.steps.insert(out.steps.end(), r.steps.begin(), r.steps.end());
  }
  return out;
}

// The whole run in memory: every rank's intervals gathered, then broken down. For spans whose ranks interleave in
// row order (ranks' files written into one as they were flushed); rank at a time below is the usual path.
tracedb::Result<Breakdown> wholeRun(tracedb::Reader& reader, const DeviceLaneSet& devices, int64_t minId, int64_t maxId,
                                    const RankMap& extras, std::vector<tracedb::PhaseSummaryRow>* phaseRows) {
  RankMap data;
  detail::PhaseIntervals phases;
  detail::PhaseIntervals* byKey = phaseRows != nullptr ? &phases : nullptr;
  const unsigned workers = workerCount(maxId - minId + 1);
  std::vector<RankMap> parts(workers);
  std::vector<detail::PhaseIntervals> partPhases(workers);
  auto s = detail::scanIdRanges(
      reader, minId, maxId, workers, [&](tracedb::Reader& own, int64_t from, int64_t to, unsigned w) {
        return scanSpans(own, devices, from, to, parts[w], byKey != nullptr ? &partPhases[w] : nullptr);
      });
  if (!s) return s;
  for (auto& part : parts) mergeInto(data, std::move(part));
  for (auto& part : partPhases) appendPhases(phases, part);
  for (const auto& [rank, x] : extras) addRecordsAndStepStats(data[rank], extras, rank);
  if (phaseRows != nullptr)
    for (const auto& [rank, rd] : data) detail::takePhaseRows(phases, rank, *phaseRows);
  auto results = breakdownOfRanks(data);
  return assemble(results);
}

}  // namespace

// Rank at a time: each worker scans its range of span ids and breaks a rank down as soon as its scan moves on from
// it, then frees its intervals, so a run is never held whole (a 64-rank, 1.3 M-span import: 96 MB of intervals
// before, two ranks' now). The first rank of a range and its last may continue in the neighbouring range: those are
// kept, merged across ranges and broken down at the end. Spans of a rank that come back after the scan left it (rank
// files written into one as they flushed) break the premise: then the whole run is read again in memory (wholeRun).
tracedb::Result<Breakdown> detail::breakdownAndPhases(tracedb::Reader& reader,
                                                      std::vector<tracedb::PhaseSummaryRow>* phaseRows) {
  auto devices = loadDeviceLanes(reader);
  if (!devices) return devices.status();
  auto ids = reader.spanIdRange();
  if (!ids) return ids.status();
  const int64_t minId = ids->first, maxId = ids->last;
  RankMap extras;
  if (auto s = readRecordsAndStepStats(reader, extras); !s) return s;

  struct Part {
    RankMap open;                                     // the ranks not broken down in the part (its first and last)
    detail::PhaseIntervals phases;                    // their phase intervals
    std::map<int, RankResult> done;                   // ranks that began and ended within it
    std::vector<tracedb::PhaseSummaryRow> phaseRows;  // of those
    bool interleaved = false;                         // a rank came back after the scan had left it
  };
  const unsigned workers = workerCount(maxId - minId + 1);
  std::vector<Part> parts(workers);
  auto s = detail::scanIdRanges(
      reader, minId, maxId, workers, [&](tracedb::Reader& own, int64_t from, int64_t to, unsigned w) {
        Part& part = parts[w];
        std::optional<int> first;
        auto left = [&](int rank) {
          if (!first) first = rank;
          if (rank == *first || part.interleaved) return;
          if (part.done.count(rank) != 0) {
            part.interleaved = true;
            return;
          }
          auto node = part.open.extract(rank);
          addRecordsAndStepStats(node.mapped(), extras, rank);
          part.done.emplace(rank, breakdownOfRank(rank, node.mapped()));
          if (phaseRows != nullptr) detail::takePhaseRows(part.phases, rank, part.phaseRows);
        };
        return scanSpans(own, *devices, from, to, part.open, phaseRows != nullptr ? &part.phases : nullptr, left);
      });
  if (!s) return s;

  // A rank broken down in two parts, or in one and open in another, came back too.
  std::map<int, RankResult> results;
  bool interleaved = false;
  for (Part& part : parts) {
    interleaved = interleaved || part.interleaved;
    for (auto& [rank, r] : part.done) interleaved = !results.emplace(rank, std::move(r)).second || interleaved;
  }
  for (const Part& part : parts)
    for (const auto& [rank, rd] : part.open) interleaved = interleaved || results.count(rank) != 0;
  if (interleaved) {
    if (phaseRows != nullptr) phaseRows->clear();
    return wholeRun(reader, *devices, minId, maxId, extras, phaseRows);
  }

  RankMap rest;  // the open ranks, and ranks with records or step windows but no spans
  detail::PhaseIntervals restPhases;
  for (Part& part : parts) {
    mergeInto(rest, std::move(part.open));
    appendPhases(restPhases, part.phases);
    if (phaseRows != nullptr) phaseRows->insert(phaseRows->end(), part.phaseRows.begin(), part.phaseRows.end());
  }
  for (const auto& [rank, x] : extras)
    if (results.count(rank) == 0) rest.try_emplace(rank);
  for (auto& [rank, rd] : rest) {
    addRecordsAndStepStats(rd, extras, rank);
    if (phaseRows != nullptr) detail::takePhaseRows(restPhases, rank, *phaseRows);
  }
  results.merge(breakdownOfRanks(rest));
  if (phaseRows != nullptr)
    std::sort(phaseRows->begin(), phaseRows->end(), [](const auto& a, const auto& b) {
      return std::tie(a.rank, a.kind, a.phase) < std::tie(b.rank, b.kind, b.phase);
    });
  return assemble(results);
}

}  // namespace tpscope::analysis
