// Tensor-parallel layers (Megatron-LM's core, on LibTorch): Options + Impl + TORCH_MODULE.
//
// Master initialisation: every parameter is drawn in FULL from a generator seeded by (seed, master name), then this
// rank keeps its shard (`shardOf`). TP=N therefore starts from exactly the TP=1 weights and a TP=1 reference can be
// built in any process. Shard layout (row = output feature):
//   ColumnParallelLinear  weight [out/tp, in]   rows   r*out/tp ..    bias [out/tp]
//   RowParallelLinear     weight [out, in/tp]   cols   r*in/tp  ..    bias [out] replicated, added after the reduce
//   VocabParallelEmbedding weight [V/tp, h]     rows   r*V/tp   ..
// Activations are [batch, seq, hidden]. With sequence parallelism, the activations between the TP regions are split
// along seq ([batch, seq/tp, hidden]); column-parallel layers all-gather the sequence, row-parallel layers
// reduce-scatter it, and replicated parameters (LayerNorm, row bias, position embedding) see only a sequence chunk,
// so their gradients must be summed over TP (the trainer does this; `isTpShardedParam` tells which are shards).
// The `Communicator*` in options is not owned and must outlive the module.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <unordered_set>

#include "tpscope/core/callsite.h"
#include "tpscope/core/communicator.h"
#include "tpscope/core/regions.h"

namespace tpscope::core {

// TORCH_ARG pastes its type textually, so pointer types need a name.
using CommunicatorPtr = Communicator*;  // not owned
using StaticString = const char*;       // must have static storage duration

// Full tensor ~ N(0, std) from a generator seeded by (seed, name); identical in every process.
at::Tensor masterNormal(uint64_t seed, const std::string& name, at::IntArrayRef shape, double std);
// This rank's contiguous chunk of `full` along `dim` (copied).
at::Tensor shardOf(const at::Tensor& full, int64_t dim, int rank, int size);

struct ColumnParallelLinearOptions {
  ColumnParallelLinearOptions(int64_t in, int64_t out) : in_features_(in), out_features_(out) {}
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  TORCH_ARG(CommunicatorPtr, tp) = nullptr;
  TORCH_ARG(bool, bias) = true;
  TORCH_ARG(bool, gather_output) = false;
  TORCH_ARG(bool, sequence_parallel) = false;  // input is split along seq: all-gather it instead of copy-to-TP
  TORCH_ARG(double, init_std) = 0.02;
  TORCH_ARG(uint64_t, seed) = 0;
  TORCH_ARG(std::string, name) = "column";  // master name: seeds the initialisation
  TORCH_ARG(StaticString, what) = "ColumnParallel";
  TORCH_ARG(int, layer) = -1;
};

class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  explicit ColumnParallelLinearImpl(ColumnParallelLinearOptions options);
  at::Tensor forward(const at::Tensor& x);
  void reset();
  ColumnParallelLinearOptions options;
  at::Tensor weight, bias;

 private:
  Callsite site_;
};
TORCH_MODULE(ColumnParallelLinear);

struct RowParallelLinearOptions {
  RowParallelLinearOptions(int64_t in, int64_t out) : in_features_(in), out_features_(out) {}
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  TORCH_ARG(CommunicatorPtr, tp) = nullptr;
  TORCH_ARG(bool, bias) = true;
  TORCH_ARG(bool, input_is_parallel) = true;  // false: split the input's last dim first (scatter-to-TP)
  TORCH_ARG(bool, sequence_parallel) = false; // reduce-scatter along seq instead of all-reduce
  TORCH_ARG(double, init_std) = 0.02;
  TORCH_ARG(uint64_t, seed) = 0;
  TORCH_ARG(std::string, name) = "row";
  TORCH_ARG(StaticString, what) = "RowParallel";
  TORCH_ARG(int, layer) = -1;
};

class RowParallelLinearImpl : public torch::nn::Module {
 public:
  explicit RowParallelLinearImpl(RowParallelLinearOptions options);
  at::Tensor forward(const at::Tensor& x);
  void reset();
  RowParallelLinearOptions options;
  at::Tensor weight, bias;

 private:
  Callsite site_;
  std::string partialWhere_;  // what the activation watch calls this rank's partial sums (activation_health.h)
};
TORCH_MODULE(RowParallelLinear);

struct VocabParallelEmbeddingOptions {
  VocabParallelEmbeddingOptions(int64_t vocab, int64_t hidden) : vocab_size_(vocab), hidden_(hidden) {}
  TORCH_ARG(int64_t, vocab_size);
  TORCH_ARG(int64_t, hidden);
  TORCH_ARG(CommunicatorPtr, tp) = nullptr;
  TORCH_ARG(bool, sequence_parallel) = false;  // output reduce-scattered along seq
  TORCH_ARG(double, init_std) = 0.02;
  TORCH_ARG(uint64_t, seed) = 0;
  TORCH_ARG(std::string, name) = "embedding";
};

