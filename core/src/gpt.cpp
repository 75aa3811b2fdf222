#include "tpscope/core/gpt.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "tpscope/core/activation_health.h"
#include "tpscope/core/faults.h"

namespace tpscope::core {

using torch::autograd::AutogradContext;
using torch::autograd::Variable;
using torch::autograd::variable_list;

namespace {

// Per-layer activation checkpoint: forward without a graph, recompute in backward (reentrant), RNG and autocast
// state replayed so the recomputation is bit-identical.
struct CheckpointFn : torch::autograd::Function<CheckpointFn> {
  static Variable forward(AutogradContext* ctx, Variable x, int64_t layerPtr) {
    auto* layer = reinterpret_cast<TransformerLayerImpl*>(static_cast<intptr_t>(layerPtr));
    ctx->saved_data["layer"] = layerPtr;
    // The generator of the device the layer runs on (the CUDA one on a GPU): dropout draws from it.
    ctx->saved_data["rng"] = at::globalContext().defaultGenerator(x.device()).get_state();
    ctx->saved_data["autocast_cpu"] = at::autocast::is_autocast_enabled(at::kCPU);
    ctx->saved_data["autocast_cuda"] = at::autocast::is_autocast_enabled(at::kCUDA);
    ctx->save_for_backward({x});
    return layer->forward(x);  // grad mode is off inside a custom Function's forward
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto* layer = reinterpret_cast<TransformerLayerImpl*>(static_cast<intptr_t>(ctx->saved_data["layer"].toInt()));
    at::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    auto gen = at::globalContext().defaultGenerator(x.device());
    at::Tensor now = gen.get_state();
    gen.set_state(ctx->saved_data["rng"].toTensor());
    const bool prevCpu = at::autocast::is_autocast_enabled(at::kCPU);
    const bool prevCuda = at::autocast::is_autocast_enabled(at::kCUDA);
    at::autocast::set_autocast_enabled(at::kCPU, ctx->saved_data["autocast_cpu"].toBool());
    at::autocast::set_autocast_enabled(at::kCUDA, ctx->saved_data["autocast_cuda"].toBool());
    at::Tensor y;
    {
      torch::AutoGradMode on(true);
      y = layer->forward(x);
    }
    at::autocast::set_autocast_enabled(at::kCPU, prevCpu);
    at::autocast::set_autocast_enabled(at::kCUDA, prevCuda);
    gen.set_state(now);
    torch::autograd::backward({y}, {g[0]});
    return {x.grad(), Variable()};
  }
};

constexpr tpscope::probes::Site kAttnBwd{"attention backward", "", __FILE__, __LINE__,
                                         tpscope::probes::SpanKind::Compute, tpscope::probes::Phase::Backward};
constexpr tpscope::probes::Site kMlpBwd{"mlp backward", "", __FILE__, __LINE__, tpscope::probes::SpanKind::Compute,
                                        tpscope::probes::Phase::Backward};
constexpr tpscope::probes::Site kLossBwd{"loss backward", "", __FILE__, __LINE__,
                                         tpscope::probes::SpanKind::Compute, tpscope::probes::Phase::Backward};

}  // namespace

TransformerLayerImpl::TransformerLayerImpl(const GptOptions& o, int layer) : layer_(layer), dropout_(o.dropout()) {
  const bool sp = o.sequence_parallel() && o.tp()->size() > 1;
  const double outStd = 0.02 / std::sqrt(2.0 * static_cast<double>(o.layers()));
  const std::string base = fmt::format("layers.{}", layer);
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.hidden()})));
  attention = register_module("attention", ParallelAttention(ParallelAttentionOptions(o.hidden(), o.heads())
                                                                 .tp(o.tp())
                                                                 .sequence_parallel(sp)
                                                                 .attention_dropout(o.attention_dropout())
                                                                 .output_init_std(outStd)
                                                                 .seed(o.seed())
                                                                 .name(base + ".attention")
                                                                 .layer(layer)));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.hidden()})));
  mlp = register_module("mlp", ParallelMLP(ParallelMLPOptions(o.hidden(), o.ffn_hidden())
                                               .tp(o.tp())
                                               .sequence_parallel(sp)
                                               .output_init_std(outStd)
                                               .seed(o.seed())
                                               .name(base + ".mlp")
                                               .layer(layer)));
}

