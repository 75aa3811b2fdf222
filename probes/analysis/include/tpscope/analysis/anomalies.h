// Gradient and loss anomalies: spikes of gradient norms and of the loss, replicas that diverge after reduction,
// layer trends, and ranks whose gradient alone jumps. Non-finite values are left to the NaN analysis (nonfinite.h).
//
// Spikes: the one definition of vocabulary/spike_baseline.h (shared with the live rules, rules/health_rules.h),
// gradient norms on its Norm scale, the loss on its Level scale. On top of that causal test the analysis looks
// forward, which the live rules cannot: a spike must be transient (a jump that stays is a level shift, and enters
// the window as the new level), and a parameter's spike is a warning only when material (Spike::material). A
// run-wide spike at a step where some rank's own parameters spiked is folded into those findings (one line).
// False-alarm rate: were the residuals normal, P(z ≥ 6) ≈ 1e-9 per test; the ratio conditions bound heavier tails.
// docs/diagnosis.md ("Gradient and loss anomalies") has the rules in full and the accuracy benchmark's figure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tpscope/analysis/finding.h"
#include "tpscope/analysis/run_info.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis {

struct AnomalyOptions {
  int window = 20;              // previous finite values in the baseline
  int minHistory = 5;
  double zThreshold = 6.0;
  double ratioThreshold = 2.0;
  double minSigmaDecades = 0.05;  // floor of the robust σ of log10 norms (about ±12 %)
  // Where later steps exist, the median of the next (up to) transientSteps values must be below x / ratioThreshold
  // for a spike (a jump that stays is a level shift, shown by the layer trends).
  int transientSteps = 3;
  double normRatioThreshold = 5.0;     // the run-wide global grad norm: ≥ 5× its baseline (clipping absorbs less)
  // Per-parameter norms (grad_stats) swing several-fold in healthy training: there a spike must also be at least
  // paramRatioThreshold × the median, with at least paramMinHistory previous values.
  int paramMinHistory = 8;
  double paramRatioThreshold = 10.0;
  double divergenceTolerance = 1e-3;
};

struct Spike {
  int rank = -1;       // -1: run-wide (loss)
  int step = 0;
  int layer = -1;
  std::string param;   // "" for a global grad norm or the loss
  double value = 0, median = 0, mad = 0, z = 0;  // median on the value's scale; mad in decades for grad norms
  // A warning when material (else info): it moves the update beyond what the run's own batches do. For a
  // parameter: the rank's total norm (√Σ l2² over its parameters) that step ≥ normRatioThreshold × its median over
  // the previous window, and the whole model's norm (step_stats.grad_norm, the clip's after reduction over every
  // rank, what the update is made of) ≥ normRatioThreshold × the LARGEST it reached over the previous window. A
  // parameter jumping 10–60× on one bad batch while the rank's total moves < 5× is a figure; so is a rank's total
  // that the reduction averages away (one pipeline stage's: stage 0's is mostly the embedding's, which spikes with a
  // batch's rare tokens; one DP replica's batch), and a hard batch's jump of the whole norm, 3–8× its median with the
  // loss rising with it, within 2–3× the largest of the steps before it. Without step_stats the rank's total decides
  // alone. For the run-wide spike: also ≥ normRatioThreshold × the largest of the previous window.
  bool material = true;
  // Where not material for a reason a line can tell (the batch's, seen on a TP peer): that line.
  std::string explained{};
};

// Values that must agree after reduction do not: step_stats.grad_norm (the global norm after reduction, equal on
// every rank of a step), or, when meta 'grad_stats_after_reduction' = "1", the DP replicas' grad_stats l2 norms per
// (step, tp_rank, param) (the recorder takes them before reduction by default, when replicas differ by design).
// Relative spread (max − min) / max > divergenceTolerance is a divergence.
struct Divergence {
  int step = 0;
  std::string what;    // "grad_norm" or a parameter name
  int tpRank = -1;     // for per-parameter DP comparisons
  std::vector<int> ranks;
  double minValue = 0, maxValue = 0, relSpread = 0;
  int minRank = -1, maxRank = -1;
};

// One rank's gradient standing out at a step (no finding of its own): its total norm (√Σ l2² over its parameters,
// grad_stats) is ≥ normRatioThreshold × its median over the previous window (at least one previous step), while
// every other rank that recorded the step stays below that ratio. Evidence for other analyses: replicas that part at
// such a step part because of that rank's gradients (sdc.h, explainDivergences), even where the step comes too early
// for the spike test's history.
struct RankJump {
  int rank = -1;
  int step = -1;
  double norm = 0;         // the rank's total gradient norm at the step
  double median = 0;       // its median over the previous steps
  int history = 0;         // the previous steps the median is over
  double othersRatio = 0;  // the largest ratio (total / own median) among the other ranks at that step
};

// Per layer, the median over ranks and params of grad_stats.l2_norm per step; the trend is the least-squares slope of
// log10(norm) over steps.
struct LayerTrend {
  int layer = -1;
  int steps = 0;
  double firstNorm = 0, lastNorm = 0;  // median norm at the first and last step
  double decadesPer100Steps = 0;
};

struct AnomalyReport {
  // grad_spike per (rank, param) over grad_stats.l2_norm, with the stricter paramMinHistory/paramRatioThreshold,
  // reported per (rank, step), worst param first; and run-wide (rank −1) over step_stats.grad_norm, per step the
  // mean over the ranks, at normRatioThreshold (5×: a 2–4× jump of the clipped global norm on one batch is ordinary).
  std::vector<Spike> gradSpikes;   // by step, rank, z desc
  std::vector<Spike> lossSpikes;   // by step; over step_stats.loss, per step the mean over the ranks that recorded it
  std::vector<Divergence> divergences;
  std::vector<LayerTrend> layerTrends;  // by layer
  std::vector<RankJump> rankJumps;      // by step, rank
};

tracedb::Result<AnomalyReport> analyzeAnomalies(tracedb::Reader& reader, const RunInfo& info,
                                                const AnomalyOptions& options = {});
std::vector<Finding> anomalyFindings(const AnomalyReport& report, const RunInfo& info);

// A rank jump told as a grad_spike finding (warning) — for a jump that another finding rests on (replicas parting
// at that step) where the spike test had too little history to flag it.
Finding rankJumpFinding(const RankJump& jump, const AnomalyOptions& options = {});

}  // namespace tpscope::analysis
