// The pipeline bubble, measured: per pipeline stage and step, the time the stage computes nothing, and why.
//
// Input (docs/schema.md): meta 'pipeline' (schedule, stages, microbatches, virtual_stages, stage_of_rank), the
// pass spans "forward mb K" / "backward mb K" [" chunk C"] (one per micro-batch pass of a stage), and the
// point-to-point records (op "send" / "recv" on groups "p2p-<src>-<dst>", keyed by (src, dst, seq)).
//
// Per rank and step, the window is its pipeline's flush: from the first pass any stage of that pipeline begins to the
// last pass any of them ends (the same window for every stage of one pipeline; the optimizer, clipping and the DP
// reduction after it are not pipeline time). In the window:
//   compute            the union of the rank's pass spans
//   bubble             window − compute, split into
//     transfer          time blocked in a receive AFTER the peer posted the matching send (the bytes moving), and
//                       time blocked waiting for its own sends
//     warm-up/cool-down idle time before the stage's first backward pass begins or after its last forward pass
//                       ends: the schedule's structural fill and drain
//     dependency wait   the rest, in steady state: mostly a receive whose send the peer had not posted yet (a
//                       slower neighbour)
// Each figure is the mean over the steps (the first step, which includes warm-up effects of the process, is left
// out when there are more than two) and over the stage's ranks, as a percentage of the window.
// Analytic bubble: (p−1)/(m+p−1) for gpipe and 1f1b, (p−1)/(v·m+p−1) for interleaved (the fraction of the step;
// Megatron's (p−1)/(v·m) is the same bubble relative to the compute).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tpscope/analysis/finding.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis {

struct PipelineStageBubble {
  int stage = 0;
  std::vector<int> ranks;
  double stepNs = 0;     // mean pipeline window per step
  double computeNs = 0;  // mean compute (pass spans) per step
  // The stage's own compute per step: its pass spans less the collectives inside them (TP communication and the wait
  // for a slower TP peer), the median over its ranks and measured steps, so one preempted step does not move it.
  double ownComputeNs = 0;
  double bubblePct = 0, warmupCooldownPct = 0, dependencyWaitPct = 0, transferPct = 0;  // of stepNs
};

struct PipelineReport {
  bool present = false;  // the run had PP > 1 (meta 'pipeline' and pass spans)
  std::string schedule;
  int stages = 0, microbatches = 0, virtualStages = 1;
  double analyticBubblePct = 0;
  int steps = 0;                         // steps measured
  std::vector<PipelineStageBubble> perStage;
  int longestStage = -1;                 // the stage with the most own compute per step
  double longestOverMeanPct = 0;         // how much more own compute it has than the stages' mean, %
};

// Analytic bubble of a schedule, as a fraction of the step (see above).
double analyticPipelineBubble(const std::string& schedule, int stages, int microbatches, int virtualStages);

tracedb::Result<PipelineReport> analyzePipeline(tracedb::Reader& reader);

// The run's pipeline stages from meta 'pipeline' (0 without PP, or when the meta cannot be read).
int pipelineStages(tracedb::Reader& reader);

// stage_imbalance: the longest stage when its compute per step exceeds the stages' mean by >= 10 % (info) or
// >= 25 % (warning); evidence: its stage, ranks, compute_ns, mean_compute_ns, longest_over_mean_pct and the
// other stages' mean dependency wait. None for a run without PP. `cpuWait`: per rank, its threads' wait for a CPU per
// step (the recorder's run delay; empty when not recorded). A compute span's time includes the time its thread was
// descheduled, so where the other stages' ranks each wait longer per step (their median) than the longest stage's
// excess over the mean, the excess is within the host's scheduling noise: info, the noise named.
std::vector<Finding> pipelineFindings(const PipelineReport& report, const std::map<int, double>& cpuWait = {});

// pipeline_hang: a `hang` finding on a point-to-point pseudo-group "p2p-<src>-<dst>" becomes a pipeline_hang, told
// in pipeline terms — which stage never sent (or never received) which micro-batch's activation or gradient — with
// evidence src, dst, seq (as before) plus src_stage, dst_stage, direction ("activation" / "activation_gradient")
// and microbatch: the one the message's records name in their callsite ("pipeline activation of micro-batch K",
// every schedule, interleaved included); for a trace whose callsites do not say, gpipe and 1f1b carry one
// micro-batch per message in order on a pair, so (seq − 1) mod m, and −1 for interleaved. Nothing changes without
// meta 'pipeline'.
void namePipelineHangs(tracedb::Reader& reader, std::vector<Finding>& findings);

}  // namespace tpscope::analysis
