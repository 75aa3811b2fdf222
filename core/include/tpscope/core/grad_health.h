// Per-parameter gradient health: L2 norm, max |g|, NaN count, Inf count — for all parameters in ONE batched
// pass over a flat buffer (vectorised reductions over per-parameter views) and ONE host sync per step (in
// `gradStatsOnHost`). Computed before any DP/TP gradient reduction, so a NaN is attributed to the rank that made it.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "tpscope/probes/probes.h"

namespace tpscope::core {

// Stats of P tensors, on their device. The counts stay integers from the tensor to the trace row: fp32 counts exactly
// only up to 2^24 elements, and a vocabulary shard is larger.
struct GradHealthStats {
  at::Tensor values;  // [P, 2] fp32, columns GradHealthColumn: L2 norm, max |g|
  at::Tensor counts;  // [P, 2] int64, columns GradCountColumn: NaN count, Inf count
  // Per tensor, its sum of squares exactly as gradSumSquares gives it, where the stats came from its one host pass
  // (CPU, fp32, contiguous; gradHealth only); -1 elsewhere. The trainer's clip takes these instead of reading the
  // gradients again when nothing changed them in between (DP = 1, no PP, no SP, no loss scale).
  std::vector<double> sumSquares;
  bool defined() const { return values.defined(); }
};
enum GradHealthColumn : int { kL2Norm = 0, kMaxAbs = 1 };
enum GradCountColumn : int { kNanCount = 0, kInfCount = 1 };

// Segment description for a flat buffer holding tensors of `numels` back to back: their lengths, int64 [P] on the
// host. Build once and reuse.
at::Tensor gradHealthSegments(const std::vector<int64_t>& numels);
// Stats of the P tensors laid out in `flat` (fp32 or bf16), on the buffer's device. No host sync.
GradHealthStats gradHealthFlat(const at::Tensor& flat, const at::Tensor& segments, int64_t count);
// Same for separate tensors (undefined tensors count as empty). No host sync.
GradHealthStats gradHealth(const std::vector<at::Tensor>& grads);

// The sum of squares of `g` in double from one host pass (CPU fp32 contiguous: the pass gradHealth takes, so the two
// agree to the bit); -1 for any other tensor (the caller reduces it on its device).
double gradSumSquares(const at::Tensor& g);

// Copies `stats` to the host (the one sync of the step) as one row per parameter, named by `names` (the rows view
// those strings: keep them alive) — for `sink.gradStats` and the health rules alike.
std::vector<probes::GradStat> gradStatsOnHost(const std::vector<std::string>& names, const std::vector<int>& layers,
                                              const std::vector<int64_t>& numels, const GradHealthStats& stats);

}  // namespace tpscope::core