class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  explicit VocabParallelEmbeddingImpl(VocabParallelEmbeddingOptions options);
  // ids: int64 [batch, seq] over the full vocabulary; ids outside this rank's rows give zero rows before the reduce.
  at::Tensor forward(const at::Tensor& ids);
  void reset();
  int64_t vocabStart() const noexcept { return vocabStart_; }
  int64_t vocabPerRank() const noexcept { return perRank_; }
  VocabParallelEmbeddingOptions options;
  at::Tensor weight;

 private:
  int64_t vocabStart_ = 0, perRank_ = 0;
  Callsite site_;
  std::string partialWhere_ = "embedding VocabParallel partial sums";  // this rank's rows, before the reduce
};
TORCH_MODULE(VocabParallelEmbedding);

// Vocab-parallel cross entropy. `logits`: [..., V/tp] this rank's vocabulary slice starting at `vocabStart`;
// `targets`: int64 [...] over the full vocabulary (size `vocabSize`). Returns the per-token loss [...] (fp32).
// Forward: all-reduce MAX of the row max, then one SUM all-reduce of (target logit, sum of exp, sum of logits);
// never gathers the logits. Backward has no communication.
// Label smoothing eps: loss = (1-eps) * (logZ - z_target) + eps * (logZ - mean_v z_v), the mean over the GLOBAL
// vocabulary (Megatron averages over the local shard, which is wrong for TP>1).
at::Tensor vocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& targets, Communicator& tp,
                                     int64_t vocabStart, int64_t vocabSize, double labelSmoothing,
                                     const Callsite& site);

struct ParallelAttentionOptions {
  ParallelAttentionOptions(int64_t hidden, int64_t heads) : hidden_(hidden), heads_(heads) {}
  TORCH_ARG(int64_t, hidden);
  TORCH_ARG(int64_t, heads);
  TORCH_ARG(CommunicatorPtr, tp) = nullptr;
  TORCH_ARG(bool, sequence_parallel) = false;
  TORCH_ARG(double, attention_dropout) = 0.0;
  TORCH_ARG(double, init_std) = 0.02;
  TORCH_ARG(double, output_init_std) = 0.02;  // GPT-2: 0.02 / sqrt(2 * layers)
  TORCH_ARG(uint64_t, seed) = 0;
  TORCH_ARG(std::string, name) = "attention";
  TORCH_ARG(int, layer) = -1;
};

// Causal self-attention. Fused QKV is column-parallel with master rows laid out head by head,
// [h0: q k v | h1: q k v | ...], so the contiguous TP split hands each rank whole heads; the output projection is
// row-parallel over the same heads.
class ParallelAttentionImpl : public torch::nn::Module {
 public:
  explicit ParallelAttentionImpl(ParallelAttentionOptions options);
  at::Tensor forward(const at::Tensor& x);
  ParallelAttentionOptions options;
  ColumnParallelLinear qkv{nullptr};
  RowParallelLinear out{nullptr};

 private:
  int64_t headsLocal_ = 0, headDim_ = 0;
};
TORCH_MODULE(ParallelAttention);

struct ParallelMLPOptions {
  ParallelMLPOptions(int64_t hidden, int64_t ffn) : hidden_(hidden), ffn_hidden_(ffn) {}
  TORCH_ARG(int64_t, hidden);
  TORCH_ARG(int64_t, ffn_hidden);
  TORCH_ARG(CommunicatorPtr, tp) = nullptr;
  TORCH_ARG(bool, sequence_parallel) = false;
  TORCH_ARG(double, init_std) = 0.02;
  TORCH_ARG(double, output_init_std) = 0.02;
  TORCH_ARG(uint64_t, seed) = 0;
  TORCH_ARG(std::string, name) = "mlp";
  TORCH_ARG(int, layer) = -1;
};

// fc1 column-parallel (h -> ffn), exact GELU, fc2 row-parallel (ffn -> h).
class ParallelMLPImpl : public torch::nn::Module {
 public:
  explicit ParallelMLPImpl(ParallelMLPOptions options);
  at::Tensor forward(const at::Tensor& x);
  ParallelMLPOptions options;
  ColumnParallelLinear fc1{nullptr};
  RowParallelLinear fc2{nullptr};
};
TORCH_MODULE(ParallelMLP);

// True for parameters that hold a TP shard (column/row weights, column bias, vocab embedding); false for
// TP-replicated ones (LayerNorm, row bias, position embedding), which clipping counts once and sequence
// parallelism all-reduces.
// Returns the TensorImpl pointers of the sharded parameters under `root`.
std::unordered_set<const void*> tpShardedParams(torch::nn::Module& root);

}  // namespace tpscope::core
