#include "tpscope/core/trainer.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tpscope/core/activation_health.h"
#include "tpscope/core/checkpoint.h"
#include "tpscope/core/data.h"
#include "tpscope/core/faults.h"
#include "tpscope/core/gpt.h"
#include "tpscope/core/grad_health.h"
#include "tpscope/core/grad_reducer.h"
#include "tpscope/core/loss_scaler.h"
#include "tpscope/core/op_check.h"
#include "pipeline_runner.h"
#include "tpscope/core/replica_check.h"

namespace tpscope::core {

namespace fs = std::filesystem;
namespace probes = ::tpscope::probes;

namespace {
double processCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
}  // namespace

double learningRate(const rules::TrainConfig& c, int64_t step) {
  if (c.warmup > 0 && step <= c.warmup) return c.lr * static_cast<double>(step) / static_cast<double>(c.warmup);
  const double span = static_cast<double>(std::max<int64_t>(1, c.steps - c.warmup));
  const double progress = std::clamp(static_cast<double>(step - c.warmup) / span, 0.0, 1.0);
  return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(M_PI * progress));
}

struct Trainer::Impl {
  rules::TrainConfig cfg;
  Mesh* mesh;
  Corpus corpus;
  std::unique_ptr<BatchSampler> sampler;
  Gpt model{nullptr};       // PP = 1: the whole model
  std::vector<Gpt> chunks;  // this rank's model chunks (PP > 1: its stage's; PP = 1: {model})
  std::unique_ptr<PipelineRunner> pipeline;  // PP > 1
  std::vector<bool> embeddingCopy;  // per param: the last stage's copy of the tied embedding (PP > 1)
  std::vector<GptImpl::ParamInfo> params;
  std::vector<std::string> names;
  std::vector<int> layers;
  std::vector<int64_t> numels;
  std::vector<int> owner;  // ZeRO-1: DP rank that updates each parameter (unused without ZeRO)
  std::unique_ptr<torch::optim::AdamW> optimizer;
  std::unique_ptr<GradReducer> reducer;
  std::unique_ptr<StepHooks> hooks;  // capture: fault injection + live health rules (faults.h)
  std::unique_ptr<ReplicaCheck> replicas;  // capture: silent data corruption across replicas (replica_check.h)
  ActivationWatch activations;       // capture: non-finite forward outputs (activation_health.h)
  c10::Device device{c10::kCPU};     // the mesh's: the CPU or this rank's GPU
  std::unique_ptr<DynamicLossScaler> scaler;  // fp16 / loss_scale > 0
  std::vector<size_t> spReplicated;  // sequence parallel: replicated params whose grads are summed over TP
  bool sp = false;

  Callsite lossSite{"step loss mean over DP", -1};
  Callsite ppLossSite{"step loss from the last pipeline stage", -1};
  Callsite ppClipSite{"gradient global norm over pipeline stages", -1};
  Callsite embdSite{"tied embedding gradient (first + last stage)", -1};
  Callsite clipSite{"gradient global norm over TP", -1};
  Callsite spSite{"sequence-parallel replicated gradients", -1};
  Callsite zeroSite{"ZeRO-1 parameter broadcast", -1};
  Callsite ckptSite{"checkpoint save", -1};
  // The replay state (Trainer::trainStep's comment): where, and what the current step started from.
  std::string replayStateRoot;  // <TPSCOPE_OUT>/replay-state; "" when not recording, or replaying
  bool replayStateSaved = false;
  at::Tensor stepRng;    // the CPU generator's state when the step began
  double stepScale = 0;  // the loss scaler's (scale, good steps) when the step began
  int64_t stepGoodSteps = 0;

  // This rank's file of a checkpoint of `step` in `dir`: its parameters and optimizer state as they are now, the
  // generator state `rng`, the loss scaler's (scale, good steps).
  void writeRankState(const std::string& dir, int64_t step, const at::Tensor& rng, double scale,
                      int64_t goodSteps) const {
    fs::create_directories(dir);
    torch::serialize::OutputArchive ar;
    for (auto& p : params) ar.write("param/" + p.name, p.param.detach());
    torch::serialize::OutputArchive opt;
    optimizer->save(opt);
    ar.write("optimizer", opt);
    ar.write("rng", rng);
    if (scaler) ar.write("loss_scaler", torch::tensor({scale, static_cast<double>(goodSteps)}, torch::kDouble));
    ar.write("meta", torch::tensor({step, static_cast<int64_t>(mesh->tp()), static_cast<int64_t>(mesh->dp()),
                                    static_cast<int64_t>(mesh->rank())}));
    const std::string file = checkpointRankFile(dir, mesh->rank());
    ar.save_to(file + ".tmp");
    fs::rename(file + ".tmp", file);
  }

