// Trainer: one rank's training loop over the TP x DP x PP mesh.
//
// With PP > 1 the rank holds its stage's model chunks and a step runs the pipeline schedule (pipeline_runner.h,
// docs/engine.md); then, as below, the DP reduction, the tied embedding's gradient summed over the first and last
// stage, clipping with the norm summed over the stages, the optimizer. The loss is the last stage's, summed over the
// pipeline so every rank holds it.
//
// A step (1-based): for each of grad_accum micro-batches, load the DP-sharded batch (onto the rank's GPU with
// device = cuda), forward (bf16 autocast when asked — CPU or CUDA; fp16 autocast on CUDA), backward of
// loss × scale / grad_accum; during the last backward the GradReducer all-reduces gradient buckets over DP;
// sequence parallelism then sums the replicated parameters' gradients over TP; the gradients are unscaled (dynamic
// loss scaling, loss_scaler.h: an overflowing step is skipped and the scale halves); global-norm clipping (sharded
// parameters summed over TP, replicated ones counted once); AdamW (ZeRO-1: each DP rank updates the parameters it
// owns and broadcasts them) with linear warm-up + cosine decay of the LR.
// Probes: TPS_STEP, spans for step, data, optimizer, clipping, DP reduction, checkpoint; gradient health before
// the reductions (`sink->gradStats`) and `sink->stepStat` after each step while a sink is recording.
#pragma once

#include <memory>
#include <string>

#include "tpscope/core/mesh.h"
#include "tpscope/rules/config.h"

namespace tpscope::core {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0;       // mean over the global batch (all DP replicas and micro-batches)
  double lr = 0;
  double gradNorm = 0;   // global norm before clipping
  double stepTimeS = 0;
  double stepCpuS = 0;   // CPU time of the whole process (all threads, incl. Gloo's) during the step
  double tokensPerS = 0; // global tokens (all DP replicas) per second
  int64_t tokens = 0;    // global tokens of the step
  double lossScale = 1;  // the dynamic loss scale the step ran with (1: no scaling)
  bool skipped = false;  // the update was dropped (loss-scale overflow or a health policy)
};

// The LR at `step` (1-based): linear warm-up over `warmup` steps, then cosine from lr down to min_lr at `steps`.
double learningRate(const rules::TrainConfig& c, int64_t step);

class Trainer {
 public:
  // Builds the model from the master initialisation, the optimizer and the data. Throws ConfigError for config
  // problems (including a missing corpus). `mesh` must outlive the trainer.
  Trainer(const rules::TrainConfig& config, Mesh& mesh);
  ~Trainer();

  // One optimizer step. Recording into a run folder (TPSCOPE_OUT, not under tpscope replay), the first step S > 1 in
  // which this rank sees a non-finite value (a module output, the loss or a gradient: StepHooks::sawNonFinite) or
  // the global gradient norm is not finite (on every rank of the job in the same step) writes, before its update, the
  // state the step started from as a checkpoint of step S - 1 in <TPSCOPE_OUT>/replay-state/step-<S-1>/: parameters and
  // optimizer state (not updated yet), the generator and the loss scale as the step began. This rank's file and the
  // manifest only, no collective (a rank that sees nothing writes nothing); `tpscope replay` starts there. Its cost
  // before that: a copy of the CPU generator's state (5 KB) per step.
  StepMetrics trainStep(int64_t step);
  // Writes <checkpoint_dir>/step-<N>/rank-<R>.pt, then (world rank 0) manifest.json and <checkpoint_dir>/latest.
  void saveCheckpoint(int64_t step);
  // Loads `dir` (a checkpoint root holding `latest`, or one step-<N> folder). Returns the step it holds. A mesh that
  // stands for one DP replica (Mesh::dataDp) reads the files of the ranks it stands for (Mesh::jobRank).
  // Throws ConfigError when the layout (tp, dp, zero1) differs.
  int64_t loadCheckpoint(const std::string& dir);
  // Model FLOPs of one optimizer step at TP=1 for this rank's share of the batch.
  double flopsPerStep() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpscope::core
