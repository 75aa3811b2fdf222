// The one definition of "first" for non-finite values, shared by the live health rule (rules/), the NaN/Inf origin
// analysis (probes/analysis) and the viewer (through the analysis' origin finding).
//
// Among one rank's non-finite gradients of one step, the first is the one the backward pass produced first: the
// highest transformer layer (backward computes layer L's gradients before layer L−1's, so a value born at layer L
// reaches lower layers afterwards); parameters outside the layers (layer −1: embedding, final norm) count as
// computed last. Across steps the earlier step is first; within a step, a record with a time (an alert) comes before
// one without, and the earlier time first. Header-only and dependency-free (the vocabulary's rule).
#pragma once

namespace tpscope::vocabulary {

// A key that sorts gradients in backward order: smaller = produced earlier in the backward pass.
constexpr long backwardOrderKey(int layer) noexcept { return layer >= 0 ? -static_cast<long>(layer) : 1L << 30; }

// True when a gradient of layer `a` was produced before one of layer `b` in the same backward pass.
constexpr bool producedBefore(int a, int b) noexcept { return backwardOrderKey(a) < backwardOrderKey(b); }

}  // namespace tpscope::vocabulary
