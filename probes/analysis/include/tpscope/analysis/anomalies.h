// Gradient and loss anomalies.
//
// Spikes: the one definition of probes/spike_baseline.h (shared with the live rules, rules/health_rules.h): the
// window of a series at step t is its previous `window` usable values that were not spikes; gradient norms are tested
// on its Norm scale (log10, against the window's Theil–Sen trend), the loss on its Level scale (the median); a spike
// is ≥ ratioThreshold × the baseline with a robust z ≥ zThreshold, after minHistory values.
// On top of that causal test the analysis looks forward (the live rules cannot):
// A spike is transient: where later steps exist, the median of the next (up to) transientSteps values must be
// below x / ratioThreshold; a jump that stays is a level shift (early training, warm-up), shown by the layer trends,
// and enters the window as the new level. A confirmed spike does not enter it.
// A run-wide spike at a step where some rank's own parameters spiked is folded into those findings (one line).
// False-alarm rate: were the residuals normal, P(z ≥ 6) ≈ 1e-9 per test; real series have heavier tails, which the
// ratio condition (≥ 2× for the loss, ≥ 5× for the global norm, ≥ 10× for one parameter) bounds. Measured on the
// accuracy benchmark's healthy runs (bench/accuracy, docs/diagnosis.md): the figure is there.
//   grad_spike (per rank, param): over grad_stats.l2_norm, with the stricter paramMinHistory/paramRatioThreshold;
//   reported per (rank, step), worst param first. A warning when material — it moves the update beyond what the
//   run's own batches do: the rank's total norm (√Σ l2² over its parameters) that step ≥ normRatioThreshold × its
//   median over the previous window, and the whole model's norm (step_stats.grad_norm, the clip's after reduction
//   over every rank, what the update is made of) ≥ normRatioThreshold × the LARGEST it reached over the previous
//   window (beyond the run's own range) — else info. A parameter jumping 10–60× on one bad batch while the rank's
//   total moves < 5× is a figure; so is a rank's total that the reduction averages away (one pipeline stage's: stage
//   0's is mostly the embedding's, which spikes with a batch's rare tokens; one DP replica's batch), and a hard
//   batch's jump of the whole norm, 3–8× its median with the loss rising with it, within 2–3× the largest of the
//   steps before it. Without step_stats the rank's total decides alone.
//   grad_spike (run-wide, rank −1): over step_stats.grad_norm, per step the mean over the ranks, ratio
//   normRatioThreshold (5×: a 2–4× jump of the clipped global norm on one batch is ordinary); a warning when it is
//   also ≥ normRatioThreshold × the largest of the previous window, else info (as a rank's, above)
//   loss_spike: over step_stats.loss, per step the mean over the ranks that recorded it
// Non-finite values are left to the NaN analysis (nonfinite.h).
// Replica divergence: values that must agree after reduction do not.
//   step_stats.grad_norm is the global norm after reduction: equal on every rank of a step. Relative spread
//   (max − min) / max > divergenceTolerance is a divergence.
//   grad_stats: when meta 'grad_stats_after_reduction' = "1", per (step, tp_rank, param) the DP replicas' l2 norms
//   are compared the same way (the recorder takes them before reduction by default, when replicas differ by design).
// Layer trends: per layer, the median over ranks and params of grad_stats.l2_norm per step; the trend is the
// least-squares slope of log10(norm) over steps, in decades per 100 steps.
// Rank jumps (no finding of their own): steps where exactly one rank's own gradient stands out — its total norm
// (√Σ l2² over its parameters, grad_stats) is ≥ normRatioThreshold × its median over the previous window (at least
// one previous step), while every other rank that recorded the step stays below that ratio. Evidence for other
// analyses: replicas that part at such a step part because of that rank's gradients (sdc.h, explainDivergences),
// even where the step comes too early for the spike test's history.
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
  int transientSteps = 3;         // later values that must fall back for a spike (a jump that stays is a shift)
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
  bool material = true;  // moves the update beyond the run's own range (a warning; else info): see grad_spike above
};

struct Divergence {
  int step = 0;
  std::string what;    // "grad_norm" or a parameter name
  int tpRank = -1;     // for per-parameter DP comparisons
  std::vector<int> ranks;
  double minValue = 0, maxValue = 0, relSpread = 0;
  int minRank = -1, maxRank = -1;
};

// One rank's gradient standing out at a step (see "Rank jumps" above).
struct RankJump {
  int rank = -1;
  int step = -1;
  double norm = 0;         // the rank's total gradient norm at the step
  double median = 0;       // its median over the previous steps
  int history = 0;         // the previous steps the median is over
  double othersRatio = 0;  // the largest ratio (total / own median) among the other ranks at that step
};

struct LayerTrend {
  int layer = -1;
  int steps = 0;
  double firstNorm = 0, lastNorm = 0;  // median norm at the first and last step
  double decadesPer100Steps = 0;
};

struct AnomalyReport {
  std::vector<Spike> gradSpikes;   // by step, rank, z desc
  std::vector<Spike> lossSpikes;   // by step
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
