// `tpscope replay` (issue #33 §1): real captures of tpscope-train over loopback Gloo with a fault injected for real,
// replayed to the step: the operator that makes the NaN named (forward, backward, on TP=2 and TP=2 × PP=2), a NaN
// that comes from the data found reproducible with its batch, a bit flip found transient, a healthy step found clean
// (no operator of the engine may trip the check), bad input refused.
#include <gtest/gtest.h>

#include <algorithm>

#include "capture_test_util.h"
#include "tpscope/core/data.h"  // the engine's sampler (torch-free, compiled into this test): which batch is padding

namespace tpscope::capture_test {
namespace {

struct Replayed {
  int status = -1;
  nlohmann::json j;  // replay --json
  std::string output;
};

Replayed replay(const fs::path& dir, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {TPSCOPE_BIN, "replay", dir.string(), "--json"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const RunResult r = run(argv, dir.parent_path() / (dir.filename().string() + ".replay.json"));
  Replayed out{r.status, nlohmann::json::parse(r.output, nullptr, false), r.output};
  return out;
}

const nlohmann::json* rankEntry(const nlohmann::json& j, int rank) {
  for (const auto& r : j["ranks"])
    if (r.value("rank", -1) == rank) return &r;
  return nullptr;
}

TEST(Replay, ForwardNanIsReproducibleAndTheOperatorNamed) {
  const auto dir = testDir("replay_fwd");
  const RunResult c =
      capture(dir, 2, 2, 1, 4, {"--inject", "nan:rank=1,step=3,layer=1,phase=fwd", "--on-nonfinite", "warn"});
  ASSERT_EQ(c.status, 0) << c.output;
  const Replayed r = replay(dir);
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_FALSE(r.j.is_discarded()) << r.output;
  EXPECT_EQ(r.j["step"], 3) << r.output;  // the run's origin step, found without --step
  EXPECT_EQ(r.j["verdict"], "reproducible") << r.output;
  EXPECT_EQ(r.j["rank"], 1) << r.output;
  const auto& op = r.j["op"];
  EXPECT_EQ(op["op"], "aten::fill_") << r.output;  // the injection writes the NaN with fill_
  EXPECT_EQ(op["pass"], "forward") << r.output;
  EXPECT_EQ(op["layer"], 1) << r.output;
  EXPECT_EQ(op["microbatch"], 0) << r.output;
  EXPECT_EQ(op["carrier_input"], 1) << r.output;  // fill_'s value: the NaN number
  EXPECT_EQ(op["inputs"][1]["kind"], "scalar") << r.output;
  EXPECT_EQ(op["inputs"][1]["max_abs"], "nan") << r.output;
  // The peer does not make it: it arrives in a TP all-reduce's result.
  const nlohmann::json* peer = rankEntry(r.j, 0);
  ASSERT_NE(peer, nullptr) << r.output;
  EXPECT_EQ((*peer)["op"]["op"], "collective") << r.output;
  EXPECT_NE((*peer)["op"]["collective"].get<std::string>().find("tp-0 all_reduce"), std::string::npos) << r.output;
  // The run kept the state step 3 began from (every rank saw the NaN before the update): the step alone is replayed.
  EXPECT_EQ(r.j["from"], "replay_state") << r.output;
  EXPECT_EQ(r.j["from_step"], 3) << r.output;
  for (const char* f : {"manifest.json", "rank-00000.pt", "rank-00001.pt"})
    EXPECT_TRUE(fs::exists(dir / "replay-state" / "step-000002" / f)) << f;
  EXPECT_TRUE(fs::exists(dir / "replay-step-3" / "run.db"));
  // The verdict is in the run: diagnose shows it, on the run file and on the folder's rank files.
  for (const fs::path& target : {dir / "run.db", dir}) {
    const Diagnosis d = diagnose(target);
    const auto replays = d.ofKind("replay");
    ASSERT_EQ(replays.size(), 1u) << target << "\n" << d.summary();
    EXPECT_EQ(replays[0].step, 3);
    EXPECT_EQ(replays[0].numbers.at("verdict"), "\"reproducible\"");
    EXPECT_EQ(replays[0].numbers.at("op"), "\"aten::fill_\"");
  }
  // ... hung under the NaN's origin in the root-cause chain.
  const RunResult dj = run({TPSCOPE_BIN, "diagnose", "--json", (dir / "run.db").string()}, dir / "chain.json");
  const auto chain = nlohmann::json::parse(dj.output, nullptr, false);
  ASSERT_FALSE(chain.is_discarded()) << dj.output;
  bool underOrigin = false;
  for (const auto& root : chain["chain"])
    if (root.value("kind", "") == "nan_origin")
      for (const auto& c : root["consequences"]) underOrigin |= c.value("kind", "") == "replay";
  EXPECT_TRUE(underOrigin) << dj.output;
}

TEST(Replay, BackwardNanNamesTheBackwardPass) {
  const auto dir = testDir("replay_bwd");
  const RunResult c = capture(dir, 2, 2, 1, 3, {"--inject", "nan:rank=0,step=2,layer=1", "--on-nonfinite", "warn"});
  ASSERT_EQ(c.status, 0) << c.output;
  const Replayed r = replay(dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.j["verdict"], "reproducible") << r.output;
  EXPECT_EQ(r.j["rank"], 0) << r.output;
  const auto& op = r.j["op"];
  EXPECT_EQ(op["pass"], "backward") << r.output;
  // The gradient hook runs between autograd's functions: the one before it is named, and placed by its forward.
  EXPECT_NE(op["backward_function"].get<std::string>(), "") << r.output;
  EXPECT_NE(op["span"].get<std::string>().find("backward of layer"), std::string::npos) << r.output;
}

TEST(Replay, NanFromDataIsReproducibleAndTheBatchNamed) {
  // A corpus with a block of padding (NUL bytes) that the loss does not count (loss_ignore_byte = 0): a micro-batch
  // whose every target is padding has no counted token, and its loss is 0/0 — the data makes the NaN, with no fault
  // injected. Which step that is comes from the sampler alone; the pad block is sized so that it is step 2 to 6.
  const auto dir = testDir("replay_data");
  const fs::path corpus = dir.parent_path() / "replay_data.corpus.txt";
  std::string text;
  while (text.size() < 4000) text += "Tensor parallelism splits each weight matrix over the ranks of a group. ";
  constexpr int64_t kSeq = 32;
  int64_t step = 0;
  for (size_t pad = 600; step == 0 && pad < 4000; pad += 37) {
    std::ofstream(corpus, std::ios::binary) << text << std::string(pad, '\0') << text;
    const auto c = core::Corpus::load(corpus.string());
    const core::BatchSampler sampler(c, kSeq, /*microBatch=*/1, /*seed=*/1234);
    for (int64_t s = 1; s <= 6 && step == 0; ++s) {
      std::vector<int64_t> ids(kSeq), targets(kSeq);
      sampler.fill(s, 0, 1, 0, 1, ids.data(), targets.data());
      if (std::all_of(targets.begin(), targets.end(), [](int64_t t) { return t == 0; })) step = s;
    }
    if (step == 1) step = 0;  // a step before it, to compare the losses of
  }
  ASSERT_GE(step, 2) << "no pad length puts an all-padding batch at steps 2-6";
  const fs::path config = configWith(
      dir, {{"corpus", corpus.string()}, {"micro_batch_size", 1}, {"loss_ignore_byte", 0}, {"seq_len", kSeq}});
  const RunResult c =
      run(withConfig(captureArgv(dir, 2, 2, 1, static_cast<int>(step) + 1, {"--on-nonfinite", "warn"}), config),
          captureLog(dir));
  ASSERT_EQ(c.status, 0) << c.output;
  // Twice: from the state the run kept for the step (the step alone), and without it from step 1 — the steps before
  // it the run's again, bit for bit (the learning-rate schedule the run's: --stop-after keeps its --steps). Both name
  // the same operator and batch.
  for (const bool fromState : {true, false}) {
    if (!fromState) fs::remove_all(dir / "replay-state");
    const Replayed r = replay(dir);
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(r.j["from"], fromState ? "replay_state" : "start") << r.output;
    EXPECT_EQ(r.j["step"], step) << r.output;
    EXPECT_EQ(r.j["verdict"], "reproducible") << r.output;
    if (!fromState) {
      EXPECT_EQ(r.j["losses_before"]["steps"], step - 1) << r.output;
      EXPECT_EQ(r.j["losses_before"]["max_rel_diff"], 0.0) << r.output;
    }
    // The batch: global micro-batch step - 1 (one per step at dp 1), its one sample.
    const std::string g = std::to_string(step - 1);
    EXPECT_NE(r.j["batch"].get<std::string>().find("global micro-batch " + g + ", samples " + g + "-" + g),
              std::string::npos)
        << r.output;
    // Every TP rank makes it itself (the data is theirs alike, nothing arrives from a peer): the loss's division,
    // from finite inputs (0 and 0).
    for (const auto& rank : r.j["ranks"]) {
      ASSERT_TRUE(rank.contains("op")) << r.output;
      EXPECT_EQ(rank["op"]["op"], "aten::div") << r.output;
      EXPECT_TRUE(rank["op"]["produced"].get<bool>()) << r.output;
      EXPECT_EQ(rank["op"]["pass"], "forward") << r.output;
    }
  }
}

TEST(Replay, FlippedBitIsTransient) {
  // Bit 30 of an fp32 weight near 1 sets the exponent's top bit: the weight becomes +Inf and the next step is NaN.
  const auto dir = testDir("replay_flip");
  const RunResult c = capture(dir, 2, 2, 1, 4, {"--inject", "bitflip:rank=1,step=2,bit=30", "--on-nonfinite", "warn"});
  ASSERT_EQ(c.status, 0) << c.output;
  const Replayed r = replay(dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.j["step"], 3) << r.output;
  EXPECT_TRUE(r.j["run_had_nonfinite"].get<bool>()) << r.output;
  EXPECT_EQ(r.j["verdict"], "transient") << r.output;
  EXPECT_EQ(r.j["faults_left_out"], nlohmann::json::array({"bitflip:rank=1,step=2,bit=30"})) << r.output;
  // The state the run kept for step 3 holds the flipped weight (finite, 1.5e36: it makes the NaN again from there).
  // The run's silent-corruption check dated the disagreement to step 2: the replay leaves that state and starts from
  // step 1, where no bit flips.
  EXPECT_TRUE(fs::exists(dir / "replay-state" / "step-000002" / "manifest.json"));
  EXPECT_NE(r.j.value("replay_state_skipped", "").find("step 2"), std::string::npos) << r.output;
  EXPECT_EQ(r.j["from"], "start") << r.output;
  for (const auto& rank : r.j["ranks"]) EXPECT_TRUE(rank["finite"].get<bool>()) << r.output;
  const Diagnosis d = diagnose(dir / "run.db");
  const auto replays = d.ofKind("replay", "warning");
  ASSERT_EQ(replays.size(), 1u) << d.summary();
}

TEST(Replay, AKeptStateThatHoldsTheValueIsReplayedFromBeforeIt) {
  // Two bits of one element of layers.0.ln1.weight flip on rank 1 after step 2's update (exponent all ones: NaN),
  // with the replica check off, so nothing in the run dates the corruption. The state the run kept for step 3 holds
  // the NaN weight: replayed from it, the step's first bad operator reads the value from that parameter, which says
  // the state already held it — the replay starts again from step 1, recomputes the weight, and finds the step clean.
  const auto dir = testDir("replay_state_held");
  const RunResult c = capture(dir, 2, 2, 1, 4,
                              {"--inject", "bitflip:rank=1,step=2,bit=30,tensor=layers.0.ln1.weight", "--inject",
                               "bitflip:rank=1,step=2,bit=23,tensor=layers.0.ln1.weight", "--health", "replica=off"});
  ASSERT_EQ(c.status, 0) << c.output;
  ASSERT_TRUE(fs::exists(dir / "replay-state" / "step-000002" / "rank-00001.pt")) << c.output;
  const Replayed r = replay(dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.j["step"], 3) << r.output;
  EXPECT_EQ(r.j.value("replay_state_held", ""), "layers.0.ln1.weight") << r.output;
  EXPECT_EQ(r.j["from"], "start") << r.output;
  EXPECT_EQ(r.j["verdict"], "transient") << r.output;
}

TEST(Replay, HealthyStepIsClean) {
  // Every operator the engine runs in a step (attention masks with −Inf, isfinite's +Inf constant, uninitialised
  // buffers, Gloo's results) passes the check: no false alarm.
  const auto dir = testDir("replay_healthy");
  const RunResult c = capture(dir, 2, 2, 1, 3, {});
  ASSERT_EQ(c.status, 0) << c.output;
  Replayed r = replay(dir);
  EXPECT_EQ(r.status, 2) << r.output;  // no NaN in the run: the step must be given
  r = replay(dir, {"--step", "2"});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.j["verdict"], "clean") << r.output;
  ASSERT_EQ(r.j["ranks"].size(), 2u) << r.output;
  for (const auto& rank : r.j["ranks"]) {
    EXPECT_TRUE(rank["finite"].get<bool>()) << r.output;
    EXPECT_GT(rank["ops_checked"].get<int64_t>(), 500) << r.output;
  }
}

TEST(Replay, PipelineStageNamesItsOperator) {
  // TP=2 × PP=2: the NaN enters stage 1's first rank (global rank 2) in micro-batch 1's forward pass.
  const auto dir = testDir("replay_pp");
  const RunResult c = capture(dir, 4, 2, 1, 3,
                              {"--pp", "2", "--microbatches", "2", "--inject",
                               "nan:stage=1,step=2,layer=1,phase=fwd,mb=1", "--on-nonfinite", "warn"});
  ASSERT_EQ(c.status, 0) << c.output;
  const Replayed r = replay(dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.j["verdict"], "reproducible") << r.output;
  EXPECT_EQ(r.j["rank"], 2) << r.output;
  EXPECT_EQ(r.j["op"]["op"], "aten::fill_") << r.output;
  EXPECT_EQ(r.j["op"]["microbatch"], 1) << r.output;
  EXPECT_NE(r.j["batch"].get<std::string>().find("micro-batch 1"), std::string::npos) << r.output;
}

TEST(Replay, ADataParallelReplicaIsReplayedAlone) {
  // TP=2 × DP=2, two faults: a NaN enters the gradient of layer 1 on rank 3 (DP replica 1) at step 3, another rank 0's
  // at step 4. From the state the run kept for step 3, the step needs only replica 1's TP group (ranks 2 and 3): run
  // as a job of its own, it draws replica 1's data and seeds and reads ranks 2 and 3's state; the fault on replica 0
  // is left out. Its gradients before reduction must be the run's, bit for bit (the data of replica 0 gives others).
  const auto dir = testDir("replay_dp_replica");
  const RunResult c = capture(
      dir, 4, 2, 2, 4,
      {"--inject", "nan:rank=3,step=3,layer=1", "--inject", "nan:rank=0,step=4,layer=0", "--on-nonfinite", "warn"});
  ASSERT_EQ(c.status, 0) << c.output;
  // The global gradient norm is NaN on every rank at step 3: each kept the state (not only rank 3, that saw it).
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_TRUE(fs::exists(dir / "replay-state" / "step-000002" / ("rank-0000" + std::to_string(rank) + ".pt")))
        << rank;
  for (const bool fromState : {true, false}) {
    const Replayed r =
        replay(dir, fromState ? std::vector<std::string>{} : std::vector<std::string>{"--no-replay-state"});
    ASSERT_EQ(r.status, 0) << r.output;
    ASSERT_FALSE(r.j.is_discarded()) << r.output;
    EXPECT_EQ(r.j["step"], 3) << r.output;
    EXPECT_EQ(r.j["verdict"], "reproducible") << r.output;
    EXPECT_EQ(r.j["rank"], 3) << r.output;
    EXPECT_EQ(r.j["op"]["pass"], "backward") << r.output;
    EXPECT_NE(r.j["batch"].get<std::string>().find("of DP rank 1"), std::string::npos) << r.output;
    EXPECT_EQ(r.j["gradients_at_step"]["max_rel_diff"], 0.0) << r.output;
    EXPECT_GT(r.j["gradients_at_step"]["tensors"].get<int>(), 20) << r.output;
    if (fromState) {
      EXPECT_EQ(r.j["from"], "replay_state") << r.output;
      EXPECT_EQ(r.j["dp_replica"], 1) << r.output;
      EXPECT_EQ(r.j["replayed_ranks"], nlohmann::json::array({2, 3})) << r.output;
      EXPECT_EQ(r.j["faults_reapplied"], nlohmann::json::array({"nan:rank=3,step=3,layer=1"})) << r.output;
      EXPECT_EQ(r.j["faults_left_out"], nlohmann::json::array({"nan:rank=0,step=4,layer=0 (another DP replica)"}))
          << r.output;
      EXPECT_EQ(r.j["gradients_at_step"]["ranks"], 2) << r.output;
      // The ranks are the run's, and so are the groups' names (replica 1's TP group is tp-1).
      ASSERT_EQ(r.j["ranks"].size(), 2u) << r.output;
      const nlohmann::json* peer = rankEntry(r.j, 2);
      ASSERT_NE(peer, nullptr) << r.output;
      EXPECT_NE((*peer)["message"].get<std::string>().find("tp-1 all_reduce"), std::string::npos) << r.output;
    } else {
      // Every rank from step 1: the steps before the run's, bit for bit.
      EXPECT_EQ(r.j["from"], "start") << r.output;
      EXPECT_FALSE(r.j.contains("dp_replica")) << r.output;
      EXPECT_EQ(r.j["replayed_ranks"].size(), 4u) << r.output;
      EXPECT_EQ(r.j["losses_before"]["max_rel_diff"], 0.0) << r.output;
      EXPECT_EQ(r.j["gradients_at_step"]["ranks"], 4) << r.output;
    }
  }
  // Asked for rank 1, which only received the NaN (replica 0's gradients are clean before the DP reduction): its
  // replica alone makes nothing, which must not read as a transient fault. The whole job runs the step again and
  // names rank 3.
  const Replayed asked = replay(dir, {"--rank", "1"});
  ASSERT_EQ(asked.status, 0) << asked.output;
  EXPECT_EQ(asked.j["dp_replica_clean"], 0) << asked.output;
  EXPECT_EQ(asked.j["replayed_ranks"].size(), 4u) << asked.output;
  EXPECT_EQ(asked.j["from"], "replay_state") << asked.output;
  EXPECT_EQ(asked.j["verdict"], "reproducible") << asked.output;
  EXPECT_EQ(asked.j["rank"], 3) << asked.output;
}

TEST(Replay, APipelinedReplicaIsReplayedAloneInTheRunsTerms) {
  // TP=2 × DP=2 × PP=2: the NaN enters stage 1 of DP replica 1 (rank 6). Replica 1's ranks alone (2, 3, 6, 7) replay
  // the step; the stage-0 ranks receive it through the pipeline's point-to-point groups, named as in the run.
  const auto dir = testDir("replay_pp_replica");
  const RunResult c = capture(dir, 8, 2, 2, 3,
                              {"--pp", "2", "--microbatches", "2", "--inject",
                               "nan:rank=6,step=2,layer=1,phase=fwd,mb=1", "--on-nonfinite", "warn"});
  ASSERT_EQ(c.status, 0) << c.output;
  const Replayed r = replay(dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.j["from"], "replay_state") << r.output;
  EXPECT_EQ(r.j["replayed_ranks"], nlohmann::json::array({2, 3, 6, 7})) << r.output;
  EXPECT_EQ(r.j["rank"], 6) << r.output;
  EXPECT_EQ(r.j["op"]["microbatch"], 1) << r.output;
  EXPECT_EQ(r.j["gradients_at_step"]["max_rel_diff"], 0.0) << r.output;
  const nlohmann::json* stage0 = rankEntry(r.j, 2);
  ASSERT_NE(stage0, nullptr) << r.output;
  EXPECT_NE((*stage0)["message"].get<std::string>().find("p2p-6-2 recv"), std::string::npos) << r.output;
}

TEST(Replay, ResumesFromTheNewestCheckpointBeforeTheStep) {
  // Checkpoints at steps 2 and 4 (save_every 2); a NaN at step 4: the replay starts from step 2's checkpoint, runs
  // step 3 (its loss the run's, bit for bit) and step 4, and writes no checkpoint of its own.
  const auto dir = testDir("replay_resume");
  const fs::path ckpt = dir.parent_path() / "replay_resume.ckpt";
  fs::remove_all(ckpt);
  const fs::path config = configWith(dir, {{"checkpoint_dir", ckpt.string()}, {"save_every", 2}});
  const RunResult c = run(
      withConfig(
          captureArgv(dir, 2, 2, 1, 4, {"--inject", "nan:rank=0,step=4,layer=0,phase=fwd", "--on-nonfinite", "warn"}),
          config),
      captureLog(dir));
  ASSERT_EQ(c.status, 0) << c.output;
  ASSERT_TRUE(fs::exists(ckpt / "step-000002" / "manifest.json")) << c.output;
  const auto before = fs::last_write_time(ckpt / "step-000004" / "manifest.json");
  fs::remove_all(dir / "replay-state");  // the state the run kept for step 4 would be used first
  const Replayed r = replay(dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.j["from_step"], 3) << r.output;
  EXPECT_EQ(r.j["verdict"], "reproducible") << r.output;
  EXPECT_EQ(r.j["op"]["layer"], 0) << r.output;
  EXPECT_EQ(r.j["losses_before"]["steps"], 1) << r.output;
  EXPECT_EQ(r.j["losses_before"]["max_rel_diff"], 0.0) << r.output;
  EXPECT_EQ(fs::last_write_time(ckpt / "step-000004" / "manifest.json"), before) << "the replay wrote a checkpoint";
}

TEST(Replay, TraceOpsNamesTheNextOccurrenceLive) {
  // --on-nonfinite trace-ops: warn, and the op check armed after step 3 names, once per rank, the first operator of
  // step 4 whose output is NaN — the embedding lookup, whose weight step 3's NaN update left NaN.
  const auto dir = testDir("replay_trace_ops");
  const RunResult c =
      capture(dir, 2, 2, 1, 6, {"--inject", "nan:rank=1,step=3,layer=1,phase=fwd", "--on-nonfinite", "trace-ops"});
  ASSERT_EQ(c.status, 0) << c.output;
  Db db(dir / "run.db");
  const auto checks = db.rows("SELECT rank, step, param, evidence FROM alerts WHERE kind = 'op_check' ORDER BY rank");
  ASSERT_EQ(checks.size(), 2u) << c.output;  // once per rank, not again at steps 5 and 6
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(checks[rank][0], std::to_string(rank));
    EXPECT_EQ(checks[rank][1], "4");
    EXPECT_EQ(checks[rank][2], "aten::index_select");
    const auto ev = nlohmann::json::parse(checks[rank][3]);
    EXPECT_TRUE(ev.value("live", false)) << checks[rank][3];
    EXPECT_EQ(ev.value("after_step", -1), 3) << checks[rank][3];
    EXPECT_EQ(ev.value("carrier_param", ""), "embedding.weight") << checks[rank][3];
    EXPECT_EQ(ev.value("pass", ""), "forward") << checks[rank][3];
  }
  EXPECT_TRUE(db.rows("SELECT 1 FROM alerts WHERE kind = 'op_check_clean'").empty()) << "live: no clean alerts";
  const Diagnosis d = diagnose(dir / "run.db");
  const auto traced = d.ofKind("replay");
  ASSERT_EQ(traced.size(), 2u) << d.summary();
  EXPECT_EQ(traced[0].numbers.at("verdict"), "\"traced\"");
  EXPECT_EQ(traced[0].numbers.at("after_step"), "3");
}

TEST(Replay, RefusesWhatItCannotReplay) {
  const auto dir = testDir("replay_bad");
  EXPECT_EQ(replay(dir / "missing").status, 2);
  // A trace that no capture wrote (no capture_command): the replay says so.
  std::ofstream(dir / "empty.db") << "";
  EXPECT_EQ(replay(dir / "empty.db").status, 2);
}

}  // namespace
}  // namespace tpscope::capture_test
