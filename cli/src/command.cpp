#include "command.h"

#include <algorithm>
#include <charconv>
#include <iostream>
#include <limits>
#include <utility>
#include <vector>

#include "tpscope/tracedb/merge.h"

namespace tpscope::cli {

namespace {
std::vector<std::pair<int, AddCommand>>& registry() {
  static std::vector<std::pair<int, AddCommand>> commands;
  return commands;
}
}  // namespace

bool registerCommand(int order, AddCommand add) {
  registry().emplace_back(order, add);
  return true;
}

void addRegisteredCommands(CLI::App& app, Context& ctx) {
  auto commands = registry();
  std::stable_sort(commands.begin(), commands.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [order, add] : commands) add(app, ctx);
}

std::filesystem::path selfPath() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : p;
}

std::unique_ptr<tracedb::Reader> openRun(const std::filesystem::path& path) {
  auto reader = tracedb::Reader::open(path);
  if (!reader) {
    std::cerr << "tpscope: " << reader.error() << "\n";
    return nullptr;
  }
  return std::move(*reader);
}

std::optional<std::vector<std::filesystem::path>> rankFilesOf(const std::vector<std::filesystem::path>& inputs,
                                                             const std::string& command) {
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& input : inputs) {
    if (!std::filesystem::is_directory(input, ec)) {
      files.push_back(input);
      continue;
    }
    const auto found = tracedb::rankFiles(input);
    if (found.empty()) {
      printError(command, input.string() + ": no rank-*.db files in this folder");
      return std::nullopt;
    }
    files.insert(files.end(), found.begin(), found.end());
  }
  auto rankOf = [](const std::filesystem::path& f) {
    const std::string name = f.filename().string();
    int rank = std::numeric_limits<int>::max();
    if (name.starts_with("rank-")) std::from_chars(name.data() + 5, name.data() + name.size(), rank);
    return rank;
  };
  std::stable_sort(files.begin(), files.end(), [&](const auto& a, const auto& b) { return rankOf(a) < rankOf(b); });
  return files;
}

void printError(const std::string& command, const std::string& message) {
  std::cerr << "tpscope " << command << ": " << message << "\n";
}

}  // namespace tpscope::cli
