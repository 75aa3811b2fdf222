#include "tpscope/core/layers.h"

#include <torch/torch.h>

#include <cmath>

#include "tpscope/core/activation_health.h"

namespace tpscope::core {

using torch::autograd::AutogradContext;
using torch::autograd::Variable;
using torch::autograd::variable_list;
namespace probes = ::tpscope::probes;

namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}
uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

Communicator& need(Communicator* c, const char* who) {
  TORCH_CHECK(c != nullptr, who, ": options.tp (the TP communicator) is not set");
  return *c;
}

void checkDivides(int64_t n, int tp, const char* what, const std::string& name) {
  TORCH_CHECK(n % tp == 0, name, ": ", what, " = ", n, " is not divisible by TP = ", tp);
}

}  // namespace

at::Tensor masterNormal(uint64_t seed, const std::string& name, at::IntArrayRef shape, double std) {
  auto gen = at::detail::createCPUGenerator(splitmix(seed ^ fnv1a(name)));
  return at::normal(0.0, std, shape, gen, at::TensorOptions().dtype(at::kFloat));
}

at::Tensor shardOf(const at::Tensor& full, int64_t dim, int rank, int size) {
  TORCH_CHECK(full.size(dim) % size == 0, "shard: size ", full.size(dim), " along dim ", dim,
              " not divisible by ", size);
  return full.chunk(size, dim)[rank].contiguous().clone();
}

// ---------------------------------------------------------------- ColumnParallelLinear
ColumnParallelLinearImpl::ColumnParallelLinearImpl(ColumnParallelLinearOptions o) : options(std::move(o)) {
  site_ = Callsite{options.what(), options.layer()};
  reset();
}

void ColumnParallelLinearImpl::reset() {
  Communicator& tp = need(options.tp(), "ColumnParallelLinear");
  checkDivides(options.out_features(), tp.size(), "out_features", options.name());
  at::Tensor full = masterNormal(options.seed(), options.name() + ".weight",
                                 {options.out_features(), options.in_features()}, options.init_std());
  weight = register_parameter("weight", shardOf(full, 0, tp.rank(), tp.size()));
  if (options.bias()) bias = register_parameter("bias", torch::zeros({options.out_features() / tp.size()}));
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& x) {
  Communicator& tp = *options.tp();
  at::Tensor in = options.sequence_parallel() ? gatherFromSequence(x, tp, site_) : copyToTp(x, tp, site_);
  at::Tensor y = torch::linear(in, weight, bias);
  return options.gather_output() ? gatherFromTp(y, tp, site_) : y;
}

// ---------------------------------------------------------------- RowParallelLinear
RowParallelLinearImpl::RowParallelLinearImpl(RowParallelLinearOptions o) : options(std::move(o)) {
  site_ = Callsite{options.what(), options.layer()};
  partialWhere_ = (options.layer() >= 0 ? "layers." + std::to_string(options.layer()) + " " : std::string()) +
                  std::string(options.what()) + " partial sums";
  reset();
}

void RowParallelLinearImpl::reset() {
  Communicator& tp = need(options.tp(), "RowParallelLinear");
  checkDivides(options.in_features(), tp.size(), "in_features", options.name());
  at::Tensor full = masterNormal(options.seed(), options.name() + ".weight",
                                 {options.out_features(), options.in_features()}, options.init_std());
  weight = register_parameter("weight", shardOf(full, 1, tp.rank(), tp.size()));
  if (options.bias()) bias = register_parameter("bias", torch::zeros({options.out_features()}));
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& x) {
  Communicator& tp = *options.tp();
  at::Tensor in = options.input_is_parallel() ? x : scatterToTp(x, tp, site_);
  at::Tensor partial = torch::linear(in, weight);
  // This rank's own contribution, before the collective that adds the others': where a value born inside the layer
  // is still this rank's alone (the layer's output is already every rank's).
  if (tp.size() > 1)
    if (ActivationWatch* watch = activeActivationWatch()) watch->note(partial, options.layer(), &partialWhere_);
  at::Tensor y = options.sequence_parallel() ? reduceScatterToSequence(partial, tp, site_)
                                             : reduceFromTp(partial, tp, site_);
  return bias.defined() ? y + bias : y;
}

// ---------------------------------------------------------------- VocabParallelEmbedding
VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(VocabParallelEmbeddingOptions o) : options(std::move(o)) {
  site_ = Callsite{"embedding VocabParallel", -1};
  reset();
}