  // The manifest of a checkpoint of `step` in `dir` (every rank's file named), written whole (tmp + rename).
  void writeManifest(const std::string& dir, int64_t step) const {
    nlohmann::json j;
    j["format"] = "tpscope-checkpoint";
    j["version"] = kCheckpointVersion;
    j["step"] = step;
    j["tp"] = mesh->tp();
    j["dp"] = mesh->dp();
    j["pp"] = mesh->pp();
    j["world"] = mesh->worldSize();
    j["zero1"] = cfg.zero1;
    auto files = nlohmann::json::array();
    for (int r = 0; r < mesh->worldSize(); ++r) files.push_back(fs::path(checkpointRankFile(dir, r)).filename());
    j["files"] = files;
    j["config"] = nlohmann::json::parse(cfg.toJson());
    const fs::path tmp = fs::path(dir) / ("manifest.json.tmp-" + std::to_string(mesh->rank()));
    std::ofstream(tmp) << j.dump(2) << "\n";
    fs::rename(tmp, fs::path(dir) / "manifest.json");
  }

  void noteStepStart() {
    if (replayStateRoot.empty() || replayStateSaved) return;
    stepRng = at::detail::getDefaultCPUGenerator().get_state();
    if (scaler) {
      stepScale = scaler->scale();
      stepGoodSteps = scaler->goodSteps();
    }
  }

  // Before step `step`'s update, on this rank's first non-finite value: the state the step started from.
  void saveReplayState(int64_t step) {
    if (replayStateRoot.empty() || replayStateSaved || !stepRng.defined() || step <= 1) return;  // 1: from step 1
    replayStateSaved = true;
    TPS_SPAN("replay state save", Checkpoint, Checkpoint);
    try {
      const std::string dir = checkpointStepDir(replayStateRoot, step - 1);
      writeRankState(dir, step - 1, stepRng, stepScale, stepGoodSteps);
      writeManifest(dir, step - 1);
    } catch (const std::exception& e) {  // the run goes on; tpscope replay then starts from a checkpoint or step 1
      std::fprintf(stderr, "tpscope-train: rank %d: the replay state of step %lld was not written: %s\n", mesh->rank(),
                   static_cast<long long>(step), e.what());
    }
  }

  bool zeroSharded() const { return cfg.zero1 && mesh->dp() > 1; }

