// Time breakdown per rank and step: compute, communication, exposed communication, other busy time, idle.
//
// Definitions (all in ns; docs/diagnosis.md has the long form). A rank's time is read on one kind of lane:
// its device lanes (threads of kind thread_kinds::kCudaStream) when it has at least one kernel, nccl_kernel,
// memcpy or memset span on them, else its host lanes (CPU/Gloo runs: every thread). Breakdown::ranks says which.
//
// Host lanes — over all the rank's threads:
//   C = ∪ over threads of (that thread's compute spans (kinds compute, optimizer, kernel, memcpy, memset) minus
//       that same thread's comm spans: a communication span nested in a compute span is time the thread was
//       blocked, not overlap)
//   M = ∪ intervals of communication   (kinds comm, nccl_kernel, and every collective record of the rank from
//                                        coalesce(start_ns, enqueue_ns) to end_ns; records without end_ns are left
//                                        out — a collective that never completed is a hang, not a duration)
//   B = ∪ intervals of every span except kind step, and M
//   Y = ∅
// Device lanes — spans on the rank's GPU streams only (host spans and collective records are not used: a host
// op "overlapping" a kernel is the CPU running ahead, not compute hiding communication):
//   C = ∪ kernel spans          M = ∪ nccl_kernel spans          Y = ∪ memcpy and memset spans
//   B = C ∪ M ∪ Y               (annotations and other spans on the streams are not GPU work)
// A step window W of that rank is, in order of preference: its Step spans (kind 4; several on one step are merged
// into [min begin, max end]); else step_stats [begin_ns, end_ns]; else the extent of the spans labelled with that
// step; a file with no step information at all gives one window, step -1, over the rank's whole extent. The
// windows do not depend on the lanes.
//   step_ns         = |W|
//   compute_ns      = |C ∩ W|
//   comm_ns         = |M ∩ W|
//   overlap         = |C ∩ M ∩ W| = comm_ns − exposed_comm_ns
//   exposed_comm_ns = |(M \ C) ∩ W|            communication that no compute overlapped
//   other_ns        = |(B \ (C ∪ M)) ∩ W|      host: data loading, checkpoint, waits; device: memcpy/memset alone
//   idle_ns         = |W \ B|                  nothing recorded (device: no GPU work)
//   memcpy_ns       = |Y ∩ W|                  device memcpy + memset, whatever overlaps them (0 on host lanes)
// so compute + exposed_comm + other + idle = step_ns exactly.
//   comm_overhead_pct = 100 · exposed_comm_ns / step_ns   (the share of step time spent only communicating)
// Idle split (device lanes; 0 on host lanes), after Holistic Trace Analysis' idle time breakdown: each gap
// [g0, g1) of B (g0 = the end of the previous GPU work, or the rank's first record) is classified by the device
// spans that begin at g1 and their launch time L = the latest begin of a host span with the same correlation id
// (the cudaLaunchKernel / cudaMemcpyAsync call in a Kineto trace):
//   idle_host_wait_ns    the work that ends the gap was launched after it began (min L > g0): the CPU was late
//   idle_kernel_wait_ns  otherwise, gaps shorter than kKernelWaitNs: the GPU's own delay between queued kernels
//   idle_other_ns        the rest: queued work waiting on something else (events, other streams), gaps with no
//                        known launch, and the gap after the rank's last GPU work
// so idle_host_wait + idle_kernel_wait + idle_other = idle_ns on device lanes.
// Rank and run totals sum the steps; their percentages are ratios of the sums.
//
// Cost: one scan of spans, threads and collectives (any order; sorted in memory), O(n log n) per rank. Works with
// and without the query indexes. A run file with summaries (written by merge, capture and import) costs one read of
// its step_summary table instead.
#pragma once

#include <cstdint>
#include <vector>

#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis {

// HTA's default gap below which idle time between queued kernels is launch overhead (its consecutive_kernel_delay,
// 30 in the trace's unit, which is Kineto's µs).
inline constexpr int64_t kKernelWaitNs = 30'000;

struct TimeShares {
  int64_t stepNs = 0;
  int64_t computeNs = 0;
  int64_t commNs = 0;
  int64_t exposedCommNs = 0;
  int64_t otherNs = 0;
  int64_t idleNs = 0;
  int64_t memcpyNs = 0;  // device lanes: memcpy + memset
  int64_t idleHostWaitNs = 0, idleKernelWaitNs = 0, idleOtherNs = 0;  // device lanes: the split of idleNs
  int64_t overlapNs() const { return commNs - exposedCommNs; }
  double pct(int64_t part) const { return stepNs > 0 ? 100.0 * static_cast<double>(part) / stepNs : 0.0; }
  double commOverheadPct() const { return pct(exposedCommNs); }
  TimeShares& operator+=(const TimeShares& o);
};

enum class StepSource : uint8_t { StepSpans, StepStats, SpanSteps, WholeRun };
const char* stepSourceName(StepSource source);  // "step_spans", "step_stats", "span_steps", "whole_run"

enum class Lanes : uint8_t { Host, Device };
const char* lanesName(Lanes lanes);  // "host", "device"

struct StepBreakdown {
  int rank = 0;
  int step = -1;
  int64_t beginNs = 0, endNs = 0;  // the window W
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

// The breakdown of the file: read from its summaries (tracedb/summary.h) when it has current ones, else computed from
// its records. Both give the same result (summary_test checks it on real captures).
tracedb::Result<Breakdown> computeBreakdown(tracedb::Reader& reader);
// Always from the records (what the summaries are made of).
tracedb::Result<Breakdown> computeBreakdownFromRecords(tracedb::Reader& reader);

}  // namespace tpscope::analysis