void VocabParallelEmbeddingImpl::reset() {
  Communicator& tp = need(options.tp(), "VocabParallelEmbedding");
  checkDivides(options.vocab_size(), tp.size(), "vocab_size", options.name());
  perRank_ = options.vocab_size() / tp.size();
  vocabStart_ = perRank_ * tp.rank();
  at::Tensor full =
      masterNormal(options.seed(), options.name() + ".weight", {options.vocab_size(), options.hidden()},
                   options.init_std());
  weight = register_parameter("weight", shardOf(full, 0, tp.rank(), tp.size()));
}

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& ids) {
  Communicator& tp = *options.tp();
  at::Tensor out;
  if (tp.size() == 1) {
    out = torch::embedding(weight, ids);
  } else {
    at::Tensor outside = (ids < vocabStart_).logical_or(ids >= vocabStart_ + perRank_);
    at::Tensor local = (ids - vocabStart_).masked_fill(outside, 0);
    out = torch::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0.0);
    if (ActivationWatch* watch = activeActivationWatch()) watch->note(out, -1, &partialWhere_);  // this rank's rows
  }
  return options.sequence_parallel() ? reduceScatterToSequence(out, tp, site_) : reduceFromTp(out, tp, site_);
}

// ---------------------------------------------------------------- vocab-parallel cross entropy
namespace {

struct VocabParallelCeFn : torch::autograd::Function<VocabParallelCeFn> {
  // logits [N, Vl]; targets [N]
  static Variable forward(AutogradContext* ctx, Variable logits, Variable targets, int64_t comm, int64_t site,
                          int64_t vocabStart, int64_t vocabSize, double eps) {
    auto& tp = *reinterpret_cast<Communicator*>(static_cast<intptr_t>(comm));
    const auto& cs = *reinterpret_cast<const Callsite*>(static_cast<intptr_t>(site));
    at::Tensor z = logits.to(at::kFloat);
    const int64_t vl = z.size(1);
    at::Tensor zmax = std::get<0>(z.max(1));
    tp.allReduce(zmax, ReduceOp::Max, cs, probes::Phase::Forward);
    at::Tensor zs = z - zmax.unsqueeze(1);
    at::Tensor outside = (targets < vocabStart).logical_or(targets >= vocabStart + vl);
    at::Tensor local = (targets - vocabStart).masked_fill(outside, 0);
    at::Tensor zt = zs.gather(1, local.unsqueeze(1)).squeeze(1).masked_fill(outside, 0.0);
    at::Tensor e = zs.exp();
    // One SUM all-reduce for target logit, sum of exp and (for smoothing) sum of logits.
    at::Tensor packed = eps > 0 ? at::stack({zt, e.sum(1), zs.sum(1)}) : at::stack({zt, e.sum(1)});
    tp.allReduce(packed, ReduceOp::Sum, cs, probes::Phase::Forward);
    at::Tensor sumExp = packed[1];
    at::Tensor logZ = sumExp.log();
    at::Tensor loss = logZ - packed[0];
    if (eps > 0) loss = (1.0 - eps) * loss + eps * (logZ - packed[2] / static_cast<double>(vocabSize));
    e.div_(sumExp.unsqueeze(1));  // softmax slice, reused by backward
    ctx->save_for_backward({e, local, outside});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["V"] = vocabSize;
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto saved = ctx->get_saved_variables();
    at::Tensor grad = saved[0].clone();  // softmax
    const at::Tensor& local = saved[1];
    const at::Tensor& outside = saved[2];
    const double eps = ctx->saved_data["eps"].toDouble();
    const int64_t V = ctx->saved_data["V"].toInt();
    at::Tensor hit = outside.logical_not().to(at::kFloat) * (1.0 - eps);
    grad.scatter_add_(1, local.unsqueeze(1), -hit.unsqueeze(1));
    if (eps > 0) grad.sub_(eps / static_cast<double>(V));
    grad.mul_(g[0].unsqueeze(1));
    grad = grad.to(static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt()));
    return {grad, Variable(), Variable(), Variable(), Variable(), Variable(), Variable()};
  }
};

}  // namespace

at::Tensor vocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& targets, Communicator& tp,
                                     int64_t vocabStart, int64_t vocabSize, double labelSmoothing,
                                     const Callsite& site) {
  TORCH_CHECK(labelSmoothing >= 0 && labelSmoothing < 1, "label smoothing ", labelSmoothing, " outside [0, 1)");
  TORCH_CHECK(logits.size(-1) * tp.size() == vocabSize, "vocab-parallel CE: local logits ", logits.size(-1), " x TP ",
              tp.size(), " != vocab ", vocabSize);
  auto lead = targets.sizes().vec();
  at::Tensor l2 = logits.reshape({-1, logits.size(-1)});
  at::Tensor t1 = targets.reshape({-1});
  at::Tensor loss = VocabParallelCeFn::apply(l2, t1, static_cast<int64_t>(reinterpret_cast<intptr_t>(&tp)),
                                             static_cast<int64_t>(reinterpret_cast<intptr_t>(&site)), vocabStart,
                                             vocabSize, labelSmoothing);
  return loss.view(lead);
}