  void buildOptimizer() {
    std::vector<at::Tensor> decay, noDecay;
    for (size_t i = 0; i < params.size(); ++i) {
      if (zeroSharded() && owner[i] != mesh->dpRank()) continue;  // ZeRO-1: only the parameters this rank owns
      (params[i].param.dim() >= 2 ? decay : noDecay).push_back(params[i].param);
    }
    std::vector<torch::optim::OptimizerParamGroup> groups;
    auto opts = [&](double wd) {
      auto o = std::make_unique<torch::optim::AdamWOptions>(cfg.lr);
      o->betas({cfg.beta1, cfg.beta2}).eps(cfg.adam_eps).weight_decay(wd);
      return o;
    };
    groups.emplace_back(decay, opts(cfg.weight_decay));
    groups.emplace_back(noDecay, opts(0.0));
    optimizer = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(cfg.lr));
  }

  // `known`: each gradient's sum of squares where the health pass already read it (GradHealthStats::sumSquares, the
  // same pass gradSumSquares takes: recording changes no bit of the update), -1 where not; null: none known.
  double clipGradients(const std::vector<double>* known) {
    TPS_SPAN("gradient clipping", Optimizer, Optimizer);
    torch::NoGradGuard ng;
    const bool leadTp = mesh->tpRank() == 0;
    // With PP the last stage's copy of the tied embedding is the first stage's parameter again: counted there only.
    // [0]: squares of what the norm counts — sharded parameters, and replicated ones once (on TP rank 0);
    // [1]: squares of the replicated copies on the other TP ranks, which must be identical but can go non-finite on
    //      one rank alone (a fault, an fp16 overflow): counted only for finiteness, so every rank sees it.
    // Host gradients are summed on the host in one pass each (gradSumSquares); device ones on their device.
    std::vector<at::Tensor> counted, copies;
    double hostSums[2] = {0, 0};
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& g = params[i].param.grad();
      if (!g.defined()) continue;
      const bool once = (params[i].sharded || leadTp) && !embeddingCopy[i];
      double s = known != nullptr && i < known->size() ? (*known)[i] : -1;
      if (s < 0) s = gradSumSquares(g);
      if (s >= 0 || std::isnan(s))
        hostSums[once ? 0 : 1] += s;
      else
        (once ? counted : copies).push_back(g.norm().square());
    }
    auto sum = [&](const std::vector<at::Tensor>& v, double host) {
      return (v.empty() ? torch::zeros({}, torch::TensorOptions(device).dtype(at::kDouble))
                        : torch::stack(v).sum().to(at::kDouble)) +
             host;
    };
    at::Tensor total = torch::stack({sum(counted, hostSums[0]), sum(copies, hostSums[1])});
    mesh->tpGroup().allReduce(total, ReduceOp::Sum, clipSite, probes::Phase::Optimizer);
    mesh->ppGroup().allReduce(total, ReduceOp::Sum, ppClipSite, probes::Phase::Optimizer);  // PP = 1: nothing
    const at::Tensor host = total.to(at::kCPU);
    const double* t = host.data_ptr<double>();
    const double norm = std::isfinite(t[1]) ? std::sqrt(t[0]) : t[1];
    if (cfg.clip > 0 && norm > cfg.clip) {
      const double coef = cfg.clip / (norm + 1e-6);
      for (auto& p : params)
        if (p.param.grad().defined()) p.param.mutable_grad().mul_(coef);
    }
    return norm;
  }

  void unscaleGradients(double lossScale) {
    torch::NoGradGuard ng;
    for (auto& p : params)
      if (p.param.grad().defined()) p.param.mutable_grad().mul_(1.0 / lossScale);
  }

  // The model's loss on one micro-batch (moved to the device), under autocast when the config asks for bf16/fp16.
  at::Tensor forward(at::Tensor ids, at::Tensor targets) { return forwardChunk(model, at::Tensor(), ids, targets); }

  // One model chunk's forward (pipeline_runner.h): `input` from the previous stage, or the tokens `ids`.
  at::Tensor forwardChunk(Gpt& chunk, const at::Tensor& input, at::Tensor ids, at::Tensor targets) {
    const rules::TrainConfig& c = cfg;
    at::Tensor out;
    if (device.is_cuda() && ids.defined()) {
      ids = ids.to(device, /*non_blocking=*/true);
      targets = targets.to(device, /*non_blocking=*/true);
    }
    auto run = [&] { return chunk->stageForward(input, ids, targets); };
    if ((c.bf16 || c.fp16) && device.is_cuda()) {
      at::autocast::set_autocast_dtype(at::kCUDA, c.fp16 ? at::kHalf : at::kBFloat16);
      at::autocast::set_autocast_enabled(at::kCUDA, true);
      out = run();
      at::autocast::set_autocast_enabled(at::kCUDA, false);
      at::autocast::clear_cache();
    } else if (c.bf16) {
      at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
      at::autocast::set_autocast_enabled(at::kCPU, true);
      out = run();
      at::autocast::set_autocast_enabled(at::kCPU, false);
      at::autocast::clear_cache();
    } else {
      out = run();
    }
    return out;
  }

  // PP > 1: the tied embedding's two copies (first and last stage) get the sum of their gradients.
  void reduceTiedEmbedding() {
    if (mesh->embeddingGroup().size() == 1) return;
    torch::NoGradGuard ng;
    for (auto& p : params) {
      if (p.name != "embedding.weight") continue;
      if (!p.param.grad().defined()) p.param.mutable_grad() = torch::zeros_like(p.param);
      mesh->embeddingGroup().allReduce(p.param.mutable_grad(), ReduceOp::Sum, embdSite, probes::Phase::Backward);
    }
  }

  void reduceSequenceParallel() {
    if (!sp || spReplicated.empty()) return;
    torch::NoGradGuard ng;
    std::vector<at::Tensor> flat;
    for (size_t i : spReplicated) flat.push_back(params[i].param.grad().reshape({-1}));
    at::Tensor buf = torch::cat(flat);
    mesh->tpGroup().allReduce(buf, ReduceOp::Sum, spSite, probes::Phase::Backward);
    int64_t off = 0;
    for (size_t i : spReplicated) {
      at::Tensor& g = params[i].param.mutable_grad();
      g.copy_(buf.narrow(0, off, g.numel()).view_as(g));
      off += g.numel();
    }
  }

  void zeroBroadcast() {
    if (!zeroSharded()) return;
    torch::NoGradGuard ng;
    for (int d = 0; d < mesh->dp(); ++d) {
      std::vector<at::Tensor> mine;
      for (size_t i = 0; i < params.size(); ++i)
        if (owner[i] == d) mine.push_back(params[i].param.reshape({-1}));
      if (mine.empty()) continue;
      at::Tensor buf = torch::cat(mine);
      mesh->dpGroup().broadcast(buf, d, zeroSite, probes::Phase::Optimizer);
      int64_t off = 0;
      for (size_t i = 0; i < params.size(); ++i) {
        if (owner[i] != d) continue;
        at::Tensor& p = params[i].param;
        p.copy_(buf.narrow(0, off, p.numel()).view_as(p));
        off += p.numel();
      }
    }
  }
};

