// Multi-process core tests: every rank is a real process (tpscope-train or tpscope_core_test_worker) talking Gloo
// over loopback. Paths come from the build: TPSCOPE_TRAIN_EXE, TPSCOPE_WORKER_EXE, TPSCOPE_SAMPLES_DIR.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "spawn.h"

namespace fs = std::filesystem;
using tpscope::testing::describe;
using tpscope::testing::runRanks;
using tpscope::testing::scratchDir;

namespace {

const std::string kTrain = TPSCOPE_TRAIN_EXE;
const std::string kWorker = TPSCOPE_WORKER_EXE;
const std::string kTiny = std::string(TPSCOPE_SAMPLES_DIR) + "/configs/tiny.json";
constexpr auto kDeadline = std::chrono::seconds(90);

struct Metrics {
  std::vector<double> loss, gradNorm, lossScale;
  std::vector<bool> skipped;
};

Metrics readMetrics(const fs::path& p) {
  Metrics m;
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    // JSON has no NaN/Inf: nlohmann writes them as null.
    auto number = [](const nlohmann::json& v) { return v.is_number() ? v.get<double>() : std::nan(""); };
    m.loss.push_back(number(j.at("loss")));
    m.gradNorm.push_back(number(j.at("grad_norm")));
    m.lossScale.push_back(j.value("loss_scale", 1.0));
    m.skipped.push_back(j.value("skipped", false));
  }
  return m;
}

// Runs tpscope-train on world = tp * dp * pp ranks; returns the metrics of the rank that reports (rank 0, or the
// last pipeline stage's first rank).
Metrics train(const std::string& name, int tp, int dp, std::vector<std::string> extra, int pp = 1) {
  const fs::path dir = scratchDir(name);
  const fs::path metrics = dir / "metrics.jsonl";
  std::vector<std::string> args{"--config", kTiny, "--tp", std::to_string(tp), "--dp", std::to_string(dp),
                                "--metrics-jsonl", metrics.string(), "--log-every", "0"};
  if (pp > 1) args.insert(args.end(), {"--pp", std::to_string(pp)});
  args.insert(args.end(), extra.begin(), extra.end());
  auto rs = runRanks(kTrain, args, tp * dp * pp, dir, kDeadline);
  for (const auto& r : rs) EXPECT_EQ(r.exitCode, 0) << describe(rs);
  return readMetrics(metrics);
}

void expectSameSeries(const std::vector<double>& got, const std::vector<double>& want, double tol,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_LE(std::abs(got[i] - want[i]) / std::max(std::abs(want[i]), 1e-12), tol)
        << what << " step " << i + 1 << ": " << got[i] << " vs " << want[i];
}

void expectWorkerPasses(const std::string& scenario, int world, std::vector<std::string> extra = {}) {
  const fs::path dir = scratchDir(scenario + "-" + std::to_string(world));
  std::vector<std::string> args{scenario};
  args.insert(args.end(), extra.begin(), extra.end());
  auto rs = runRanks(kWorker, args, world, dir, kDeadline);
  for (const auto& r : rs) {
    EXPECT_EQ(r.exitCode, 0) << describe(rs);  // the worker's gtest run: 0 = every check passed
  }
}

}  // namespace

TEST(TpLayers, EveryLayerAtTp2MatchesTp1) { expectWorkerPasses("layers", 2); }
TEST(TpLayers, EveryLayerAtTp4MatchesTp1) { expectWorkerPasses("layers", 4); }

TEST(VocabParallelCrossEntropy, KnownAnswerTp1) { expectWorkerPasses("ce_known", 1); }
TEST(VocabParallelCrossEntropy, KnownAnswerTp2) { expectWorkerPasses("ce_known", 2); }
TEST(VocabParallelCrossEntropy, KnownAnswerTp4) { expectWorkerPasses("ce_known", 4); }

