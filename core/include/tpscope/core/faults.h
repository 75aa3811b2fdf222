// Fault injection and the live health policy inside a rank of the engine: the few hooks the trainer and the
// communicator call. Specs (fault_spec.h) come from TPSCOPE_INJECT (set by `tpscope capture --inject` or
// `tpscope-train --inject`); health options (health_rules.h) from TPSCOPE_HEALTH (`--on-nonfinite`, `--health`).
//
// Design: each fault goes through the real code path it breaks — a gradient hook, the model's layer output, the
// communicator's entry to a collective or its result, the start of a step, a parameter after the update — so the
// recorder, the health rules and the analysis see it as they would see the real failure. Each FaultInjector hook
// below says which faults it carries out and how. Health policy: see StepHooks::beforeUpdate.
//
// Threading: the training thread only. activeFaults() is one relaxed atomic load.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "tpscope/core/callsite.h"
#include "tpscope/probes/probes.h"
#include "tpscope/rules/fault_spec.h"
#include "tpscope/rules/health_rules.h"

namespace tpscope::core {

class ActivationWatch;
class Communicator;
class Mesh;
class OpCheck;

// Thrown out of Trainer::trainStep when every rank agreed to stop on non-finite values (policy stop, or too many
// skipped steps). tpscope-train turns it into exit status 5.
class NonFiniteStop : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class FaultInjector {
 public:
  // `specs`: the faults of this rank only (others are ignored).
  FaultInjector(std::vector<rules::FaultSpec> specs, int rank);

  const std::vector<rules::FaultSpec>& specs() const { return specs_; }
  bool has(rules::FaultKind kind) const;
  int step() const { return step_; }

  // Trainer: start of step `step`. slow: the step starts with M ms of extra compute (a busy loop inside a span
  // "injected slow compute"). crash: std::abort() at the start of step S (SIGABRT, as a real crash: the recorder's
  // crash handler dumps what it holds before the process dies).
  void stepBegin(int step);
  // Where this rank is a pipeline stage (StepHooks sets it), `slow` is spread over the stage's forward passes
  // (slowPass) instead of one span at the start of the step: the stage computes slower, as on a slower device, so
  // its passes are longer and the other stages wait on its sends (stage imbalance, not a late start).
  void spreadSlowOverPasses() { slowInPasses_ = true; }
  // PipelineRunner, inside each forward pass span: 1/`passesPerStep` of this rank's slow delay.
  void slowPass(int passesPerStep);
  // PipelineRunner, before each forward or backward pass: the micro-batch it runs (a spec with mb=K fires only in
  // micro-batch K's passes); -1 outside a pass.
  void setMicrobatch(int microbatch) { microbatch_ = microbatch; }
  // Trainer, once, before the DP reducer registers its hooks: gradient hooks for nan/inf/spike. nan/inf with
  // phase=bwd (the default): the hook on the target parameter (registered BEFORE the DP reducer's, so the reducer,
  // the gradient-health stats and the DP all-reduce all see the bad value) writes one NaN/+Inf into its gradient at
  // step S — the first parameter of layer L, or of layer 0 without layer=. spike: hooks on every parameter multiply
  // the gradients by F during step S.
  void attachGradientHooks(const std::vector<std::string>& names, const std::vector<int>& layers,
                           std::vector<at::Tensor> params);
  // Model, after each transformer layer's forward: `output`, or a copy with one NaN/+Inf (nan/inf, phase=fwd: in
  // layer L's output in the forward pass of step S, its first micro-batch; the next layer's all-reduce carries it to
  // the TP peers, the loss and every gradient).
  at::Tensor corruptActivation(int layer, const at::Tensor& output);
  // Communicator, before it numbers and issues a collective of a group with more than one member. delay: the rank
  // sleeps M ms before entering every collective. hang: at the first collective of step S (of that phase) the rank
  // does not enter it and stalls there, as a rank stuck in a data loader or a divergent branch would; its peers block
  // in that collective. The rank gives up after twice the group's timeout (CollectiveError: exit 3) if nobody
  // stopped it before.
  void beforeCollective(const Communicator& comm, vocabulary::CollectiveOp op, probes::Phase phase);
  // Communicator::allReduce, before recording: replaces `t` by a tensor one element longer (mismatch: the first
  // all-reduce of step S, of that phase). True if so. The collective is pre-recorded with that shape and flushed
  // first: Gloo aborts the process on a size mismatch (the ranks' crash handlers dump the flight recorder), possibly
  // before the communicator's own record of it reaches the disk.
  bool mismatchAllReduce(const Communicator& comm, at::Tensor& t, const Callsite& site, probes::Phase phase);
  // ReplicaCheck, after the optimizer update of the current step: bitflip on a parameter (`tensor=NAME`, default the
  // first `replicated` one): one bit of element 0 flips in memory, silently; the next forward pass uses the
  // corrupted value. `names`, `params`, `replicated`: the model's parameters in order.
  void flipParameterBit(const std::vector<std::string>& names, const std::vector<at::Tensor>& params,
                        const std::vector<bool>& replicated);
  // Communicator, when an all-reduce's result is in `result` (bitflip tensor=allreduce, of that phase): one bit of
  // element 0 of the rank's first all-reduce result of step S flips; the caller consumes the corrupted value.
  void corruptAllReduceResult(const Communicator& comm, const at::Tensor& result, probes::Phase phase);