Trainer::Trainer(const rules::TrainConfig& config, Mesh& mesh) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.cfg = config;
  m.mesh = &mesh;
  config.validate(mesh.tp(), mesh.dataDp(), mesh.pp());
  if (config.zero1 && mesh.dataDp() != mesh.dp())
    throw rules::ConfigError(
        fmt::format("TPSCOPE_REPLAY_DP: a DP replica is not replayed alone with zero1 (its "
                    "optimizer state is spread over the run's {} replicas)",
                    mesh.dataDp()));
  m.corpus = Corpus::load(config.corpusPath());
  m.sampler = std::make_unique<BatchSampler>(m.corpus, config.seq_len, config.micro_batch_size, config.seed);
  // Same dropout stream on every TP rank of a replica (replicated regions must agree), different across replicas.
  torch::manual_seed(config.seed + 1 + 1000003ull * static_cast<uint64_t>(mesh.dataDpRank()));
  const GptOptions base = GptOptions()
                              .layers(config.layers)
                              .hidden(config.hidden)
                              .heads(config.heads)
                              .ffn_hidden(config.ffn_hidden)
                              .seq_len(config.seq_len)
                              .vocab_size(config.vocab_size)
                              .dropout(config.dropout)
                              .attention_dropout(config.attention_dropout)
                              .label_smoothing(config.label_smoothing)
                              .loss_ignore(config.loss_ignore_byte)
                              .sequence_parallel(config.sequence_parallel)
                              .activation_checkpointing(config.activation_checkpointing)
                              .seed(config.seed)
                              .tp(&mesh.tpGroup());
  if (mesh.pp() == 1) {
    m.model = Gpt(base);
    m.chunks = {m.model};
  } else {
    // Virtual stage vs = chunk * pp + stage holds the next stageLayers()[vs] layers (pipeline_schedule.h).
    const std::vector<int64_t> split = config.stageLayers(mesh.pp());
    const int v = static_cast<int>(split.size()) / mesh.pp();
    for (int chunk = 0; chunk < v; ++chunk) {
      const int vs = chunk * mesh.pp() + mesh.ppRank();
      int64_t first = 0;
      for (int i = 0; i < vs; ++i) first += split[static_cast<size_t>(i)];
      m.chunks.push_back(Gpt(GptOptions(base)
                                 .first_layer(first)
                                 .stage_layers(split[static_cast<size_t>(vs)])
                                 .pre_process(vs == 0)
                                 .post_process(vs == static_cast<int>(split.size()) - 1)));
    }
  }
  m.device = mesh.device();
  if (config.device == "cuda" && !m.device.is_cuda())
    throw rules::ConfigError("config: device = \"cuda\" needs a mesh built for CUDA (MeshOptions::cuda)");
  for (auto& chunk : m.chunks) {
    if (m.device.is_cuda()) chunk->to(m.device);  // the master initialisation is cut on the host, then moved
    chunk->train();
  }
  if (config.initialLossScale() > 0)
    m.scaler = std::make_unique<DynamicLossScaler>(config.initialLossScale(), config.loss_scale_window);
  m.sp = config.sequence_parallel && mesh.tp() > 1;
  std::vector<at::Tensor> shared;
  for (auto& chunk : m.chunks) {
    for (auto& p : chunk->paramInfo()) m.params.push_back(p);
    for (auto& t : chunk->sharedParams()) shared.push_back(t);
  }
  const bool copyHolder = mesh.pp() > 1 && mesh.lastStage();  // the last stage's embedding is the head's copy
  for (const auto& p : m.params) m.embeddingCopy.push_back(copyHolder && p.name == "embedding.weight");
  if (mesh.pp() > 1) m.pipeline = std::make_unique<PipelineRunner>(m.cfg, mesh, m.chunks, m.device);
  std::vector<at::Tensor> ps;
  std::vector<bool> late;
  for (size_t i = 0; i < m.params.size(); ++i) {
    const auto& p = m.params[i];
    m.names.push_back(p.name);
    m.layers.push_back(p.layer);
    m.numels.push_back(p.param.numel());
    ps.push_back(p.param);
    bool isShared = false;
    for (auto& s : shared) isShared |= s.is_same(p.param);
    late.push_back(isShared);
    if (m.sp && !p.sharded) m.spReplicated.push_back(i);
  }
  // ZeRO-1 ownership: greedy by size (largest first) onto the least-loaded DP rank; identical on every rank.
  m.owner.assign(m.params.size(), 0);
  if (config.zero1 && mesh.dp() > 1) {
    std::vector<size_t> order(m.params.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return m.numels[a] > m.numels[b]; });
    std::vector<int64_t> load(mesh.dp(), 0);
    for (size_t i : order) {
      int best = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
      m.owner[i] = best;
      load[best] += m.numels[i];
    }
  }
  m.buildOptimizer();
  // capture: before the reducer, so injected gradient faults reach its hooks.
  m.hooks = std::make_unique<StepHooks>(mesh, m.names, m.layers, ps, static_cast<int>(config.layers));
  const char* out = std::getenv("TPSCOPE_OUT");
  if (out != nullptr && *out != '\0' && std::getenv("TPSCOPE_REPLAY_STEP") == nullptr)
    m.replayStateRoot = (fs::path(out) / "replay-state").string();
  m.reducer = std::make_unique<GradReducer>(ps, late, mesh.dpGroup(), config.bucket_mb * 1024 * 1024,
                                            config.overlap_grad_reduce);
  std::vector<ReplicaTensor> replicated;
  for (const auto& p : m.params) replicated.push_back({p.name, p.layer, p.param, !p.sharded});
  m.replicas = std::make_unique<ReplicaCheck>(config, mesh, std::move(replicated), *m.hooks);
}