// The whole GPT, 20 steps on the tiny config: TP=1 (grad_accum 2) ≡ TP=2 ≡ TP=4 ≡ TP=2 x DP=2 (grad_accum 1,
// same samples); losses and the pre-clip global gradient norm (clipping is active: clip 1.0) within 1e-4.
TEST(Gpt, SameLossesAndClipNormAcrossTpAndDp) {
  const Metrics ref = train("gpt-tp1", 1, 1, {"--grad-accum", "2"});
  ASSERT_EQ(ref.loss.size(), 20u);
  const Metrics tp2 = train("gpt-tp2", 2, 1, {"--grad-accum", "2"});
  const Metrics tp4 = train("gpt-tp4", 4, 1, {"--grad-accum", "2"});
  const Metrics tp2dp2 = train("gpt-tp2dp2", 2, 2, {"--grad-accum", "1"});
  expectSameSeries(tp2.loss, ref.loss, 1e-4, "TP=2 loss");
  expectSameSeries(tp4.loss, ref.loss, 1e-4, "TP=4 loss");
  expectSameSeries(tp2dp2.loss, ref.loss, 1e-4, "TP=2 x DP=2 loss");
  expectSameSeries(tp2.gradNorm, ref.gradNorm, 1e-4, "TP=2 clip norm");
  expectSameSeries(tp4.gradNorm, ref.gradNorm, 1e-4, "TP=4 clip norm");
  expectSameSeries(tp2dp2.gradNorm, ref.gradNorm, 1e-4, "TP=2 x DP=2 clip norm");
  bool clipped = false;
  for (double g : ref.gradNorm) clipped |= g > 1.0;
  EXPECT_TRUE(clipped) << "the test should exercise clipping (clip = 1.0)";
}

// Recording reads each gradient once for its health, and the clip takes its sum of squares from that read
// (GradHealthStats::sumSquares, the pass gradSumSquares takes without recording): a recorded run trains what an
// unrecorded one does, bit for bit — losses and clip norms, at TP = 1 and 2 (clipping active: clip 1.0).
TEST(Gpt, RecordingChangesNoBitOfTraining) {
  for (const int tp : {1, 2}) {
    const std::string name = "recording-tp" + std::to_string(tp);
    const Metrics plain = train(name + "-plain", tp, 1, {"--steps", "6"});
    const fs::path out = scratchDir(name + "-out");
    setenv("TPSCOPE_OUT", out.c_str(), 1);
    const Metrics recorded = train(name + "-recorded", tp, 1, {"--steps", "6"});
    unsetenv("TPSCOPE_OUT");
    EXPECT_TRUE(fs::exists(out / "rank-0.db")) << "the recorded run wrote no rank file";
    ASSERT_EQ(recorded.loss.size(), 6u);
    ASSERT_EQ(plain.loss.size(), 6u);
    bool clipped = false;
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(recorded.loss[i], plain.loss[i]) << "TP=" << tp << " step " << i + 1;
      EXPECT_EQ(recorded.gradNorm[i], plain.gradNorm[i]) << "TP=" << tp << " step " << i + 1;
      clipped |= plain.gradNorm[i] > 1.0;
    }
    EXPECT_TRUE(clipped) << "the test should exercise clipping (clip = 1.0)";
  }
}

