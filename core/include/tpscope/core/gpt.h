// A pre-LN GPT built from the tensor-parallel layers.
//
//   x = VocabParallelEmbedding(ids) + pos[:s]          (sequence parallel: reduce-scatter, x split along seq)
//   for each layer:  x = x + Attention(LN1(x));  x = x + MLP(LN2(x))
//   logits_local = LN_f(x) @ E_local^T                  (output head tied to the embedding shard)
//   loss = mean vocab-parallel cross entropy            (logits never gathered)
//
// Pipeline stages: a Gpt may hold only layers [first_layer, first_layer + stage_layers) of the model (names and
// master initialisation keep the global layer index), the embedding only with pre_process (the first stage) and the
// final LayerNorm + output head + loss only with post_process (the last stage). The last stage of a pipeline holds
// its own copy of the tied embedding (same master initialisation); the trainer keeps the two copies equal by
// summing their gradients over the first and last stage (Mesh::embeddingGroup).
//
// Activation checkpointing (per layer) keeps only each layer's input and recomputes the layer in backward,
// restoring the RNG state so dropout masks repeat. Spans: "embedding forward", per layer "attention forward",
// "mlp forward" (+ backward spans through the regions' span markers), "loss forward".
#pragma once

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <vector>

#include "tpscope/core/layers.h"

namespace tpscope::core {

class ActivationWatch;

struct GptOptions {
  TORCH_ARG(int64_t, layers) = 2;
  TORCH_ARG(int64_t, hidden) = 64;
  TORCH_ARG(int64_t, heads) = 4;
  TORCH_ARG(int64_t, ffn_hidden) = 256;
  TORCH_ARG(int64_t, seq_len) = 64;
  TORCH_ARG(int64_t, vocab_size) = 256;
  TORCH_ARG(double, dropout) = 0.0;            // residual / embedding dropout
  TORCH_ARG(double, attention_dropout) = 0.0;
  TORCH_ARG(double, label_smoothing) = 0.0;
  TORCH_ARG(int64_t, loss_ignore) = -1;        // a target id that does not count in the loss (TrainConfig)
  TORCH_ARG(bool, sequence_parallel) = false;  // ignored at TP=1
  TORCH_ARG(bool, activation_checkpointing) = false;
  TORCH_ARG(uint64_t, seed) = 1234;
  TORCH_ARG(CommunicatorPtr, tp) = nullptr;      // not owned
  // pipeline stage (defaults: the whole model)
  TORCH_ARG(int64_t, first_layer) = 0;
  TORCH_ARG(int64_t, stage_layers) = -1;        // -1: every layer from first_layer on
  TORCH_ARG(bool, pre_process) = true;          // embedding (first stage)
  TORCH_ARG(bool, post_process) = true;         // final LayerNorm, tied output head, loss (last stage)
};

class TransformerLayerImpl : public torch::nn::Module {
 public:
  TransformerLayerImpl(const GptOptions& o, int layer);
  at::Tensor forward(const at::Tensor& x);
  int layer() const noexcept { return layer_; }
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  ParallelAttention attention{nullptr};
  ParallelMLP mlp{nullptr};

 private:
  int layer_;
  double dropout_;
  BackwardSpanSlot attnSlot_, mlpSlot_;
};
TORCH_MODULE(TransformerLayer);

class GptImpl : public torch::nn::Module {
 public:
  explicit GptImpl(GptOptions options);
  // ids, targets: int64 [batch, seq_len] over the full vocabulary. Returns the mean token loss (fp32 scalar).
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& targets);
  // One pipeline stage's forward: the embedding of `ids` (pre_process) or `input` (the previous stage's activation),
  // through this stage's layers, then the loss against `targets` (post_process) or the activation to send on.
  at::Tensor stageForward(const at::Tensor& input, const at::Tensor& ids, const at::Tensor& targets);
  // Parameters in registration order with their dotted names; `sharded` as in tpShardedParams.
  struct ParamInfo {
    std::string name;
    at::Tensor param;
    bool sharded;
    int layer;  // -1: not inside a transformer layer
  };
  std::vector<ParamInfo> paramInfo();
  // Parameters used twice in one forward (the tied embedding): their gradient is complete only after backward.
  std::vector<at::Tensor> sharedParams() {
    if (options.pre_process() && options.post_process()) return {embedding->weight};
    return {};
  }
  // Forward-pass health (capture): note the embedding output, each layer's output and the logits in `watch` (null:
  // none). Not owned; set per step by the trainer.
  void watchActivations(ActivationWatch* watch) { watch_ = watch; }
  // Model FLOPs of one forward+backward over `tokens` tokens at TP=1 (matmuls only, 3x forward).
  double flopsPerStep(int64_t batch) const;

  GptOptions options;
  VocabParallelEmbedding embedding{nullptr};  // pre_process or post_process (the tied head's copy)
  at::Tensor position;  // [seq_len, hidden], replicated; pre_process only
  std::vector<TransformerLayer> layers;
  torch::nn::LayerNorm lnFinal{nullptr};  // post_process only

 private:
  at::Tensor embed(const at::Tensor& ids);
  at::Tensor runLayers(at::Tensor x);
  at::Tensor head(const at::Tensor& x, const at::Tensor& targets);

  bool sp_ = false;
  ActivationWatch* watch_ = nullptr;
  std::vector<std::string> outputNames_;  // "embedding output", "layers.i output"..., "output logits"
  Callsite headSite_{"output head (tied embedding)", -1};
  Callsite lossSite_{"vocab-parallel cross entropy", -1};
  BackwardSpanSlot lossSlot_;
};
TORCH_MODULE(Gpt);

}  // namespace tpscope::core