Trainer::~Trainer() = default;

double Trainer::flopsPerStep() const {
  // The whole model's (every stage computes its share of it).
  return impl_->chunks.front()->flopsPerStep(impl_->cfg.micro_batch_size * impl_->cfg.grad_accum);
}

StepMetrics Trainer::trainStep(int64_t step) {
  Impl& m = *impl_;
  const rules::TrainConfig& c = m.cfg;
  TPS_STEP(static_cast<int>(step));
  const uint64_t t0 = probes::rawTicks();
  const auto wall0 = std::chrono::steady_clock::now();
  const double cpu0 = processCpuSeconds();
  probes::Sink* sink = probes::sink();
  StepMetrics out;
  out.step = step;
  bool skipUpdate = false;  // capture: the health policy (or a loss-scale overflow) dropped this update
  const double lossScale = m.scaler ? m.scaler->scale() : 1.0;
  m.noteStepStart();  // the replay state: what the step starts from
  {
    TPS_SPAN("train step", Step, None);
    m.hooks->stepBegin(step);  // capture: --inject slow/crash
    const bool watch = sink != nullptr || m.hooks->wantsHealth();  // capture: gradient and activation health
    m.activations.beginStep();
    for (auto& chunk : m.chunks) chunk->watchActivations(watch ? &m.activations : nullptr);
    for (auto& p : m.params) p.param.mutable_grad() = at::Tensor();
    double lossSum = 0;
    at::Tensor lossAcc = torch::zeros({1}, m.device);
    if (m.pipeline) {
      lossAcc = m.pipeline->run(
          step, *m.sampler, lossScale,
          [&m](Gpt& chunk, const at::Tensor& input, at::Tensor ids, at::Tensor targets) {
            return m.forwardChunk(chunk, input, std::move(ids), std::move(targets));
          },
          [&m](int micro) {
            m.activations.setMicroBatch(micro);
            if (OpCheck* oc = activeOpCheck()) oc->setMicrobatch(micro);
          },
          [&m, watch] { m.reducer->beginLastMicrobatch(watch); });
      // The loss lives on the last stage: every stage takes it (health rules, metrics).
      m.mesh->ppGroup().allReduce(lossAcc, ReduceOp::Sum, m.ppLossSite, probes::Phase::Optimizer);
    }
    for (int64_t micro = 0; !m.pipeline && micro < c.grad_accum; ++micro) {
      at::Tensor ids = torch::empty({c.micro_batch_size, c.seq_len}, torch::kLong);
      at::Tensor targets = torch::empty({c.micro_batch_size, c.seq_len}, torch::kLong);
      {
        TPS_SPAN("data loading", Data, Data);
        m.sampler->fill(step, micro, c.grad_accum, m.mesh->dataDpRank(), m.mesh->dataDp(), ids.data_ptr<int64_t>(),
                        targets.data_ptr<int64_t>());
      }
      const bool last = micro + 1 == c.grad_accum;
      m.activations.setMicroBatch(static_cast<int>(micro));
      if (OpCheck* oc = activeOpCheck()) oc->setMicrobatch(static_cast<int>(micro));
      at::Tensor loss = m.forward(ids, targets);
      if (last) m.reducer->beginLastMicrobatch(watch);
      // Dynamic loss scaling: the gradients come out `lossScale` times too large (no fp16 underflow) until unscaled.
      (loss * (lossScale / static_cast<double>(c.grad_accum))).backward();
      lossAcc += loss.detach().to(at::kFloat);
    }
    // Pre-reduction gradient health (captured per bucket before its DP all-reduce); defined whenever requested.
    GradHealthStats health = m.reducer->finish();
    m.reduceTiedEmbedding();  // PP > 1
    std::vector<probes::GradStat> gradStats;  // one host copy, for the trace and the health rules
    if (health.defined()) {
      if (lossScale != 1.0) health.values.div_(lossScale);  // norm and max |g|
      gradStats = gradStatsOnHost(m.names, m.layers, m.numels, health);
      if (sink != nullptr) sink->gradStats(static_cast<int>(step), gradStats);
    }
    m.reduceSequenceParallel();
    if (lossScale != 1.0) m.unscaleGradients(lossScale);
    // The health pass's sums of squares are the clip's where nothing touched the gradients in between.
    const bool sameGradients = m.mesh->dp() == 1 && m.mesh->pp() == 1 && !m.sp && lossScale == 1.0;
    out.gradNorm = m.clipGradients(sameGradients && !health.sumSquares.empty() ? &health.sumSquares : nullptr);
    // The norm is global (TP all-reduce of DP-reduced gradients): every rank takes the same overflow decision.
    const bool overflow = m.scaler && m.scaler->update(out.gradNorm);
    // The replay state: on a rank that saw a non-finite value, and on every rank where the global gradient norm is
    // one (the whole job at once: a replay of one TP group or DP replica finds every rank it needs).
    const auto keepState = [&] {
      if (m.hooks->sawNonFinite(step) || !std::isfinite(out.gradNorm)) m.saveReplayState(step);
    };
    try {
      skipUpdate = m.hooks->beforeUpdate(step, gradStats, watch ? &m.activations : nullptr, lossAcc, c.grad_accum,
                                         out.gradNorm);  // capture: health rules
    } catch (const NonFiniteStop&) {
      keepState();  // stop: the state is kept all the same
      throw;
    }
    keepState();  // before the update: the state the step began from
    skipUpdate = skipUpdate || overflow;
    out.lr = learningRate(c, step);
    {
      TPS_SPAN("optimizer step", Optimizer, Optimizer);
      for (auto& g : m.optimizer->param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(out.lr);
      if (!skipUpdate) m.optimizer->step();
      if (!skipUpdate) m.zeroBroadcast();
    }
    // Loss: mean over micro-batches, then over DP replicas (identical across TP).
    lossAcc.div_(static_cast<double>(c.grad_accum));
    m.mesh->dpGroup().allReduce(lossAcc, ReduceOp::Sum, m.lossSite, probes::Phase::Optimizer);
    lossSum = lossAcc.item<double>() / m.mesh->dp();
    out.loss = lossSum;
    m.replicas->afterStep(step);  // capture: --inject bitflip, replica fingerprints (may stop every rank)
    m.hooks->stepEnd(step);        // tpscope replay: the op check's verdict on this step
  }
  out.stepTimeS = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  out.stepCpuS = processCpuSeconds() - cpu0;
  out.tokens = c.micro_batch_size * c.seq_len * c.grad_accum * m.mesh->dp();
  out.tokensPerS = static_cast<double>(out.tokens) / std::max(out.stepTimeS, 1e-9);
  out.lossScale = lossScale;
  out.skipped = skipUpdate;
  if (sink != nullptr) {
    probes::StepStat st;
    st.step = static_cast<int>(step);
    st.loss = out.loss;
    st.lr = out.lr;
    st.gradNorm = out.gradNorm;
    st.lossScale = lossScale;
    st.tokens = c.micro_batch_size * c.seq_len * c.grad_accum;
    st.t0 = t0;
    st.t1 = probes::rawTicks();
    st.skipped = skipUpdate;
    sink->stepStat(st);
  }
  return out;
}

void Trainer::saveCheckpoint(int64_t step) {
  Impl& m = *impl_;
  TPS_SPAN("checkpoint save", Checkpoint, Checkpoint);
  const std::string root = m.cfg.checkpoint_dir;
  TORCH_CHECK(!root.empty(), "saveCheckpoint: checkpoint_dir is not set");
  const std::string dir = checkpointStepDir(root, step);
  m.writeRankState(dir, step, at::detail::getDefaultCPUGenerator().get_state(), m.scaler ? m.scaler->scale() : 0,
                   m.scaler ? m.scaler->goodSteps() : 0);
  m.mesh->world().barrier(m.ckptSite, probes::Phase::Checkpoint);
  if (m.mesh->rank() == 0) {
    m.writeManifest(dir, step);
    std::ofstream(fs::path(root) / "latest.tmp") << fs::path(dir).filename().string() << "\n";
    fs::rename(fs::path(root) / "latest.tmp", fs::path(root) / "latest");
  }
  m.mesh->world().barrier(m.ckptSite, probes::Phase::Checkpoint);
}

int64_t Trainer::loadCheckpoint(const std::string& where) {
  Impl& m = *impl_;
  TPS_SPAN("checkpoint load", Checkpoint, Checkpoint);
  const std::string dir = resolveCheckpointDir(where);
  nlohmann::json j;
  std::ifstream(fs::path(dir) / "manifest.json") >> j;
  if (j.value("format", "") != "tpscope-checkpoint" || j.value("version", 0) > kCheckpointVersion)
    throw rules::ConfigError(fmt::format("{}: not a tpscope checkpoint of version <= {}", dir, kCheckpointVersion));
  if (j["tp"].get<int>() != m.mesh->tp() || j["dp"].get<int>() != m.mesh->dataDp() ||
      j.value("pp", 1) != m.mesh->pp() || j.value("zero1", false) != m.cfg.zero1)
    throw rules::ConfigError(fmt::format(
        "{} was written with tp={} dp={}{} zero1={}; this run has tp={} dp={}{} zero1={}", dir, j["tp"].get<int>(),
        j["dp"].get<int>(), j.value("pp", 1) > 1 ? fmt::format(" pp={}", j.value("pp", 1)) : "",
        j.value("zero1", false), m.mesh->tp(), m.mesh->dataDp(),
        m.mesh->pp() > 1 ? fmt::format(" pp={}", m.mesh->pp()) : "", m.cfg.zero1));
  torch::serialize::InputArchive ar;
  // A replica replayed alone reads the files of the run's ranks it stands for. The optimizer state lands where the
  // parameters are.
  ar.load_from(checkpointRankFile(dir, m.mesh->jobRank()), m.device);
  torch::NoGradGuard ng;
  for (auto& p : m.params) {
    at::Tensor t;
    ar.read("param/" + p.name, t);
    TORCH_CHECK(t.sizes() == p.param.sizes(), "checkpoint ", dir, ": ", p.name, " has shape ", t.sizes(),
                ", the model expects ", p.param.sizes());
    p.param.copy_(t);
  }
  torch::serialize::InputArchive opt;
  ar.read("optimizer", opt);
  m.optimizer->load(opt);
  at::Tensor rng;
  ar.read("rng", rng);
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(rng.cpu());
  at::Tensor scaler;
  if (m.scaler && ar.try_read("loss_scaler", scaler))
    m.scaler->restore(scaler[0].item<double>(), static_cast<int64_t>(scaler[1].item<double>()));
  return j["step"].get<int64_t>();
}

}  // namespace tpscope::core