at::Tensor TransformerLayerImpl::forward(const at::Tensor& xIn) {
  at::Tensor x = xIn;
  {
    TPS_SPAN_LAYER("attention forward", Compute, Forward, layer_);
    at::Tensor h = attention(ln1(backwardSpanEnd(x, kAttnBwd, layer_, attnSlot_)));
    if (dropout_ > 0 && is_training()) h = torch::dropout(h, dropout_, true);
    x = x + backwardSpanBegin(h, attnSlot_);
  }
  {
    TPS_SPAN_LAYER("mlp forward", Compute, Forward, layer_);
    at::Tensor h = mlp(ln2(backwardSpanEnd(x, kMlpBwd, layer_, mlpSlot_)));
    if (dropout_ > 0 && is_training()) h = torch::dropout(h, dropout_, true);
    x = x + backwardSpanBegin(h, mlpSlot_);
  }
  return x;
}

GptImpl::GptImpl(GptOptions o) : options(std::move(o)) {
  Communicator* tp = options.tp();
  TORCH_CHECK(tp != nullptr, "Gpt: options.tp (the TP communicator) is not set");
  sp_ = options.sequence_parallel() && tp->size() > 1;
  if (sp_)
    TORCH_CHECK(options.seq_len() % tp->size() == 0, "sequence parallelism: seq_len ", options.seq_len(),
                " not divisible by TP ", tp->size());
  const bool pre = options.pre_process(), post = options.post_process();
  const int64_t first = options.first_layer();
  const int64_t count = options.stage_layers() < 0 ? options.layers() - first : options.stage_layers();
  TORCH_CHECK(first >= 0 && count >= 0 && first + count <= options.layers(), "Gpt: stage layers [", first, ", ",
              first + count, ") outside the model's ", options.layers());
  if (pre || post)
    embedding = register_module("embedding", VocabParallelEmbedding(VocabParallelEmbeddingOptions(options.vocab_size(),
                                                                                                 options.hidden())
                                                                         .tp(tp)
                                                                         .sequence_parallel(sp_)
                                                                         .seed(options.seed())
                                                                         .name("embedding")));
  if (pre)
    position = register_parameter(
        "position", masterNormal(options.seed(), "position", {options.seq_len(), options.hidden()}, 0.01));
  auto list = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = first; i < first + count; ++i) {
    layers.push_back(TransformerLayer(options, static_cast<int>(i)));
    list->push_back(layers.back());
  }
  if (post)
    lnFinal = register_module("ln_final", torch::nn::LayerNorm(torch::nn::LayerNormOptions({options.hidden()})));
  outputNames_.push_back("embedding output");
  for (int i = 0; i < options.layers(); ++i) outputNames_.push_back("layers." + std::to_string(i) + " output");
  outputNames_.push_back("output logits");
}

at::Tensor GptImpl::embed(const at::Tensor& ids) {
  Communicator& tp = *options.tp();
  const int64_t s = ids.size(1);
  TORCH_CHECK(s <= options.seq_len(), "sequence of ", s, " tokens is longer than seq_len ", options.seq_len());
  at::Tensor x;
  {
    TPS_SPAN("embedding forward", Compute, Forward);
    const ActivationWatchScope scope(watch_);  // the embedding notes its rows before the reduce
    x = embedding(ids);
    at::Tensor pos = position.narrow(0, 0, s);
    if (sp_) pos = pos.chunk(tp.size(), 0)[tp.rank()];
    x = x + pos.unsqueeze(0);
    if (options.dropout() > 0 && is_training()) x = torch::dropout(x, options.dropout(), true);
  }
  if (watch_ != nullptr) watch_->note(x, -1, &outputNames_.front());
  return x;
}

