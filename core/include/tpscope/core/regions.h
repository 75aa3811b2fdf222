// Megatron's tensor-parallel autograd regions, named by their forward / backward contracts.
//
//   copyToTp                forward: identity              backward: all-reduce (sum) over TP
//   reduceFromTp            forward: all-reduce over TP    backward: identity
//   scatterToTp             forward: split last dim        backward: all-gather last dim
//   gatherFromTp            forward: all-gather last dim   backward: split last dim
//   gatherFromSequence      forward: all-gather along seq  backward: reduce-scatter along seq   (sequence parallel)
//   reduceScatterToSequence forward: reduce-scatter seq    backward: all-gather along seq      (sequence parallel)
//
// Activations are [batch, seq, hidden]; the sequence dimension is 1. With a one-member TP communicator every region
// returns its input unchanged (the world-size-1 bypass) and no collective is issued.
// The communicator and the callsite must outlive the backward pass (layers own both).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "tpscope/core/callsite.h"
#include "tpscope/core/communicator.h"

namespace tpscope::core {

inline constexpr int64_t kSeqDim = 1;

at::Tensor copyToTp(const at::Tensor& x, Communicator& tp, const Callsite& site);
at::Tensor reduceFromTp(const at::Tensor& x, Communicator& tp, const Callsite& site);
at::Tensor scatterToTp(const at::Tensor& x, Communicator& tp, const Callsite& site);
at::Tensor gatherFromTp(const at::Tensor& x, Communicator& tp, const Callsite& site);
at::Tensor gatherFromSequence(const at::Tensor& x, Communicator& tp, const Callsite& site);
at::Tensor reduceScatterToSequence(const at::Tensor& x, Communicator& tp, const Callsite& site);

// Backward spans of a layer without hooks into autograd's engine: `x = backwardSpanEnd(x, ...)` on the layer's
// input and `y = backwardSpanBegin(y, slot)` on its output. The Begin node's backward runs first in the layer's
// backward (stores t0 in `slot`), the End node's backward last (emits the span). Both are identities and are only
// inserted while probes are recording; `site` and `slot` must outlive the backward pass.
struct BackwardSpanSlot {
  uint64_t t0 = 0;
};
at::Tensor backwardSpanBegin(const at::Tensor& y, BackwardSpanSlot& slot);
at::Tensor backwardSpanEnd(const at::Tensor& x, const probes::Site& site, int layer, BackwardSpanSlot& slot);

}  // namespace tpscope::core
