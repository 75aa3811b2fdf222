// Time breakdown per rank and step: compute, communication, exposed communication, other busy time, idle.
//
// Definitions (all in ns; docs/diagnosis.md has the long form). For one rank, over all its threads and streams:
//   C = ∪ intervals of compute spans   (kinds compute, optimizer, kernel, memcpy, memset)
//   M = ∪ intervals of communication   (kinds comm, nccl_kernel, and every collective record of the rank from
//                                        coalesce(start_ns, enqueue_ns) to end_ns; records without end_ns are left
//                                        out — a collective that never completed is a hang, not a duration)
//   B = ∪ intervals of every span except kind step, and M
// A step window W of that rank is, in order of preference: its Step spans (kind 4; several on one step are merged
// into [min begin, max end]); else step_stats [begin_ns, end_ns]; else the extent of the spans labelled with that
// step; a file with no step information at all gives one window, step -1, over the rank's whole extent.
//   step_ns         = |W|
//   compute_ns      = |C ∩ W|
//   comm_ns         = |M ∩ W|
//   exposed_comm_ns = |(M \ C) ∩ W|            communication that no compute overlapped
//   other_ns        = |(B \ (C ∪ M)) ∩ W|      data loading, checkpoint, waits, other spans
//   idle_ns         = |W \ B|                  nothing recorded
// so compute + exposed_comm + other + idle = step_ns exactly.
//   comm_overhead_pct = 100 · exposed_comm_ns / step_ns   (the share of step time spent only communicating)
// Rank and run totals sum the steps; their percentages are ratios of the sums.
//
// Cost: one scan of spans and collectives (any order; sorted in memory), O(n log n) per rank. Works with and
// without the query indexes.
#pragma once

#include <cstdint>
#include <vector>

#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis {

struct TimeShares {
  int64_t stepNs = 0;
  int64_t computeNs = 0;
  int64_t commNs = 0;
  int64_t exposedCommNs = 0;
  int64_t otherNs = 0;
  int64_t idleNs = 0;
  double pct(int64_t part) const { return stepNs > 0 ? 100.0 * static_cast<double>(part) / stepNs : 0.0; }
  double commOverheadPct() const { return pct(exposedCommNs); }
  TimeShares& operator+=(const TimeShares& o);
};

enum class StepSource : uint8_t { StepSpans, StepStats, SpanSteps, WholeRun };
const char* stepSourceName(StepSource source);  // "step_spans", "step_stats", "span_steps", "whole_run"

struct StepBreakdown {
  int rank = 0;
  int step = -1;
  int64_t beginNs = 0, endNs = 0;  // the window W
  TimeShares time;
};

struct RankBreakdown {
  int rank = 0;
  int steps = 0;  // windows summed
  TimeShares time;
};

struct Breakdown {
  StepSource source = StepSource::WholeRun;  // the source of the windows (the first rank's, when they differ)
  std::vector<StepBreakdown> steps;          // by rank, then step
  std::vector<RankBreakdown> ranks;          // by rank
  TimeShares run;                            // sum over ranks
};

tracedb::Result<Breakdown> computeBreakdown(tracedb::Reader& reader);

}  // namespace tpscope::analysis