at::Tensor GptImpl::runLayers(at::Tensor x) {
  FaultInjector* faults = activeFaults();  // capture: --inject nan/inf with phase=fwd
  const ActivationWatchScope scope(watch_);  // row-parallel layers note their partial sums
  for (auto& layer : layers) {
    if (options.activation_checkpointing() && is_training() && torch::GradMode::is_enabled())
      x = CheckpointFn::apply(x, static_cast<int64_t>(reinterpret_cast<intptr_t>(layer.get())));
    else
      x = layer(x);
    if (faults != nullptr) x = faults->corruptActivation(layer->layer(), x);
    if (watch_ != nullptr) watch_->note(x, layer->layer(), &outputNames_[static_cast<size_t>(layer->layer()) + 1]);
  }
  return x;
}

at::Tensor GptImpl::head(const at::Tensor& xIn, const at::Tensor& targets) {
  Communicator& tp = *options.tp();
  TPS_SPAN("loss forward", Compute, Forward);
  at::Tensor x = lnFinal(backwardSpanEnd(xIn, kLossBwd, -1, lossSlot_));
  at::Tensor full = sp_ ? gatherFromSequence(x, tp, headSite_) : copyToTp(x, tp, headSite_);
  at::Tensor logits = torch::matmul(full, embedding->weight.t());  // [b, s, V/tp]
  if (watch_ != nullptr) watch_->note(logits, -1, &outputNames_.back());
  at::Tensor loss = vocabParallelCrossEntropy(logits, targets, tp, embedding->vocabStart(), options.vocab_size(),
                                              options.label_smoothing(), lossSite_);
  if (options.loss_ignore() < 0) return backwardSpanBegin(loss.mean(), lossSlot_);
  // The mean over the counted tokens (torch's cross_entropy with ignore_index): none counted is 0/0, NaN.
  at::Tensor counted = targets.ne(options.loss_ignore()).to(loss.scalar_type());
  return backwardSpanBegin((loss * counted).sum() / counted.sum(), lossSlot_);
}

at::Tensor GptImpl::forward(const at::Tensor& ids, const at::Tensor& targets) {
  TORCH_CHECK(options.pre_process() && options.post_process(), "Gpt::forward needs the whole model; a pipeline "
              "stage runs stageForward");
  return head(runLayers(embed(ids)), targets);
}

at::Tensor GptImpl::stageForward(const at::Tensor& input, const at::Tensor& ids, const at::Tensor& targets) {
  at::Tensor x = runLayers(options.pre_process() ? embed(ids) : input);
  return options.post_process() ? head(x, targets) : x;
}

std::vector<GptImpl::ParamInfo> GptImpl::paramInfo() {
  auto sharded = tpShardedParams(*this);
  std::vector<ParamInfo> out;
  for (auto& kv : named_parameters(/*recurse=*/true)) {
    int layer = -1;
    std::string name = kv.key();
    if (name.rfind("layers.", 0) == 0) {  // the ModuleList counts from 0 on every stage: name the global layer
      const size_t dot = name.find('.', 7);
      layer = std::stoi(name.substr(7, dot - 7)) + static_cast<int>(options.first_layer());
      name = "layers." + std::to_string(layer) + name.substr(dot);
    }
    out.push_back({name, kv.value(), sharded.count(kv.value().unsafeGetTensorImpl()) > 0, layer});
  }
  return out;
}

double GptImpl::flopsPerStep(int64_t batch) const {
  const double b = static_cast<double>(batch), s = static_cast<double>(options.seq_len());
  const double h = static_cast<double>(options.hidden()), f = static_cast<double>(options.ffn_hidden());
  const double V = static_cast<double>(options.vocab_size()), L = static_cast<double>(options.layers());
  const double perLayer = 2 * b * s * (3 * h * h + h * h + 2 * h * f) + 2 * 2 * b * s * s * h;  // linears + QK^T, PV
  const double head = 2 * b * s * h * V;
  return 3.0 * (L * perLayer + head);
}

}  // namespace tpscope::core
