#include "command.h"

#include <algorithm>
#include <iostream>
#include <utility>
#include <vector>

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

std::unique_ptr<tracedb::Reader> openRun(const std::filesystem::path& path) {
  auto reader = tracedb::Reader::open(path);
  if (!reader) {
    std::cerr << "tpscope: " << reader.error() << "\n";
    return nullptr;
  }
  return std::move(*reader);
}

void printError(const std::string& command, const std::string& message) {
  std::cerr << "tpscope " << command << ": " << message << "\n";
}

}  // namespace tpscope::cli
