#include "tpscope/core/checkpoint.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "tpscope/rules/config.h"

namespace tpscope::core {

namespace fs = std::filesystem;

std::string checkpointStepDir(const std::string& root, int64_t step) {
  return (fs::path(root) / fmt::format("step-{:06d}", step)).string();
}

std::string checkpointRankFile(const std::string& stepDir, int rank) {
  return (fs::path(stepDir) / fmt::format("rank-{:05d}.pt", rank)).string();
}

std::string resolveCheckpointDir(const std::string& dir) {
  const fs::path p(dir);
  if (fs::exists(p / "manifest.json")) return p.string();
  std::ifstream latest(p / "latest");
  std::string name;
  if (latest && std::getline(latest, name) && !name.empty() && fs::exists(p / name / "manifest.json"))
    return (p / name).string();
  throw rules::ConfigError(fmt::format("no checkpoint at {}: expected a step folder with manifest.json or a root with "
                                "a 'latest' file",
                                dir));
}

}  // namespace tpscope::core
