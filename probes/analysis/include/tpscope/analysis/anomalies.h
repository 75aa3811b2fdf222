// Gradient and loss anomalies.
//
// Robust baseline: for a series x_1..x_t (one rank's per-parameter l2 norm, one rank's global grad norm, or the
// run's loss), the baseline of step t is median m and MAD d = median|x_i − m| of the previous `window` finite values
// (at least `minHistory`). The robust z-score is z = (x_t − m) / (1.4826 · d) (1.4826·MAD estimates σ under
// normality); with d = 0, z is computed with d replaced by 1e-3·|m| (a flat series). A spike is z ≥ zThreshold and
// x_t ≥ ratioThreshold · m. Non-finite values are left to the NaN analysis (nonfinite.h).
//   grad_spike (per rank, param): over grad_stats.l2_norm, with the stricter paramMinHistory/paramRatioThreshold;
//   reported per (rank, step), worst param first
//   grad_spike (run-wide, rank −1): over step_stats.grad_norm, per step the mean over the ranks
//   loss_spike: over step_stats.loss, per step the mean over the ranks that recorded it
// Replica divergence: values that must agree after reduction do not.
//   step_stats.grad_norm is the global norm after reduction: equal on every rank of a step. Relative spread
//   (max − min) / max > divergenceTolerance is a divergence.
//   grad_stats: when meta 'grad_stats_after_reduction' = "1", per (step, tp_rank, param) the DP replicas' l2 norms
//   are compared the same way (the recorder takes them before reduction by default, when replicas differ by design).
// Layer trends: per layer, the median over ranks and params of grad_stats.l2_norm per step; the trend is the
// least-squares slope of log10(norm) over steps, in decades per 100 steps.
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
  double value = 0, median = 0, mad = 0, z = 0;
};

struct Divergence {
  int step = 0;
  std::string what;    // "grad_norm" or a parameter name
  int tpRank = -1;     // for per-parameter DP comparisons
  std::vector<int> ranks;
  double minValue = 0, maxValue = 0, relSpread = 0;
  int minRank = -1, maxRank = -1;
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
};

tracedb::Result<AnomalyReport> analyzeAnomalies(tracedb::Reader& reader, const RunInfo& info,
                                                const AnomalyOptions& options = {});
std::vector<Finding> anomalyFindings(const AnomalyReport& report, const RunInfo& info);

}  // namespace tpscope::analysis