// Pipeline parallelism: 4 layers, 4 micro-batches (the same global batch at every PP size; at PP = 1 gradient
// accumulation), 20 steps. Every schedule at PP = 2 and 4, PP = 2 x TP = 2 and PP = 2 x DP = 2 reproduce TP = 1's
// losses and pre-clip global norms (clipping active) within 1e-4: stages split the layers, activations and their
// gradients travel point to point, the tied embedding's copies sum their gradients, the norm sums over stages.
TEST(Pipeline, EveryScheduleAtPp2And4MatchesTp1) {
  const std::vector<std::string> model{"--layers", "4", "--microbatches", "4"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> a = model;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  const Metrics ref = train("pp-ref", 1, 1, model);
  ASSERT_EQ(ref.loss.size(), 20u);
  bool clipped = false;
  for (double g : ref.gradNorm) clipped |= g > 1.0;
  EXPECT_TRUE(clipped) << "the test should exercise clipping (clip = 1.0)";
  struct Case {
    const char* name;
    int pp;
    std::vector<std::string> flags;
  };
  const std::vector<Case> cases{
      {"pp2-gpipe", 2, {"--schedule", "gpipe"}},
      {"pp2-1f1b", 2, {"--schedule", "1f1b"}},
      {"pp2-interleaved", 2, {"--schedule", "interleaved", "--virtual-stages", "2"}},
      {"pp4-gpipe", 4, {"--schedule", "gpipe"}},
      {"pp4-1f1b", 4, {"--schedule", "1f1b"}},
  };
  for (const auto& c : cases) {
    const Metrics got = train(c.name, 1, 1, with(c.flags), c.pp);
    expectSameSeries(got.loss, ref.loss, 1e-4, std::string(c.name) + " loss");
    expectSameSeries(got.gradNorm, ref.gradNorm, 1e-4, std::string(c.name) + " clip norm");
  }
}

// Interleaved 1F1B at PP = 4 with two virtual stages per rank: 8 layers, one per model chunk, so every rank runs two
// chunks and each micro-batch crosses the ring twice (at one virtual stage it would be plain 1F1B).
TEST(Pipeline, InterleavedAtPp4WithTwoVirtualStagesMatchesTp1) {
  const std::vector<std::string> model{"--layers", "8", "--microbatches", "4", "--steps", "8"};
  const Metrics ref = train("pp8-ref", 1, 1, model);
  ASSERT_EQ(ref.loss.size(), 8u);
  std::vector<std::string> args = model;
  args.insert(args.end(), {"--schedule", "interleaved", "--virtual-stages", "2"});
  const Metrics got = train("pp4-interleaved-v2", 1, 1, args, 4);
  expectSameSeries(got.loss, ref.loss, 1e-4, "pp4 interleaved v2 loss");
  expectSameSeries(got.gradNorm, ref.gradNorm, 1e-4, "pp4 interleaved v2 clip norm");
}

TEST(Pipeline, Pp2TimesTp2AndPp2TimesDp2MatchTp1) {
  const Metrics ref = train("pptp-ref", 1, 1, {"--layers", "4", "--microbatches", "4"});
  const Metrics pptp = train("pp2tp2", 2, 1, {"--layers", "4", "--microbatches", "4"}, 2);
  expectSameSeries(pptp.loss, ref.loss, 1e-4, "PP=2 x TP=2 loss");
  expectSameSeries(pptp.gradNorm, ref.gradNorm, 1e-4, "PP=2 x TP=2 clip norm");
  // DP = 2 halves the micro-batches per replica: the same global batch.
  const Metrics ppdp = train("pp2dp2", 1, 2, {"--layers", "4", "--microbatches", "2", "--zero1"}, 2);
  expectSameSeries(ppdp.loss, ref.loss, 1e-4, "PP=2 x DP=2 (ZeRO-1) loss");
  expectSameSeries(ppdp.gradNorm, ref.gradNorm, 1e-4, "PP=2 x DP=2 (ZeRO-1) clip norm");
}

// Sequence parallelism, ZeRO-1, activation checkpointing and non-overlapped DP reduction change how, not what.
TEST(Gpt, SequenceParallelZero1CheckpointingMatchTp1) {
  const Metrics ref = train("gptx-tp1", 1, 1, {"--grad-accum", "2", "--steps", "10"});
  const Metrics x = train("gptx-sp", 2, 2,
                          {"--steps", "10", "--sequence-parallel", "--zero1", "--activation-checkpointing"});
  expectSameSeries(x.loss, ref.loss, 1e-4, "TP=2 x DP=2 SP+ZeRO-1+ckpt loss");
  const Metrics y = train("gptx-noovl", 1, 2, {"--steps", "10", "--overlap-grad-reduce", "false"});
  expectSameSeries(y.loss, ref.loss, 1e-4, "DP=2 without overlap loss");
}

// Activation checkpointing recomputes each layer in backward with the forward's RNG state (the generator of the
// layer's device) and autocast state put back: with dropout on, the recomputed masks are the forward's, so the
// gradients and every later loss are those of the run without checkpointing. A replay that drew fresh masks would
// part the series from step 2 on.
TEST(Gpt, CheckpointingReplaysDropoutMasks) {
  const std::vector<std::string> model{"--steps", "6", "--dropout", "0.2"};
  const Metrics ref = train("ckpt-dropout-ref", 2, 1, model);
  std::vector<std::string> args = model;
  args.push_back("--activation-checkpointing");
  const Metrics ckpt = train("ckpt-dropout", 2, 1, args);
  ASSERT_EQ(ref.loss.size(), 6u);
  expectSameSeries(ckpt.loss, ref.loss, 1e-6, "TP=2 dropout 0.2, checkpointing vs none, loss");
  expectSameSeries(ckpt.gradNorm, ref.gradNorm, 1e-6, "TP=2 dropout 0.2, checkpointing vs none, clip norm");
}

// bf16 autocast runs at TP=2 (fp32 on the wire for Gloo) and stays close to fp32.
TEST(Gpt, Bf16AutocastTrainsAtTp2) {
  const Metrics ref = train("bf16-ref", 1, 1, {"--steps", "10"});
  const Metrics b = train("bf16-tp2", 2, 1, {"--steps", "10", "--bf16"});
  expectSameSeries(b.loss, ref.loss, 2e-2, "bf16 TP=2 loss vs fp32");
}

// Dynamic loss scaling (what fp16 training needs; here in fp32 on the CPU, where it must change nothing): the loss
// is scaled by a power of two before backward and the gradients unscaled before clipping, so TP=2 with scaling
// reproduces TP=1 without it; the scale doubles after every `loss_scale_window` clean steps.
TEST(Gpt, DynamicLossScalingChangesNothingWhileNoStepOverflows) {
  const Metrics ref = train("scale-ref", 1, 1, {"--steps", "8"});
  const Metrics s = train("scale-tp2", 2, 1, {"--steps", "8", "--loss-scale", "1024", "--loss-scale-window", "3"});
  expectSameSeries(s.loss, ref.loss, 1e-5, "TP=2 loss-scaled loss vs TP=1 unscaled");
  expectSameSeries(s.gradNorm, ref.gradNorm, 1e-5, "TP=2 loss-scaled clip norm vs TP=1 unscaled");
  EXPECT_EQ(s.lossScale, (std::vector<double>{1024, 1024, 1024, 2048, 2048, 2048, 4096, 4096}));
  for (bool k : s.skipped) EXPECT_FALSE(k);
}

// An overflow on one rank (an Inf in rank 1's gradient at step 3 — what an fp16 overflow looks like): every rank
// skips that update, the scale halves, and training goes on finite from the same weights.
TEST(Gpt, LossScaleOverflowSkipsTheStepOnEveryRankAndHalvesTheScale) {
  const Metrics s = train("scale-ovf", 2, 2, {"--steps", "6", "--loss-scale", "1024", "--inject", "inf:rank=1,step=3"});
  ASSERT_EQ(s.loss.size(), 6u);
  EXPECT_EQ(s.skipped, (std::vector<bool>{false, false, true, false, false, false}));
  EXPECT_EQ(s.lossScale, (std::vector<double>{1024, 1024, 1024, 512, 512, 512}));
  EXPECT_FALSE(std::isfinite(s.gradNorm[2]));
  for (int i = 3; i < 6; ++i) EXPECT_TRUE(std::isfinite(s.loss[i]) && std::isfinite(s.gradNorm[i])) << "step " << i + 1;
  // The skipped step left the weights alone: step 4 sees the weights step 3 saw.
  const Metrics ref = train("scale-ovf-ref", 2, 2, {"--steps", "6", "--loss-scale", "1024"});
  EXPECT_NEAR(s.loss[3], ref.loss[2], 0.05 * ref.loss[2]) << "step 4 after the skip vs step 3 of a clean run";
}

TEST(Gpt, LossFallsOnTheSampleCorpus) {
  const Metrics m = train("falls", 2, 1, {"--steps", "60", "--lr", "0.01", "--warmup", "5"});
  ASSERT_EQ(m.loss.size(), 60u);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    first += m.loss[i] / 5;
    last += m.loss[55 + i] / 5;
  }
  EXPECT_LT(last, first - 1.0) << "mean loss of the first 5 steps " << first << ", of the last 5 " << last;
  EXPECT_LT(last, 3.4) << "a byte-level model on English prose should get well below ln(256) = 5.55";
}

