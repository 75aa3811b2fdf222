// Live per-rank gradient-health rules, checked by the trainer every step (LibTorch-free: they see host-side
// numbers only, so the CLI can validate their options and tests can drive them without a model).
//
// Design: one HealthRules per rank turns each step's host numbers (gradient stats, the first non-finite forward
// output, the loss, the DP replicas' norms, a replica fingerprint mismatch) into alerts of the alerts table
// (nonfinite_grad, nonfinite_activation, grad_spike, loss_spike, replica_divergence, silent_corruption; each is
// described at the check that raises it) and a proposed StepAction. The ranks agree on the maximum of their
// actions, and agree() turns it into the step's final action under the policies (HealthPolicy). Spikes are the one
// definition of vocabulary/spike_baseline.h, against baselines of healthy, applied steps only.
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "tpscope/probes/probes.h"
#include "tpscope/vocabulary/spike_baseline.h"

namespace tpscope::rules {

// What a rule does when it fires: off (not checked), warn (alert only), skip-step (every rank agrees to drop the
// update: the trainer all-reduces the MAX of the ranks' actions, see agree()), stop (every rank stops;
// tpscope-train exits 5). trace-ops (the non-finite rule only): warn, and from the next step on check every operator
// until the first that makes a NaN/+Inf is named (core/op_check.h; python/tpscope/_opcheck.py).
enum class HealthPolicy : uint8_t { Off, Warn, SkipStep, Stop, TraceOps };
std::string_view healthPolicyName(HealthPolicy policy);  // "off", "warn", "skip-step", "stop", "trace-ops"
std::optional<HealthPolicy> parseHealthPolicy(std::string_view name);

struct SpikeRule {
  HealthPolicy policy = HealthPolicy::Warn;
  double factor = 10.0;  // value ≥ factor × baseline (SpikeTest::ratio) ...
  double mads = 6.0;     // ... and robust z ≥ mads (SpikeTest::zMin)
  int window = 20;       // healthy steps in the baseline
  int warmup = 5;        // healthy steps needed before the rule can fire
};

struct HealthOptions {
  HealthPolicy nonfinite = HealthPolicy::Warn;
  SpikeRule gradSpike{HealthPolicy::Warn, 10.0, 6.0, 20, 5};
  SpikeRule lossSpike{HealthPolicy::Warn, 2.0, 6.0, 20, 5};
  HealthPolicy replica = HealthPolicy::Warn;
  int replicaEvery = 10;
  double replicaRtol = 1e-5;
  int skipWindow = 10;
  int skipMax = 1;

  // True when some rule may drop or stop a step: every rank must then agree on each step's action.
  bool needsAgreement() const;
};

// Applies `text` on top of `base`. nullopt + `error` ("--health 'x=y': ...") on a bad key or value.
// The text (TPSCOPE_HEALTH, `tpscope capture --health`): comma-separated KEY=VALUE, e.g.
//   "nonfinite=skip-step,grad_spike=stop,grad_spike.factor=8,loss_spike=off,replica.every=5,skip_window=20"
// Keys: nonfinite, grad_spike, loss_spike, replica (policies; replica: off|warn|stop), grad_spike.{factor,mads,
// window,warmup}, loss_spike.{factor,mads,window,warmup}, replica.{every,rtol}, skip_window, skip_max.
std::optional<HealthOptions> parseHealthOptions(std::string_view text, std::string* error,
                                                const HealthOptions& base = {});
std::string formatHealthOptions(const HealthOptions& options);

// The first non-finite forward output of a step (activation_health.h finds it; host numbers only).
struct ActivationFault {
  int layer = -1;     // transformer layer; -1 outside the layers (embedding output, logits)
  std::string where;  // "embedding output", "layers.3 output", "output logits"
  int microBatch = 0;
  uint64_t ticks = 0;  // probes::rawTicks() when that output was produced
  double value = 0;    // the output's sum: NaN or ±Inf
};

// Ordered: the agreed action of a step is the maximum over ranks.
enum class StepAction : int { Continue = 0, SkipStep = 1, Stop = 2 };

// The live rules' window of one series: the previous `window` values of healthy, applied steps (spikes and skipped
// steps never enter), tested by the one spike definition of vocabulary/spike_baseline.h.
using RobustBaseline = vocabulary::SpikeWindow;

// Threading: one HealthRules per rank, used by the training thread only. Alerts go to probes::sink() when it is
// recording, else one line on stderr. A non-finite alert is raised on the first step of a run of consecutive bad
// steps (the policy still acts on every one of them).
class HealthRules {
 public:
  explicit HealthRules(HealthOptions options);

  const HealthOptions& options() const { return options_; }

