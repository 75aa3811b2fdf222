// Dynamic loss scaling (fp16 training): the loss is multiplied by `scale()` before backward so small fp16 gradients
// do not flush to zero; the gradients are divided by it again before clipping and the update. When the gradients of a
// step overflow (their global norm is not finite), the update is skipped and the scale halves; after `window`
// overflow-free steps in a row it doubles. The same policy as PyTorch's GradScaler (growth 2, backoff 0.5) and
// Megatron-LM's DynamicGradScaler without hysteresis.
//
// Every rank must take the same decision. The trainer feeds it the global gradient norm after the DP all-reduce and
// the TP all-reduce of the clipping norm, which is identical on every rank, so no extra collective is needed.
// Pure logic (no LibTorch); powers of two keep scaling and unscaling exact in floating point.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace tpscope::core {

class DynamicLossScaler {
 public:
  DynamicLossScaler(double initialScale, int64_t window, double minScale = 1.0)
      : scale_(initialScale), window_(std::max<int64_t>(1, window)), minScale_(minScale) {}

  double scale() const { return scale_; }
  int64_t goodSteps() const { return good_; }

  // After the step's gradients are reduced: `globalNorm` is the norm of the UNSCALED gradients (any value).
  // Returns true when the update must be skipped (overflow) and adjusts the scale for the next step.
  bool update(double globalNorm) {
    if (!std::isfinite(globalNorm)) {
      scale_ = std::max(minScale_, scale_ * 0.5);
      good_ = 0;
      ++overflows_;
      return true;
    }
    if (++good_ >= window_) {
      scale_ *= 2.0;
      good_ = 0;
    }
    return false;
  }
  int64_t overflows() const { return overflows_; }
  // From a checkpoint: the scale and the overflow-free streak at the step it was saved.
  void restore(double scale, int64_t goodSteps) {
    scale_ = scale;
    good_ = goodSteps;
  }

 private:
  double scale_;
  int64_t window_;
  double minScale_;
  int64_t good_ = 0;
  int64_t overflows_ = 0;
};

}  // namespace tpscope::core