// Run 12 steps saving every 6; resume from step 6 and run to 12: steps 7..12 reproduce (TP=2 x DP=2, ZeRO-1).
TEST(Checkpoint, ResumeReproducesLosses) {
  const fs::path dir = scratchDir("ckpt-root");
  const std::string root = (dir / "ckpt").string();
  const Metrics full = train("ckpt-full", 2, 2, {"--steps", "12", "--checkpoint-dir", root, "--save-every", "6",
                                                 "--zero1"});
  ASSERT_EQ(full.loss.size(), 12u);
  ASSERT_TRUE(fs::exists(fs::path(root) / "step-000006" / "manifest.json"));
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(fs::exists(fs::path(root) / "step-000006" / ("rank-0000" + std::to_string(r) + ".pt")));
  const Metrics resumed = train("ckpt-resume", 2, 2,
                                {"--steps", "12", "--resume", (fs::path(root) / "step-000006").string(), "--zero1"});
  ASSERT_EQ(resumed.loss.size(), 6u);
  expectSameSeries(resumed.loss, std::vector<double>(full.loss.begin() + 6, full.loss.end()), 1e-6,
                   "resumed loss");
  // A layout mismatch is refused with a clear error.
  const fs::path d2 = scratchDir("ckpt-mismatch");
  auto rs = runRanks(kTrain, {"--config", kTiny, "--tp", "2", "--steps", "12", "--resume", root}, 2, d2, kDeadline);
  EXPECT_EQ(rs[0].exitCode, 2) << describe(rs);
  EXPECT_NE(rs[0].output.find("tp=2 dp=2"), std::string::npos) << describe(rs);
}