  // nonfinite_grad: a NaN/Inf in this rank's gradients before any reduction; names the first parameter in model
  // order (lowest layer) where it shows and how many parameters are affected.
  // grad_spike: this rank's pre-reduction gradient norm (√Σ l2² over its parameters) is a spike by the one
  // definition of vocabulary/spike_baseline.h, on its Norm scale: on log10 norms, ≥ factor × the Theil–Sen trend of
  // the last `window` healthy steps (after `warmup` steps) with a robust z of its residual ≥ mads.
  // Pre-reduction per-parameter stats of this rank (probes::GradStat: param, layer, l2Norm, maxAbs, NaN/Inf counts).
  // `wholeModelNorm`: the gradient norm after reduction over every rank (the clip's, equal on every rank); NaN where
  // the caller has none. The rank's own norm is a part of it — one pipeline stage's (stage 0's is mostly the
  // embedding's, whose rows spike with the batch's rare tokens), one DP replica's batch — so a spike of it is a
  // grad_spike only where the whole model's norm moves too, ≥ kWholeModelSpikeRatio × the largest value of the
  // rule's window of healthy steps and ≥ vocabulary::kRunRangeRatio × the largest of the run's healthy steps (the
  // analysis' materiality for a rank no TP peer can vouch for, anomalies.h: a hard batch moves it a few times its
  // median, within the run's own range): the update is made of the reduced gradient. One that does not is neither
  // raised nor learned. `batchLoss`: this rank's loss of the step's batch (NaN where the rank has none, a
  // pipeline stage before the last): a spike on a batch whose loss exceeds the largest of the loss rule's window of
  // healthy steps is the batch's — a hard batch moves its own gradient — and is neither raised nor learned either.
  // A raised grad_spike is info under the warn policy (a rank sees neither its peers nor the steps after: a figure
  // the analysis decides), a warning where the policy acts on it.
  StepAction checkGradients(int step, std::span<const probes::GradStat> stats,
                            double wholeModelNorm = std::numeric_limits<double>::quiet_NaN(),
                            double batchLoss = std::numeric_limits<double>::quiet_NaN());
  static constexpr double kWholeModelSpikeRatio = 5.0;
  // nonfinite_activation: the first non-finite forward output of this rank's step (in forward order: embedding,
  // each transformer layer, the output logits), with its layer, micro-batch and the time it was produced (the alert
  // carries that time, so the rank that produced a NaN first is told from the ranks it spread to through the next
  // all-reduce). Call before checkLoss: a non-finite loss that follows from it raises no second alert (the policy
  // still acts).
  StepAction checkActivation(int step, const ActivationFault& fault);
  // This rank's own loss of the step (mean over its micro-batches, before the DP reduction). nonfinite_activation
  // when it is not finite and no output was watched; loss_spike: the spike definition on its Level scale, ≥ factor
  // × the median and z = (loss − median) / (1.4826 × MAD) ≥ mads.
  StepAction checkLoss(int step, double localLoss);
  // Whether the replica check runs at `step` (every `replicaEvery` steps, when DP > 1 and the rule is on).
  bool replicaCheckDue(int step, int dpSize) const;
  // The smallest and largest reduced gradient norm over this rank's DP group. replica_divergence: they differ by
  // more than rtol (relative): replicas that must be identical are not (checked every `every` steps; costs one DP
  // all-reduce).
  StepAction checkReplicas(int step, double minNorm, double maxNorm, int dpSize);
  // A replica fingerprint mismatch in which this rank is a suspect (raised by each suspect rank once): a critical
  // silent_corruption alert — a tensor that is bitwise identical on every rank of a group by construction has a
  // different 64-bit fingerprint on some rank (replica_vote.h, core's replica_check.h; checked every `every` steps,
  // before each checkpoint and at the last step). Returns the `replica` policy's action (warn: Continue, stop: Stop).
  StepAction silentCorruption(int step, int layer, std::string_view tensor, const std::string& message,
                              const std::string& evidence);
  // Called with the action every rank agreed on (max over ranks) before the update: returns the final action
  // (more than skip_max skipped steps within skip_window escalate to Stop: "don't wake me for ONE bad batch") and
  // records the step in the baselines if healthy (steps that are skipped or spiking never enter them).
  StepAction agree(int step, StepAction agreed);

  int alertsRaised() const { return alerts_; }
  int stepsSkipped() const { return static_cast<int>(skipped_.size()); }

 private:
  void raise(vocabulary::Severity severity, std::string_view kind, int step, int layer, std::string_view param,
             const std::string& message, const std::string& evidence, uint64_t ticks = 0);
  static StepAction actionOf(HealthPolicy policy);
  // A non-finite value at `step`: marks the step unhealthy and records it in `lastBadStep`. True when it starts a
  // run of bad steps (the step before was healthy): non-finite alerts are raised once per run.
  bool startsBadRun(int& lastBadStep, int step);

  HealthOptions options_;
  RobustBaseline gradBase_, lossBase_;
  std::optional<double> pendingGradNorm_, pendingLoss_;  // this step's values, added by agree() if healthy
  RobustBaseline wholeBase_;  // healthy steps' whole-model norms (after reduction)
  double wholeRunMax_ = 0;    // the largest of them over the whole run
  std::optional<double> pendingWholeNorm_;
  bool pendingUnhealthy_ = false;
  std::deque<int> skipped_;  // steps skipped within the window
  int lastNonfiniteGradStep_ = -2, lastNonfiniteLossStep_ = -2;  // non-finite alerts: once per run of bad steps
  int lastNonfiniteActStep_ = -2;
  int alerts_ = 0;
};

}  // namespace tpscope::rules
