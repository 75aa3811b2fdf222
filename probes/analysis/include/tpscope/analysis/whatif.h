// What-if: the step time without the problem, from the run's own records (after Lumos and ByteDance's trace replay).
//
// The model: every step's dependency graph across ranks, from the spans and the collective records — each lane's
// work in order (a thread of the rank, or a GPU stream on device lanes); a collective is ready when its last member
// arrives plus its transfer (the duration measured on the last arriver); a blocked lane resumes when the collectives
// it waits for are ready; a point-to-point receive waits for its send. Replaying that graph with the measured
// durations gives the replayed step time, which should match the measured one (a large gap means a dependency the
// records do not show). Each change (WhatIfChangeKind) is replayed on its own against it.
// docs/diagnosis.md ("What if") has the graph, the changes, and the assumptions and limits in full.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis {

struct WhatIfOptions {
  std::optional<double> busbwGbps;  // collective_busbw: the bus bandwidth, GB/s (1e9 bytes/s)
  std::string collective;           // its target: "OP" or "CLASS:OP" ("tp:all_reduce"); "": the costliest on the path
  // The steps whose critical path may be listed (WhatIfReport::criticalStep): the median of those measured; none
  // measured or empty: the median of every measured step. The HTML report passes the steps its timeline shows.
  std::vector<int> pathSteps;
};

enum class WhatIfChangeKind : uint8_t {
  // The rank whose work most exceeds its peers' (same pipeline stage; all ranks without PP), each of its work segments
  // of a step at the median of its peers' same segment (their k-th of that step), or its step's work scaled to their
  // median total where the segments do not correspond.
  Straggler,
  // Pipeline runs: every stage's work inside its passes scaled to the stages' mean own compute (pipeline.h): the
  // layers re-split evenly, the total work kept.
  StageImbalance,
  // Every transfer (collectives and point-to-point) takes no time: communication fully overlapped; ranks still wait
  // for each other.
  CommOverlapped,
  // Pipeline runs, analytic (not replayed): the pipeline's window at the schedule's analytic bubble for the longest
  // stage's compute, C / (1 − b).
  PipelineBubble,
  // With WhatIfOptions::busbwGbps: one kind of collective (group class and op, the one with the most transfer on the
  // critical path unless named) moves S bytes at that bus bandwidth: transfer = S · factor(op, n) / busbw
  // (nccl-tests' convention, collectives.h).
  CollectiveBusbw
};
const char* whatIfChangeName(WhatIfChangeKind kind);  // "straggler", "stage_imbalance", "comm_overlapped", ...

struct WhatIfChange {
  WhatIfChangeKind kind = WhatIfChangeKind::Straggler;
  std::string description;     // what was changed, in words ("rank 1's work at its peers' median, 30.2 ms/step")
  double predictedStepNs = 0;  // measured − saving
  double savingNs = 0;         // replayed without the change − replayed with it (median over the steps)
  // Ranks whose critical path it shortens: their work, or a transfer measured on them, on a step's critical path (the
  // chain that sets the latest step end) gets shorter.
  std::vector<int> ranks;
  bool replayed = true;        // false: analytic (pipeline_bubble)
  int rank = -1;               // straggler: the rank; stage_imbalance: -1
  int stage = -1;              // stage_imbalance: the stage
  std::string collective;      // collective_busbw: "CLASS:OP"
};

// One stretch of the critical path, placed where it lies in the trace so that it can be drawn over the timeline:
// a lane's work between two of its events, or a collective's transfer on the rank it was measured on (from that
// rank's arrival). startNs/endNs are measured times on the run file's clock, the clock of the spans' begin_ns (device
// lanes: the rank's own clock again, before alignOnKernelEnds' shift). A stretch that began before the step did
// (the walk crossed the step's earliest begin) is cut at that begin.
struct WhatIfSegment {
  int rank = -1;
  int thread = -1;   // the lane: the rank's thread (host) or GPU stream (device) it lies on, as spans.thread; -1: none
  std::string kind;  // "compute" (a lane's work) or "transfer"
  std::string what;  // transfer: "tp-0 all_reduce"; compute: "" (device lanes: "stream N")
  int64_t durNs = 0;
  int count = 1;         // segments merged (consecutive ones of one lane and kind)
  int64_t startNs = 0;   // the first merged piece's start
  int64_t endNs = 0;     // the last merged piece's end: endNs − startNs ≥ durNs (merged pieces may leave gaps)
};

struct WhatIfReport {
  int steps = 0;        // steps measured
  int firstStep = -1;   // the first of them
  bool device = false;  // read on device lanes (GPU streams)
  // The median over the steps of the mean over ranks of the step windows (breakdown.h); the first step is left out
  // when there are more than two (the process's warm-up). Medians, so that a step the host preempted does not move
  // the figures.
  double measuredStepNs = 0;
  double replayedStepNs = 0;  // the replay with no change
  std::vector<WhatIfChange> changes;
  int criticalStep = -1;  // the step whose critical path is listed: the median measured step (WhatIfOptions)
  std::vector<WhatIfSegment> criticalPath;  // in time order: startNs non-decreasing
  int64_t criticalPathNs = 0;               // its total: the sum of the segments' durNs
  // What the model saw: blocking spans bound to a record and left as work, records bound to no blocking span,
  // collectives (and messages), collectives released without all their arrivals.
  int64_t boundBlocks = 0, unboundBlocks = 0, unboundRecords = 0, collectives = 0;
  int forced = 0;
  std::vector<std::string> notes;  // why a change is absent ("no pipeline stages", ...)
};

// Cost: one scan of the spans of kinds comm, wait and nccl_kernel, of the collectives, and the breakdown; each replay
// is linear in the events.
tracedb::Result<WhatIfReport> analyzeWhatIf(tracedb::Reader& reader, const WhatIfOptions& options = {});

// {"file","steps","first_step","lanes","measured_step_ms","replayed_step_ms","replay_gap_pct","changes":[{"change",
//  "description","predicted_step_ms","saving_ms","saving_pct","ranks","replayed"}],"critical_step","critical_path":
//  [{"rank","kind","what","ms","segments","thread","start_ns","end_ns"}],"model":{...},"notes":[...]}
// start_ns / end_ns: WhatIfSegment's, integers on the run file's clock (the spans' begin_ns); thread: -1 for none.
std::string whatIfToJson(const WhatIfReport& report, const std::string& file, int indent = 2);

// The critical path in one line, as the HTML report and the viewer show it: "critical path of step 7:
// 47.000 ms, compute 45.000 ms, transfer 2.000 ms"; "" when the report lists none.
std::string criticalPathSummary(const WhatIfReport& report);

}  // namespace tpscope::analysis
