// tpscope-train: runs ONE rank of a tensor-parallel GPT training job (launch WORLD_SIZE of them, torchrun-style).
// Exit codes: 0 done; 1 runtime error; 2 bad usage or config (including a missing corpus); 3 collective timeout
// or failure (the group is unusable, the rank stops); 5 every rank agreed to stop on non-finite values (health policy,
// --on-nonfinite stop; docs/capture.md).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <cstdio>
#include <malloc.h>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tpscope/core/checkpoint.h"
#include "tpscope/core/faults.h"
#include "tpscope/core/mesh.h"
#include "tpscope/core/trainer.h"
#include "tpscope/rules/config.h"
#include "tpscope/rules/pipeline_schedule.h"

#if TPSCOPE_TRAIN_WITH_RUNTIME
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "tpscope/probes/runtime.h"
#endif
#if TPSCOPE_TRAIN_WITH_GPU_ACTIVITY
#include "tpscope/probes/gpu_activity.h"
#endif
#if TPSCOPE_HAVE_NVTX
#include "tpscope/probes/nvtx.h"
#endif

namespace core = tpscope::core;
namespace rules = tpscope::rules;

namespace {

constexpr int kExitOk = 0, kExitRuntime = 1, kExitConfig = 2, kExitCollective = 3, kExitNonFinite = 5;

#if TPSCOPE_TRAIN_WITH_RUNTIME
// The recorder's clock alignment over c10d's rendezvous store. Never throws (KvStore contract).
class C10dKvStore final : public tpscope::probes::KvStore {
 public:
  // Holds its own reference: the recorder stops (and aligns clocks over the store) after an exception has unwound
  // run() and destroyed the Mesh, on the error exit paths of main().
  explicit C10dKvStore(c10d::Store* store) : store_(c10::intrusive_ptr<c10d::Store>::reclaim_copy(store)) {}
  bool set(std::string_view key, std::string_view value) noexcept override {
    try {
      store_->set(std::string(key), std::vector<uint8_t>(value.begin(), value.end()));
      return true;
    } catch (...) {
      return false;
    }
  }
  std::optional<std::string> get(std::string_view key, std::chrono::milliseconds timeout) noexcept override {
    try {
      store_->wait({std::string(key)}, timeout);
      auto v = store_->get(std::string(key));
      return std::string(v.begin(), v.end());
    } catch (...) {
      return std::nullopt;
    }
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

// Records this rank's coordinates, groups and config once the mesh exists (TPSCOPE_OUT set by tpscope capture).
void describeRankToRecorder(core::Mesh& mesh, const rules::TrainConfig& cfg) {
  namespace probes = tpscope::probes;
  if (!probes::started()) return;
  tpscope::tracedb::RankInfo info;
  info.rank = mesh.rank();
  info.worldSize = mesh.worldSize();
  info.localRank = mesh.localRank();
  info.tpRank = mesh.tpRank();
  info.tpSize = mesh.tp();
  info.dpRank = mesh.dpRank();
  info.dpSize = mesh.dp();
  const bool cuda = cfg.device == "cuda";
  info.device = cuda ? fmt::format("cuda:{}", mesh.localRank()) : "cpu";
  probes::setRankInfo(info);
  for (core::Communicator* c :
       {&mesh.world(), &mesh.tpGroup(), &mesh.dpGroup(), &mesh.ppGroup(), &mesh.embeddingGroup()})
    if ((c != &mesh.ppGroup() && c != &mesh.embeddingGroup()) || c->size() > 1)  // PP groups only where they exist
      probes::putGroup({c->name(), c->globalRanks(), c->size() > 1 ? (cuda ? "nccl" : "gloo") : ""});
  probes::setMeta("config", cfg.toJson());
  probes::setMeta("torch_version", TORCH_VERSION);  // the LibTorch it runs on (meta built_with: what it was built with)
  if (mesh.pp() > 1) {
    // The pipeline's point-to-point pairs this rank takes part in (each send/recv is recorded on one of them).
    for (int peer : {mesh.ppRank() - 1, mesh.ppRank() + 1, 0, mesh.pp() - 1}) {
      if (peer < 0 || peer >= mesh.pp() || peer == mesh.ppRank()) continue;
      const int a = mesh.rank(), b = mesh.stageRank(peer);
      probes::putGroup({core::Communicator::p2pGroupName(a, b), {a, b}, "gloo"});
      probes::putGroup({core::Communicator::p2pGroupName(b, a), {b, a}, "gloo"});
    }
    const rules::PipelineSchedule kind = rules::parsePipelineSchedule(cfg.schedule);
    nlohmann::json stageOfRank = nlohmann::json::array();
    for (int r = 0; r < mesh.worldSize(); ++r) stageOfRank.push_back(r / (mesh.tp() * mesh.dp()));
    const nlohmann::json pipeline{
        {"schedule", rules::pipelineScheduleName(kind)},
        {"stages", mesh.pp()},
        {"microbatches", cfg.grad_accum},
        {"virtual_stages", kind == rules::PipelineSchedule::Interleaved ? cfg.virtual_stages : 1},
        {"stage_layers", cfg.stageLayers(mesh.pp())},
        {"stage_of_rank", stageOfRank}};
    probes::setMeta(std::string(tpscope::tracedb::meta_keys::kPipeline), pipeline.dump());
  }
  probes::setMeta("emulated_ops", core::Communicator::emulatedOps());
  if (c10d::Store* s = mesh.store()) probes::setClockStore(std::make_shared<C10dKvStore>(s));
}
#endif

// GPU activity on device lanes (TPSCOPE_GPU_ACTIVITY: CUPTI by default on CUDA; `simulated` anywhere) and NVTX
// ranges for every span on CUDA. The activity recorder lives until the process ends: probes::stop()'s final flush
// pulls its last records, whichever exit path runs.
void startDeviceProbes(bool cuda) {
#if TPSCOPE_TRAIN_WITH_GPU_ACTIVITY
  static std::unique_ptr<tpscope::probes::GpuActivityRecorder> gpu;
  gpu = tpscope::probes::startGpuActivityFromEnvironment(cuda);
#endif
#if TPSCOPE_HAVE_NVTX
  if (cuda) tpscope::probes::installNvtxMirror();
#endif
  (void)cuda;
}

void stopRecording(const char* reason) {
#if TPSCOPE_TRAIN_WITH_RUNTIME
  tpscope::probes::stop(reason);
#else
  (void)reason;
#endif
}

// An error exit: the peers are not at the end of the run (gone, or about to fail), so the end-of-run clock alignment
// would only wait its timeout before this rank's exit is seen; the clocks measured at the start stand.
void stopRecordingOnError(const char* reason) {
#if TPSCOPE_TRAIN_WITH_RUNTIME
  tpscope::probes::setClockStore(nullptr);
#endif
  stopRecording(reason);
}

// The command line: what run() needs from it.
struct TrainArgs {
  std::string configPath, metricsPath, resume;
  int tp = 1, dp = 1, pp = 1;
  std::optional<int64_t> steps, microbatches, virtualStages;
  std::optional<int64_t> stopAfter;  // --stop-after: the last step run (the schedule still the run's `steps`)
  std::string schedule;
  std::vector<std::string> sets;
  std::map<std::string, std::string> shortcuts;
  std::vector<std::string> injects;
  std::string onNonfinite, health;
};

// Parses the command line into `args`; returns an exit status when the program must stop (--help, a bad flag).
std::optional<int> parseArgs(int argc, char** argv, TrainArgs& args) {
  CLI::App app{"tpscope-train: one rank of a tensor-parallel GPT training run (see docs/config.md)"};
  app.add_option("--config", args.configPath, "JSON config file (samples/configs/tiny.json, ...)")->required();
  app.add_option("--tp", args.tp, "tensor-parallel size")->check(CLI::PositiveNumber);
  app.add_option("--dp", args.dp, "data-parallel size")->check(CLI::PositiveNumber);
  app.add_option("--pp", args.pp, "pipeline-parallel size (stages); world = tp x dp x pp, Megatron's rank order")
      ->check(CLI::PositiveNumber);
  app.add_option("--schedule", args.schedule, "pipeline schedule: gpipe, 1f1b (default) or interleaved");
  app.add_option("--microbatches", args.microbatches,
                 "micro-batches per step (config key grad_accum): the same global batch at every pp; at pp = 1 "
                 "gradient accumulation")
      ->check(CLI::PositiveNumber);
  app.add_option("--virtual-stages", args.virtualStages, "model chunks per pipeline rank (interleaved schedule)")
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", args.steps, "number of optimizer steps");
  app.add_option("--stop-after", args.stopAfter,
                 "stop after this step, the learning-rate schedule still that of --steps (tpscope replay: the run's "
                 "steps again, to the step it replays)")
      ->check(CLI::PositiveNumber);
  app.add_option("--metrics-jsonl", args.metricsPath, "write one JSON object per step (rank 0)");
  app.add_option("--resume", args.resume, "checkpoint root (uses 'latest') or step folder to resume from");
  app.add_option("--set", args.sets, "override any config key: --set key=value (value is JSON)");
  // capture: fault injection and health policy (docs/capture.md); passed on as TPSCOPE_INJECT / TPSCOPE_HEALTH.
  app.add_option("--inject", args.injects, "inject a fault (repeatable), e.g. nan:rank=1,step=3")
      ->allow_extra_args(false);
  app.add_option("--on-nonfinite", args.onNonfinite, "policy on NaN/Inf: warn, skip-step, stop, trace-ops");
  app.add_option("--health", args.health, "health-rule options, e.g. grad_spike=stop");
  // Shorthands for the common keys: --<key with dashes> VALUE.
  auto& shortcuts = args.shortcuts;
  for (const char* key : {"lr",         "seed",      "micro_batch_size", "grad_accum",
                          "warmup",     "clip",      "dropout",          "label_smoothing",
                          "threads",    "timeout_s", "corpus",           "checkpoint_dir",
                          "save_every", "bucket_mb", "log_every",        "layers",
                          "hidden",     "heads",     "ffn_hidden",       "seq_len",
                          "vocab_size", "device",    "loss_scale",       "loss_scale_window"}) {
    std::string flag = std::string("--") + key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    app.add_option_function<std::string>(flag, [&shortcuts, key](const std::string& v) { shortcuts[key] = v; },
                                          std::string("config key ") + key);
  }
  for (const char* key :
       {"sequence_parallel", "activation_checkpointing", "zero1", "bf16", "fp16", "overlap_grad_reduce"}) {
    std::string flag = std::string("--") + key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    app.add_option_function<std::string>(flag, [&shortcuts, key](const std::string& v) { shortcuts[key] = v; },
                                          std::string("config key ") + key + " (true/false)")
        ->expected(0, 1)
        ->default_str("true");
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitConfig;
  }
  return std::nullopt;
}

// The config file with the command line's overrides, validated; --inject and --health passed on to the engine
// through the environment (TPSCOPE_INJECT, TPSCOPE_HEALTH).
rules::TrainConfig configFrom(const TrainArgs& args) {
  rules::TrainConfig cfg = rules::TrainConfig::fromFile(args.configPath);
  for (auto& [k, v] : args.shortcuts) cfg.set(k, v.empty() ? "true" : v);
  for (const auto& s : args.sets) {
    const auto eq = s.find('=');
    if (eq == std::string::npos) throw rules::ConfigError(fmt::format("--set {}: expected key=value", s));
    cfg.set(s.substr(0, eq), s.substr(eq + 1));
  }
  if (args.steps) cfg.set("steps", std::to_string(*args.steps));
  if (args.microbatches) cfg.set("grad_accum", std::to_string(*args.microbatches));
  if (!args.schedule.empty()) cfg.set("schedule", nlohmann::json(args.schedule).dump());
  if (args.virtualStages) cfg.set("virtual_stages", std::to_string(*args.virtualStages));
  cfg.validate(args.tp, args.dp, args.pp);
  if (!args.injects.empty()) {
    std::string all = std::getenv("TPSCOPE_INJECT") != nullptr ? std::getenv("TPSCOPE_INJECT") : "";
    for (const auto& i : args.injects) all += (all.empty() ? "" : ";") + i;
    setenv("TPSCOPE_INJECT", all.c_str(), 1);
  }
  if (!args.onNonfinite.empty() || !args.health.empty()) {
    const std::string& health = args.health;
    std::string h =
        args.onNonfinite.empty() ? health : "nonfinite=" + args.onNonfinite + (health.empty() ? "" : "," + health);
    setenv("TPSCOPE_HEALTH", h.c_str(), 1);
  }
  return cfg;
}

// Rank 0's report of one step: a log line every log_every steps (and the last), a --metrics-jsonl object.
void reportStep(int64_t step, const core::StepMetrics& s, const rules::TrainConfig& cfg, const TrainArgs& args,
                std::ofstream& metrics) {
  if ((cfg.log_every > 0 && step % cfg.log_every == 0) || step == cfg.steps)
    fmt::print("step {}/{} loss {:.6f} lr {:.3e} grad_norm {:.4f} tokens/s {:.0f} step_time {:.4f}s{}{}\n", step,
               cfg.steps, s.loss, s.lr, s.gradNorm, s.tokensPerS, s.stepTimeS,
               s.lossScale != 1.0 ? fmt::format(" loss_scale {:g}", s.lossScale) : "",
               s.skipped ? " (update skipped)" : "");
  if (metrics.is_open()) {
    nlohmann::json j{{"step", step},
                     {"loss", s.loss},
                     {"lr", s.lr},
                     {"grad_norm", s.gradNorm},
                     {"tokens_per_s", s.tokensPerS},
                     {"step_time_s", s.stepTimeS},
                     {"step_cpu_s", s.stepCpuS},
                     {"tokens", s.tokens},
                     {"loss_scale", s.lossScale},
                     {"skipped", s.skipped},
                     {"tp", args.tp},
                     {"dp", args.dp},
                     {"pp", args.pp}};
    metrics << j.dump() << "\n" << std::flush;
  }
  std::fflush(stdout);
}

int run(int argc, char** argv) {
  TrainArgs args;
  if (std::optional<int> rc = parseArgs(argc, argv, args)) return *rc;
  const rules::TrainConfig cfg = configFrom(args);
  const int tp = args.tp, dp = args.dp, pp = args.pp;

#if TPSCOPE_TRAIN_WITH_RUNTIME
  if (auto st = tpscope::probes::startFromEnvironment(); !st)
    std::fprintf(stderr, "tpscope-train: recorder not started: %s\n", st.message().c_str());
#endif
  startDeviceProbes(cfg.device == "cuda");
  at::set_num_threads(static_cast<int>(cfg.threads));
  at::set_num_interop_threads(1);

  core::MeshOptions mo;
  mo.tp = tp;
  mo.dp = dp;
  mo.pp = pp;
  mo.timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.timeout_s * 1000));
  mo.cuda = cfg.device == "cuda";
  std::unique_ptr<core::Mesh> mesh;
  try {
    mesh = core::Mesh::fromEnvironment(mo);
  } catch (const std::invalid_argument& e) {
    throw rules::ConfigError(e.what());
  }
#if TPSCOPE_TRAIN_WITH_RUNTIME
  describeRankToRecorder(*mesh, cfg);
#endif
  const bool lead = mesh->rank() == 0;
  // The step report (log line, --metrics-jsonl): the last pipeline stage's first rank, where the loss is computed
  // (rank 0 without PP).
  const bool reporter = mesh->rank() == (pp - 1) * tp * dp;
  core::Trainer trainer(cfg, *mesh);
  int64_t first = 1;
  if (!args.resume.empty()) {
    first = trainer.loadCheckpoint(args.resume) + 1;
    if (lead) fmt::print("resumed from {} at step {}\n", args.resume, first - 1);
  }
  std::ofstream metrics;
  if (reporter && !args.metricsPath.empty()) {
    metrics.open(args.metricsPath, std::ios::app);
    if (!metrics) throw rules::ConfigError(fmt::format("cannot write --metrics-jsonl {}", args.metricsPath));
  }
  if (lead)
    fmt::print(
        "tpscope-train: tp={} dp={}{} layers={} hidden={} heads={} seq_len={} micro_batch={} grad_accum={} "
        "steps={} device={}{} corpus={}\n",
        tp, dp,
        pp > 1 ? fmt::format(" pp={} schedule={} microbatches={}{}", pp, cfg.schedule, cfg.grad_accum,
                             cfg.virtual_stages > 1 ? fmt::format(" virtual_stages={}", cfg.virtual_stages) : "")
               : "",
        cfg.layers, cfg.hidden, cfg.heads, cfg.seq_len, cfg.micro_batch_size, cfg.grad_accum, cfg.steps,
        cfg.device,
        cfg.fp16   ? " fp16"
        : cfg.bf16 ? " bf16"
                   : "",
        cfg.corpusPath());
  const int64_t last = args.stopAfter ? std::min(*args.stopAfter, cfg.steps) : cfg.steps;
  for (int64_t step = first; step <= last; ++step) {
    core::StepMetrics s = trainer.trainStep(step);
    if (reporter) reportStep(step, s, cfg, args, metrics);
    const bool periodic = cfg.save_every > 0 && step % cfg.save_every == 0;
    if (!cfg.checkpoint_dir.empty() && (periodic || step == cfg.steps)) trainer.saveCheckpoint(step);
  }
  stopRecording("ok");
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  // Keep activation-sized blocks (up to 32 MiB) on the heap and do not hand freed memory back to the kernel: every
  // step reallocates the same tensors, and glibc's defaults would mmap/munmap them each time (page faults + zeroing,
  // ~45% of the minor faults on the bench config).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  try {
    return run(argc, argv);
  } catch (const rules::ConfigError& e) {
    std::fprintf(stderr, "tpscope-train: error: %s\n", e.what());
    stopRecordingOnError("config error");
    return kExitConfig;
  } catch (const core::NonFiniteStop& e) {
    std::fprintf(stderr, "tpscope-train: stopped: %s\n", e.what());
    // The hooks flushed the recorder before throwing. No stopRecording() here: the Mesh (whose store the recorder's
    // end-of-run clock alignment uses) is gone; capture records the exit reason. Leave without destructors.
    std::fflush(stderr);
    std::fflush(stdout);
    std::_Exit(kExitNonFinite);
  } catch (const core::CollectiveError& e) {
    std::fprintf(stderr, "tpscope-train: collective error: %s\n", e.what());
    stopRecordingOnError(e.timedOut() ? "timeout" : "collective failed");
    // The group is unusable and peers may be stuck inside Gloo: leave without running destructors that would
    // wait on them. The recorder has flushed in stop().
    std::fflush(stderr);
    std::fflush(stdout);
    std::_Exit(kExitCollective);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "tpscope-train: error: %s\n", e.what_without_backtrace());
    stopRecordingOnError("error");
    return kExitRuntime;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tpscope-train: error: %s\n", e.what());
    stopRecordingOnError("error");
    return kExitRuntime;
  }
}