TEST(Communicator, RecordsEveryCollectiveThroughTheProbes) {
  const fs::path dir = scratchDir("recording");
  auto rs = runRanks(kWorker, {"recording", kTiny}, 2, dir, kDeadline);
  for (const auto& r : rs) {
    EXPECT_EQ(r.exitCode, 0) << describe(rs);  // the worker's gtest run: 0 = every check passed
  }
  auto sig = [](const std::string& out) {
    auto p = out.find("SIGNATURE ");
    return p == std::string::npos ? std::string("none") : out.substr(p, out.find('\n', p) - p);
  };
  EXPECT_EQ(sig(rs[0].output), sig(rs[1].output)) << "ranks recorded different collective sequences";
}

TEST(Communicator, TimeoutNamesGroupSeqAndOp) { expectWorkerPasses("timeout", 2); }

// End to end through tpscope-train: rank 1 stalls before a collective of step 2 (capture's hang injection); rank 0's
// collective times out, it exits 3 with group, seq and op in the message; rank 1 gives up later, also with 3.
TEST(TrainCli, CollectiveTimeoutExitsWith3AndNamesTheCollective) {
  const fs::path dir = scratchDir("train-timeout");
  auto rs = runRanks(kTrain, {"--config", kTiny, "--tp", "2", "--steps", "3", "--timeout-s", "3", "--inject",
                              "hang:rank=1,step=2"},
                     2, dir, kDeadline);
  EXPECT_EQ(rs[0].exitCode, 3) << describe(rs);
  EXPECT_EQ(rs[1].exitCode, 3) << describe(rs);
  EXPECT_NE(rs[0].output.find("on group tp-0"), std::string::npos) << describe(rs);
  EXPECT_NE(rs[0].output.find("timed out"), std::string::npos) << describe(rs);
  EXPECT_NE(rs[0].output.find(" seq "), std::string::npos) << describe(rs);
}

TEST(GradHealth, KnownNormsMaxNanAndInfCounts) { expectWorkerPasses("grad_health", 1); }

TEST(Platform, MatmulRunsOnAnOptimisedBlas) { expectWorkerPasses("blas", 1); }

TEST(TrainCli, BadConfigsFailWithClearErrors) {
  const fs::path dir = scratchDir("badcfg");
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases{
      {{"--config", kTiny, "--tp", "3"}, "heads = 4 is not divisible by tp = 3"},
      {{"--config", kTiny, "--heads", "6"}, "hidden = 32 is not divisible by heads = 6"},
      {{"--config", kTiny, "--tp", "2", "--vocab-size", "257"}, "vocab_size = 257 is not divisible by tp = 2"},
      {{"--config", kTiny, "--corpus", "/nonexistent/corpus"}, "corpus not found: /nonexistent/corpus"},
      {{"--config", kTiny, "--set", "layerz=3"}, "unknown key \"layerz\""},
      {{"--config", (dir / "missing.json").string()}, "cannot open config file"},
      {{"--config", kTiny, "--tp", "2"}, "WORLD_SIZE=1 but tp=2 x dp=1 = 2"},
      {{"--config", kTiny, "--fp16"}, "fp16 needs device = \"cuda\""},
      {{"--config", kTiny, "--device", "gpu"}, "device = \"gpu\" must be \"cpu\" or \"cuda\""},
      {{"--config", kTiny, "--loss-scale", "-4"}, "loss_scale = -4 must be 0 (off) or a positive initial scale"},
  };
  for (const auto& c : cases) {
    // Single process without torchrun's environment (runRanks sets it, so spawn directly with world 1 and unset).
    auto rs = runRanks(kTrain, c.args, 1, dir, kDeadline);
    std::string joined;
    for (auto& a : c.args) joined += a + " ";
    EXPECT_EQ(rs[0].exitCode, 2) << joined << "\n" << rs[0].output;
    EXPECT_NE(rs[0].output.find(c.message), std::string::npos) << joined << "\nwanted: " << c.message << "\n"
                                                               << rs[0].output;
  }
}
