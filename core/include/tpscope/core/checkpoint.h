// Sharded checkpoints: one file per rank plus a manifest.
//
//   <root>/step-000010/rank-00003.pt     this rank's parameter shards ("param/<name>"), optimizer state ("optimizer",
//                                         ZeRO-1: only the parameters this rank owns), default-generator state
//                                         ("rng") and meta [step, tp, dp, rank]
//   <root>/step-000010/manifest.json     {"format": "tpscope-checkpoint", "version": 1, "step", "tp", "dp",
//                                         "world", "zero1", "files": [...], "config": {...}} — written by world
//                                         rank 0 after every rank's file is on disk (a barrier)
//   <root>/latest                        "step-000010": written last, so a crash mid-save leaves the older one
#pragma once

#include <cstdint>
#include <string>

namespace tpscope::core {

inline constexpr int kCheckpointVersion = 1;

std::string checkpointStepDir(const std::string& root, int64_t step);
std::string checkpointRankFile(const std::string& stepDir, int rank);
// Resolves `dir` (a root with `latest`, or a step folder) to a step folder; throws ConfigError when neither.
std::string resolveCheckpointDir(const std::string& dir);

}  // namespace tpscope::core
