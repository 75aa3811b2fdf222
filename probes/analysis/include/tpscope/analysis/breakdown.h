// Time breakdown per rank and step: compute, communication, exposed communication, other busy time, idle.
//
// A rank's time is read on one kind of lane: its device lanes (GPU streams) when they hold GPU work, else its host
// lanes (every thread). On them, C is compute, M communication, B everything busy (and Y memcpy/memset on device
// lanes). A step window W comes from the rank's Step spans, else step_stats, else the spans' step labels, else the
// whole run; per window compute = |C ∩ W|, exposed comm = |(M \ C) ∩ W|, other = |(B \ (C ∪ M)) ∩ W| and
// idle = |W \ B|, so that compute + exposed comm + other + idle = step exactly. On device lanes idle splits into host
// wait, kernel wait and other, after Holistic Trace Analysis. Rank and run totals sum the steps.
// docs/diagnosis.md ("Time breakdown") defines each set, the window rules and the idle split in full.
#pragma once

#include <cstdint>
#include <vector>

#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis {

// HTA's default gap below which idle time between queued kernels is launch overhead (its consecutive_kernel_delay,
// 30 in the trace's unit, which is Kineto's µs).
inline constexpr int64_t kKernelWaitNs = 30'000;

// One window's (or a sum of windows') time, in ns.
//   Host lanes: C = ∪ over threads of (that thread's compute, optimizer, kernel, memcpy, memset spans minus that
//   same thread's comm spans: communication nested in compute is time blocked, not overlap); M = ∪ of comm and
//   nccl_kernel spans and the rank's collective records from coalesce(start_ns, enqueue_ns) to end_ns (records
//   without end_ns are hangs, left out); B = ∪ of every span but kind step, and M; Y = ∅.
//   Device lanes (the GPU streams' spans only): C = ∪ kernel, M = ∪ nccl_kernel, Y = ∪ memcpy and memset spans;
//   B = C ∪ M ∪ Y.
struct TimeShares {
  int64_t stepNs = 0;         // |W|
  int64_t computeNs = 0;      // |C ∩ W|
  int64_t commNs = 0;         // |M ∩ W|
  int64_t exposedCommNs = 0;  // |(M \ C) ∩ W|: communication that no compute overlapped
  int64_t otherNs = 0;        // |(B \ (C ∪ M)) ∩ W|: host: data loading, checkpoint, waits; device: memcpy alone
  int64_t idleNs = 0;         // |W \ B|: nothing recorded (device: no GPU work)
  int64_t memcpyNs = 0;       // |Y ∩ W|: device memcpy + memset, whatever overlaps them (0 on host lanes)
  // Device lanes (0 on host lanes): the split of idleNs. Each gap [g0, g1) of B is classified by the work that
  // begins at g1 and its launch time L (the latest begin of a host span with its correlation id): host wait when
  // min L > g0 (the CPU was late); else kernel wait when shorter than kKernelWaitNs; else other (work waiting on
  // events or other streams, no known launch, the time after the last GPU work).
  int64_t idleHostWaitNs = 0, idleKernelWaitNs = 0, idleOtherNs = 0;
  int64_t overlapNs() const { return commNs - exposedCommNs; }  // |C ∩ M ∩ W|
  double pct(int64_t part) const { return stepNs > 0 ? 100.0 * static_cast<double>(part) / stepNs : 0.0; }
  double commOverheadPct() const { return pct(exposedCommNs); }  // the share of step time spent only communicating
  TimeShares& operator+=(const TimeShares& o);
};

enum class StepSource : uint8_t { StepSpans, StepStats, SpanSteps, WholeRun };
const char* stepSourceName(StepSource source);  // "step_spans", "step_stats", "span_steps", "whole_run"

enum class Lanes : uint8_t { Host, Device };
const char* lanesName(Lanes lanes);  // "host", "device"

struct StepBreakdown {
  int rank = 0;
  int step = -1;
  // The window W, in order of preference: the rank's Step spans (kind 4; several on one step merged into [min
  // begin, max end]); else step_stats [begin_ns, end_ns); else the extent of the spans labelled with that step; else
  // one window, step -1, over the rank's whole extent. The same on both kinds of lanes.
  int64_t beginNs = 0, endNs = 0;
  TimeShares time;
};

struct RankBreakdown {
  int rank = 0;
  Lanes lanes = Lanes::Host;  // the lanes its time was read on
  StepSource source = StepSource::WholeRun;  // where its step windows came from
  int steps = 0;              // windows summed
  TimeShares time;
};

struct Breakdown {
  StepSource source = StepSource::WholeRun;  // the source of the windows (the first rank's, when they differ)
  std::vector<StepBreakdown> steps;          // by rank, then step
  std::vector<RankBreakdown> ranks;          // by rank
  TimeShares run;                            // sum over ranks
};

// The breakdown of the file: read from its summaries (tracedb/summary.h) when it has current ones (one read of
// step_summary), else computed from its records. Both give the same result (summary_test checks it on real captures).
tracedb::Result<Breakdown> computeBreakdown(tracedb::Reader& reader);
// Always from the records (what the summaries are made of): one scan of spans, threads and collectives (any order;
// sorted in memory), O(n log n) per rank, with or without the query indexes.
tracedb::Result<Breakdown> computeBreakdownFromRecords(tracedb::Reader& reader);

}  // namespace tpscope::analysis
