// The kinds of alert the live health rules raise (probes::Alert::kind, stored in alerts.kind), in one place for the
// rules that raise them and the analyses and commands that read them back. A kind is snake_case; the non-finite
// ones share the prefix kNonfinitePrefix. Header-only, no dependencies.
#pragma once

#include <string_view>

namespace tpscope::vocabulary::alert_kinds {

inline constexpr std::string_view kNonfiniteGrad = "nonfinite_grad";              // NaN/Inf in a gradient
inline constexpr std::string_view kNonfiniteActivation = "nonfinite_activation";  // NaN/Inf in the forward pass
inline constexpr std::string_view kGradSpike = "grad_spike";                      // grad norm far above its trend
inline constexpr std::string_view kLossSpike = "loss_spike";                      // loss far above its trend
inline constexpr std::string_view kReplicaDivergence = "replica_divergence";      // replicas that must agree differ
inline constexpr std::string_view kTooManySkippedSteps = "too_many_skipped_steps";
inline constexpr std::string_view kSilentCorruption = "silent_corruption";        // a replica's bits differ
// The op check (core/op_check.h, python/tpscope/_opcheck.py): a rank's first operator whose output holds a NaN/+Inf
// (in `tpscope replay`'s run, or live under --on-nonfinite trace-ops: evidence live = true), or that the replayed step
// ran clean there. `replay`: tpscope replay's verdict, in the replayed run (evidence: the replay's JSON).
inline constexpr std::string_view kOpCheck = "op_check";
inline constexpr std::string_view kOpCheckClean = "op_check_clean";
inline constexpr std::string_view kReplay = "replay";

// Every non-finite kind starts with it (the analysis of the first NaN selects alerts by it).
inline constexpr std::string_view kNonfinitePrefix = "nonfinite";

}  // namespace tpscope::vocabulary::alert_kinds
