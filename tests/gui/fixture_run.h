// Tiny fixture runs for the GUI tests, written with tracedb::Writer.
//
// writeFixtureRun(): 4 ranks in one TP group "tp-0" (plus "dp-0" = {0, 2}), 3 steps of 10 ms, 2 layers, a main
// thread and a CUDA stream per rank. Planted problems:
//   * step 1, rank 2, layer 1 (param "layers.1.mlp.fc2.weight"): 3 NaN in the gradient — the origin; the TP
//     all-reduce that follows spreads it (ranks 0, 1, 3 show NaN in layer 0 at step 1);
//   * step 2: "tp-0" seq kStuckSeq (an all_reduce) was entered by ranks 0, 2, 3 and never completed; rank 1 never
//     entered it (its last span is "data_loading").
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace tpscope::gui::testing {

inline constexpr int kFixtureRanks = 4;
inline constexpr int kFixtureSteps = 3;
inline constexpr int kFixtureLayers = 2;
inline constexpr int64_t kStepNs = 10'000'000;
inline constexpr int kNanRank = 2;
inline constexpr int kNanLayer = 1;
inline constexpr int kNanStep = 1;
inline constexpr int kMissingRank = 1;
inline constexpr const char* kStuckGroup = "tp-0";
extern const int64_t kStuckSeq;

// Writes the fixture run file to `path` (overwrites). Returns "" or an error message.
std::string writeFixtureRun(const std::filesystem::path& path);

// One rank's file of a capture in progress: rank `rank`, one compute span [1000, 1500) named `name`.
std::string writeRankFile(const std::filesystem::path& path, int rank, int64_t epochUnixNs, int64_t clockOffsetNs,
                          const std::string& name);

// A pipeline-parallel run: 2 stages (rank 0, rank 1), 1F1B, 4 micro-batches, 2 steps kPipelineStepNs apart. Pass
// spans "forward mb K" (2 ms on both stages) and "backward mb K" (4 ms on stage 0, 5 ms on stage 1: the longest
// stage), at the times kPipelinePasses lists (ns from the step's start).
inline constexpr int64_t kPipelineStepNs = 50'000'000;
struct PipelinePass {
  int stage;
  bool backward;
  int microbatch;
  int64_t beginNs, durNs;
};
extern const std::vector<PipelinePass> kPipelinePasses;
std::string writePipelineRun(const std::filesystem::path& path);

// A run of nested spans for the windows of a run too big to read whole (issue #17): ranks 0 and 1, each with a main
// thread of steps ⊃ layers ⊃ ops ⊃ tiny spans (random durations and gaps from `seed`) and a sparse stream of short
// kernels (thread 7), and one span on rank 1's thread 9 that lasts the whole run; about 20 k spans, the lane summary
// written as merge writes it. Returns "" or an error message.
std::string writeNestedRun(const std::filesystem::path& path, unsigned seed);

// A scratch folder under the build tree, emptied at creation.
std::filesystem::path scratchDir(const std::string& name);

}  // namespace tpscope::gui::testing
