// tpscope-train: runs ONE rank of a tensor-parallel GPT training job (launch WORLD_SIZE of them, torchrun-style).
// Exit codes: 0 done; 1 runtime error; 2 bad usage or config (including a missing corpus); 3 collective timeout
// or failure (the group is unusable, the rank stops).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tpscope/core/checkpoint.h"
#include "tpscope/core/config.h"
#include "tpscope/core/mesh.h"
#include "tpscope/core/trainer.h"

#if TPSCOPE_TRAIN_WITH_RUNTIME
#include "tpscope/probes/runtime.h"
#endif

namespace core = tpscope::core;

namespace {

constexpr int kExitOk = 0, kExitRuntime = 1, kExitConfig = 2, kExitCollective = 3;

int run(int argc, char** argv) {
  CLI::App app{"tpscope-train: one rank of a tensor-parallel GPT training run (see docs/config.md)"};
  std::string configPath, metricsPath, resume;
  int tp = 1, dp = 1;
  std::optional<int64_t> steps;
  std::vector<std::string> sets;
  std::map<std::string, std::string> shortcuts;
  app.add_option("--config", configPath, "JSON config file (samples/configs/tiny.json, ...)")->required();
  app.add_option("--tp", tp, "tensor-parallel size")->check(CLI::PositiveNumber);
  app.add_option("--dp", dp, "data-parallel size")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "number of optimizer steps");
  app.add_option("--metrics-jsonl", metricsPath, "write one JSON object per step (rank 0)");
  app.add_option("--resume", resume, "checkpoint root (uses 'latest') or step folder to resume from");
  app.add_option("--set", sets, "override any config key: --set key=value (value is JSON)");
  // Shorthands for the common keys: --<key with dashes> VALUE.
  for (const char* key : {"lr", "seed", "micro_batch_size", "grad_accum", "warmup", "clip", "dropout",
                          "label_smoothing", "threads", "timeout_s", "corpus", "checkpoint_dir", "save_every",
                          "bucket_mb", "log_every", "layers", "hidden", "heads", "ffn_hidden", "seq_len",
                          "vocab_size"}) {
    std::string flag = std::string("--") + key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    app.add_option_function<std::string>(flag, [&shortcuts, key](const std::string& v) { shortcuts[key] = v; },
                                          std::string("config key ") + key);
  }
  for (const char* key : {"sequence_parallel", "activation_checkpointing", "zero1", "bf16", "overlap_grad_reduce"}) {
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

  core::TrainConfig cfg = core::TrainConfig::fromFile(configPath);
  for (auto& [k, v] : shortcuts) cfg.set(k, v.empty() ? "true" : v);
  for (const auto& s : sets) {
    const auto eq = s.find('=');
    if (eq == std::string::npos) throw core::ConfigError(fmt::format("--set {}: expected key=value", s));
    cfg.set(s.substr(0, eq), s.substr(eq + 1));
  }
  if (steps) cfg.set("steps", std::to_string(*steps));
  cfg.validate(tp, dp);

  at::set_num_threads(static_cast<int>(cfg.threads));
  at::set_num_interop_threads(1);

  core::MeshOptions mo;
  mo.tp = tp;
  mo.dp = dp;
  mo.timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.timeout_s * 1000));
  std::unique_ptr<core::Mesh> mesh;
  try {
    mesh = core::Mesh::fromEnvironment(mo);
  } catch (const std::invalid_argument& e) {
    throw core::ConfigError(e.what());
  }
#if TPSCOPE_TRAIN_WITH_RUNTIME
  tpscope::probes::startFromEnvironment(mesh->rank(), mesh->worldSize(), mesh->tpRank(), mesh->dpRank());
#endif
  const bool lead = mesh->rank() == 0;
  core::Trainer trainer(cfg, *mesh);
  int64_t first = 1;
  if (!resume.empty()) {
    first = trainer.loadCheckpoint(resume) + 1;
    if (lead) fmt::print("resumed from {} at step {}\n", resume, first - 1);
  }
  std::ofstream metrics;
  if (lead && !metricsPath.empty()) {
    metrics.open(metricsPath, std::ios::app);
    if (!metrics) throw core::ConfigError(fmt::format("cannot write --metrics-jsonl {}", metricsPath));
  }
  if (lead)
    fmt::print("tpscope-train: tp={} dp={} layers={} hidden={} heads={} seq_len={} micro_batch={} grad_accum={} "
               "steps={} corpus={}\n",
               tp, dp, cfg.layers, cfg.hidden, cfg.heads, cfg.seq_len, cfg.micro_batch_size, cfg.grad_accum,
               cfg.steps, cfg.corpusPath());
  for (int64_t step = first; step <= cfg.steps; ++step) {
    core::StepMetrics s = trainer.trainStep(step);
    if (lead) {
      if (cfg.log_every > 0 && (step % cfg.log_every == 0 || step == cfg.steps))
        fmt::print("step {}/{} loss {:.6f} lr {:.3e} grad_norm {:.4f} tokens/s {:.0f} step_time {:.4f}s\n", step,
                   cfg.steps, s.loss, s.lr, s.gradNorm, s.tokensPerS, s.stepTimeS);
      if (metrics.is_open()) {
        nlohmann::json j{{"step", step},          {"loss", s.loss},        {"lr", s.lr},
                         {"grad_norm", s.gradNorm}, {"tokens_per_s", s.tokensPerS},
                         {"step_time_s", s.stepTimeS}, {"tokens", s.tokens}, {"tp", tp}, {"dp", dp}};
        metrics << j.dump() << "\n" << std::flush;
      }
      std::fflush(stdout);
    }
    const bool periodic = cfg.save_every > 0 && step % cfg.save_every == 0;
    if (!cfg.checkpoint_dir.empty() && (periodic || step == cfg.steps)) trainer.saveCheckpoint(step);
  }
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const core::ConfigError& e) {
    std::fprintf(stderr, "tpscope-train: error: %s\n", e.what());
    return kExitConfig;
  } catch (const core::CollectiveError& e) {
    std::fprintf(stderr, "tpscope-train: collective error: %s\n", e.what());
    return kExitCollective;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "tpscope-train: error: %s\n", e.what_without_backtrace());
    return kExitRuntime;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tpscope-train: error: %s\n", e.what());
    return kExitRuntime;
  }
}
