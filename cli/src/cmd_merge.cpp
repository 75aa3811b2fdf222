// tpscope merge DIR|FILE... -o RUN: per-rank files → one run file (tracedb::merge). Folders (a capture folder each,
// e.g. one per node of a multi-node job) give their rank-*.db files; files are taken as they are.
#include <algorithm>
#include <charconv>
#include <iostream>
#include <limits>

#include "command.h"
#include "tpscope/analysis/summary.h"
#include "tpscope/tracedb/merge.h"

namespace tpscope::cli {
namespace {

struct MergeArgs {
  std::vector<std::filesystem::path> inputs;
  std::filesystem::path output;
};

void addMerge(CLI::App& app, Context& ctx) {
  auto args = std::make_shared<MergeArgs>();
  auto* cmd = app.add_subcommand("merge", "Merge per-rank trace files (capture folders, e.g. one per node, or files) "
                                          "into one run file");
  cmd->add_option("inputs", args->inputs, "Capture folders (their rank-*.db files) and/or rank files")->required();
  cmd->add_option("-o,--output", args->output, "The run file to write (replaced only on success)")->required();
  cmd->callback([args, &ctx]() {
    std::vector<std::filesystem::path> files;
    std::error_code ec;
    for (const auto& input : args->inputs) {
      if (!std::filesystem::is_directory(input, ec)) {
        files.push_back(input);
        continue;
      }
      const auto found = tracedb::rankFiles(input);
      if (found.empty()) {
        printError("merge", input.string() + ": no rank-*.db files in this folder");
        ctx.exitCode = kExitBadInput;
        return;
      }
      files.insert(files.end(), found.begin(), found.end());
    }
    // Folders in any order (node 1's before node 0's): the run file is written in rank order all the same.
    auto rankOf = [](const std::filesystem::path& f) {
      const std::string name = f.filename().string();
      int rank = std::numeric_limits<int>::max();
      if (name.starts_with("rank-")) std::from_chars(name.data() + 5, name.data() + name.size(), rank);
      return rank;
    };
    std::stable_sort(files.begin(), files.end(), [&](const auto& a, const auto& b) { return rankOf(a) < rankOf(b); });
    auto stats = tracedb::merge(files, args->output);
    if (!stats) {
      printError("merge", stats.error());
      ctx.exitCode = kExitBadInput;
      return;
    }
    std::cout << "merged " << stats->ranks << " rank" << (stats->ranks == 1 ? "" : "s") << " (" << stats->spans
              << " spans, " << stats->collectives << " collective records) into " << args->output.string() << "\n";
    // The per-step summaries the analyses and the viewer read first; without them the file is complete, only slower.
    if (tracedb::Status s = analysis::writeRunSummary(args->output); !s)
      std::cerr << "tpscope merge: warning: summaries not written (the analyses will compute them): " << s.message()
                << "\n";
  });
}

TPS_REGISTER_COMMAND(10, addMerge);

}  // namespace
}  // namespace tpscope::cli