 private:
  std::vector<rules::FaultSpec> specs_;
  std::vector<bool> fired_;
  int rank_;
  int step_ = 0;
  int microbatch_ = -1;
  bool slowInPasses_ = false;
  bool inMicrobatch(const rules::FaultSpec& s) const { return s.microbatch < 0 || s.microbatch == microbatch_; }
};

// The injector installed in this process, or null. One relaxed load.
FaultInjector* activeFaults() noexcept;

// What the trainer calls each step: the injector (when faults are configured) and the health rules.
class StepHooks {
 public:
  // Reads TPSCOPE_INJECT, TPSCOPE_HEALTH and TPSCOPE_REPLAY_STEP (the replay's op check, op_check.h); throws
  // ConfigError (naming the variable) on a bad spec or an out-of-range rank/layer. Installs the injector process-wide
  // (until destroyed) and attaches its gradient hooks to `params` — so construct it BEFORE anything else registers
  // gradient hooks on them.
  // `names` and `layers` describe `params` (for the injected faults' targets and messages).
  StepHooks(Mesh& mesh, const std::vector<std::string>& names, const std::vector<int>& layers,
            const std::vector<at::Tensor>& params, int modelLayers);
  ~StepHooks();
  StepHooks(const StepHooks&) = delete;
  StepHooks& operator=(const StepHooks&) = delete;

  void stepBegin(int64_t step);
  // The end of the step's work (after the update): the replay's op check reports (op_check.h).
  void stepEnd(int64_t step);
  // True when the trainer must compute this rank's pre-reduction gradient health (the rules need it).
  bool wantsHealth() const;
  // Before the optimizer update. Runs the rules on this rank's pre-reduction gradient stats `grads` (gradStatsOnHost
  // in grad_health.h; skipped when empty), its forward outputs (`activations`, when watched), its own loss (`lossSum`
  // / `microBatches`, read only when the rules run) and the reduced global gradient norm; alerts go to the sink. When a
  // policy can act, every rank agrees through one all-reduce (MAX) on the world group. Returns true when the update
  // must be skipped (all ranks return the same); throws NonFiniteStop to stop. Must be called by every rank at every
  // step (it may issue collectives).
  bool beforeUpdate(int64_t step, std::span<const probes::GradStat> grads, ActivationWatch* activations,
                    const at::Tensor& lossSum, int64_t microBatches, double gradNorm);

  // This rank saw a non-finite module output, loss or gradient in step `step` (known once beforeUpdate ran).
  bool sawNonFinite(int64_t step) const { return nonFiniteStep_ == step; }

  const rules::HealthRules& rules() const { return rules_; }
  rules::HealthRules& rules() { return rules_; }
  // TPSCOPE_OUT is set: the ranks record (identical on every rank).
  bool recording() const { return recordingRequested_; }

 private:
  Mesh& mesh_;
  bool recordingRequested_;  // TPSCOPE_OUT is set: the ranks record (same on every rank)
  std::unique_ptr<FaultInjector> faults_;
  std::unique_ptr<OpCheck> opCheck_;  // TPSCOPE_REPLAY_STEP (tpscope replay), or live under trace-ops
  std::vector<std::string> names_;    // the parameters, for an op check armed live
  std::vector<at::Tensor> params_;
  rules::HealthRules rules_;
  int64_t nonFiniteStep_ = 0;  // the last step in which this rank saw a non-finite value
};

}  // namespace tpscope::core