// ---------------------------------------------------------------- ParallelAttention
ParallelAttentionImpl::ParallelAttentionImpl(ParallelAttentionOptions o) : options(std::move(o)) {
  Communicator& tp = need(options.tp(), "ParallelAttention");
  TORCH_CHECK(options.hidden() % options.heads() == 0, options.name(), ": hidden ", options.hidden(),
              " not divisible by heads ", options.heads());
  checkDivides(options.heads(), tp.size(), "heads", options.name());
  headsLocal_ = options.heads() / tp.size();
  headDim_ = options.hidden() / options.heads();
  qkv = register_module("qkv", ColumnParallelLinear(ColumnParallelLinearOptions(options.hidden(), 3 * options.hidden())
                                                        .tp(&tp)
                                                        .sequence_parallel(options.sequence_parallel())
                                                        .init_std(options.init_std())
                                                        .seed(options.seed())
                                                        .name(options.name() + ".qkv")
                                                        .what("attention QKV ColumnParallel")
                                                        .layer(options.layer())));
  out = register_module("out", RowParallelLinear(RowParallelLinearOptions(options.hidden(), options.hidden())
                                                     .tp(&tp)
                                                     .sequence_parallel(options.sequence_parallel())
                                                     .init_std(options.output_init_std())
                                                     .seed(options.seed())
                                                     .name(options.name() + ".out")
                                                     .what("attention output RowParallel")
                                                     .layer(options.layer())));
}

at::Tensor ParallelAttentionImpl::forward(const at::Tensor& x) {
  at::Tensor h = qkv(x);  // [b, s, hl * 3 * d]
  const int64_t b = h.size(0), s = h.size(1);
  h = h.view({b, s, headsLocal_, 3, headDim_}).permute({3, 0, 2, 1, 4});  // [3, b, hl, s, d]
  at::Tensor q = h[0].reshape({b * headsLocal_, s, headDim_});
  at::Tensor k = h[1].reshape({b * headsLocal_, s, headDim_});
  at::Tensor v = h[2].reshape({b * headsLocal_, s, headDim_});
  at::Tensor mask = torch::full({s, s}, -std::numeric_limits<float>::infinity(), q.options()).triu(1).unsqueeze(0);
  at::Tensor scores = torch::baddbmm(mask, q, k.transpose(1, 2), 1.0, 1.0 / std::sqrt(static_cast<double>(headDim_)));
  at::Tensor probs = torch::softmax(scores, -1);
  if (options.attention_dropout() > 0 && is_training()) probs = torch::dropout(probs, options.attention_dropout(), true);
  at::Tensor ctx = torch::bmm(probs, v).view({b, headsLocal_, s, headDim_}).permute({0, 2, 1, 3}).reshape(
      {b, s, headsLocal_ * headDim_});
  return out(ctx);
}

// ---------------------------------------------------------------- ParallelMLP
ParallelMLPImpl::ParallelMLPImpl(ParallelMLPOptions o) : options(std::move(o)) {
  Communicator& tp = need(options.tp(), "ParallelMLP");
  fc1 = register_module("fc1", ColumnParallelLinear(ColumnParallelLinearOptions(options.hidden(), options.ffn_hidden())
                                                        .tp(&tp)
                                                        .sequence_parallel(options.sequence_parallel())
                                                        .init_std(options.init_std())
                                                        .seed(options.seed())
                                                        .name(options.name() + ".fc1")
                                                        .what("mlp fc1 ColumnParallel")
                                                        .layer(options.layer())));
  fc2 = register_module("fc2", RowParallelLinear(RowParallelLinearOptions(options.ffn_hidden(), options.hidden())
                                                     .tp(&tp)
                                                     .sequence_parallel(options.sequence_parallel())
                                                     .init_std(options.output_init_std())
                                                     .seed(options.seed())
                                                     .name(options.name() + ".fc2")
                                                     .what("mlp fc2 RowParallel")
                                                     .layer(options.layer())));
}

at::Tensor ParallelMLPImpl::forward(const at::Tensor& x) { return fc2(torch::gelu(fc1(x))); }

std::unordered_set<const void*> tpShardedParams(torch::nn::Module& root) {
  std::unordered_set<const void*> out;
  for (auto& m : root.modules(/*include_self=*/true)) {
    if (auto* c = m->as<ColumnParallelLinearImpl>()) {
      out.insert(c->weight.unsafeGetTensorImpl());
      if (c->bias.defined()) out.insert(c->bias.unsafeGetTensorImpl());
    } else if (auto* r = m->as<RowParallelLinearImpl>()) {
      out.insert(r->weight.unsafeGetTensorImpl());
    } else if (auto* e = m->as<VocabParallelEmbeddingImpl>()) {
      out.insert(e->weight.unsafeGetTensorImpl());
    }
  }
  return out;
}

}  // namespace tpscope::core
