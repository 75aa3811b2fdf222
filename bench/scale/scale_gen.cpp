// tpscope_scale_gen: a capture folder of N simulated ranks for the scale benchmark (run_scale.py, issue #13).
//
//   tpscope_scale_gen --ranks N --out DIR [--steps 50] [--layers 8] [--extra-spans 0]
//
// Writes DIR/rank-<K>.db for K < N through the analysis tests' TP×DP simulator (tests/analysis/support/test_runs.h,
// writeRankFiles: the files the recorder and the capture launcher leave, each on its own clock), then prints one JSON
// object on stdout saying where the faults are, for the benchmark to check diagnose against.
//
// Layout: TP 8 (groups tp-<i> = ranks 8i … 8i+7, one host "node-<i>" of 8 ranks each), DP N/8 (groups dp-<t>). Per
// rank and step: data loading, per layer forward (attention, all-reduce, MLP, all-reduce) and backward (the same in
// reverse), one DP gradient all-reduce, the optimizer, a step span; grad_stats for two parameters per layer,
// step_stats. With 8 layers that is 33 collectives and 68 spans per rank and step.
//
// Faults, placed by N so that every size has them in different TP groups (N ≥ 32):
//   straggler  rank N/4 + 1: its data loading takes 2 ms longer every step (it arrives late at the first TP
//              all-reduce of each step);
//   NaN origin rank N/2 + 2, step 20, layer layers/2: NaN in its gradients there; its TP peers' lower layers show it
//              after the backward all-reduce, every rank from the next step (the DP all-reduce);
//   hang       rank N − 3 (tp rank 5 of the last TP group) never enters that group's backward all-reduce of layer
//              layers/2 at step 47 (it stalls in data loading); its TP peers stay 'started' in it, every other rank
//              stays 'started' in that step's DP all-reduce; the job is stopped as capture's hang watchdog stops it
//              (exit_reason "stopped by capture (hang watchdog: ...)"). Steps 48 and 49 never run.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "test_runs.h"

namespace {

using tpscope::testing::RunSpec;

constexpr int kTp = 8;
constexpr int kHangStep = 47;
constexpr int kNanStep = 20;

struct Args {
  int ranks = 0;
  std::filesystem::path out;
  int steps = 50;
  int layers = 8;
  int extraSpans = 0;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "tpscope_scale_gen: %s\nusage: tpscope_scale_gen --ranks N --out DIR [--steps 50] [--layers 8] "
               "[--extra-spans 0]\n  N: a multiple of 8, at least 16\n",
               why);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + k).c_str());
    const char* v = argv[++i];
    if (k == "--ranks") a.ranks = std::atoi(v);
    else if (k == "--out") a.out = v;
    else if (k == "--steps") a.steps = std::atoi(v);
    else if (k == "--layers") a.layers = std::atoi(v);
    else if (k == "--extra-spans") a.extraSpans = std::atoi(v);
    else usage(("unknown option " + k).c_str());
  }
  if (a.ranks < 16 || a.ranks % kTp != 0) usage("--ranks must be a multiple of 8, at least 16");
  if (a.out.empty()) usage("--out is required");
  if (a.layers < 2 || a.steps < kHangStep + 1) usage("need --layers ≥ 2 and --steps ≥ 48 (the hang is at step 47)");
  return a;
}

// The TP all-reduce's sequence number in its group: 4 per layer and step, forward layers in order (2 each), then
// backward layers in reverse (MLP, then attention).
int64_t backwardMlpSeq(int layers, int step, int layer) {
  return int64_t{4} * layers * step + 2 * layers + 2 * (layers - 1 - layer) + 1;
}

RunSpec scaleSpec(const Args& a) {
  RunSpec s;
  s.tp = kTp;
  s.dp = a.ranks / kTp;
  s.layers = a.layers;
  s.steps = a.steps;
  s.indexed = false;  // rank files carry no query indexes
  s.extraSpansPerCompute = a.extraSpans;
  s.ranksPerHost = kTp;
  s.hostCpus = 96;
  s.stragglerRank = a.ranks / 4 + 1;
  s.stragglerDelayNs = 2'000'000;
  s.nanRank = a.ranks / 2 + 2;
  s.nanStep = kNanStep;
  s.nanLayer = a.layers / 2;
  s.hangRank = a.ranks - 3;
  s.hangGroup = "tp-" + std::to_string(s.hangRank / kTp);
  s.hangSeq = backwardMlpSeq(a.layers, kHangStep, a.layers / 2);
  s.stopReason = "stopped by capture (hang watchdog: no progress for 60 s)";
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const RunSpec s = scaleSpec(a);
  const auto t0 = std::chrono::steady_clock::now();
  if (auto st = tpscope::testing::writeRankFiles(a.out, s); !st) {
    std::fprintf(stderr, "tpscope_scale_gen: %s\n", st.message().c_str());
    return 1;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "{\"ranks\": %d, \"tp\": %d, \"dp\": %d, \"steps\": %d, \"layers\": %d, \"spans_per_rank_step\": %lld, "
      "\"straggler_rank\": %d, \"nan_rank\": %d, \"nan_step\": %d, \"nan_layer\": %d, "
      "\"hang_rank\": %d, \"hang_group\": \"%s\", \"hang_seq\": %lld, \"hang_step\": %d, \"gen_s\": %.2f}\n",
      a.ranks, s.tp, s.dp, s.steps, s.layers, static_cast<long long>(tpscope::testing::spansPerRankStep(s)),
      s.stragglerRank, s.nanRank, s.nanStep, s.nanLayer, s.hangRank, s.hangGroup.c_str(),
      static_cast<long long>(s.hangSeq), kHangStep, secs);
  return 0;
}
