// tpscope merge DIR|FILE... -o RUN: per-rank files → one run file (tracedb::merge). Folders (a capture folder each,
// e.g. one per node of a multi-node job) give their rank-*.db files, and their stall journals (the live stall lines
// capture or `tpscope watch` wrote: analysis/stall_journal.h) go into the run's alerts; files are taken as they are.
#include <iostream>

#include "command.h"
#include "tpscope/analysis/stall_journal.h"
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
    auto files = rankFilesOf(args->inputs, "merge");
    if (!files) {
      ctx.exitCode = kExitBadInput;
      return;
    }
    auto stats = tracedb::merge(*files, args->output);
    if (!stats) {
      printError("merge", stats.error());
      ctx.exitCode = kExitBadInput;
      return;
    }
    std::cout << "merged " << stats->ranks << " rank" << (stats->ranks == 1 ? "" : "s") << " (" << stats->spans
              << " spans, " << stats->collectives << " collective records) into " << args->output.string() << "\n";
    size_t stalls = 0;
    for (const auto& input : args->inputs) {
      std::error_code ec;
      if (!std::filesystem::is_directory(input, ec)) continue;
      auto kept = analysis::addStallJournal(input, args->output);
      if (!kept) {
        std::cerr << "tpscope merge: warning: the live stall lines of " << input.string()
                  << " were not kept: " << kept.error() << "\n";
        continue;
      }
      stalls += *kept;
    }
    if (stalls > 0)
      std::cout << "kept " << stalls << " live stall line" << (stalls == 1 ? "" : "s") << " (alerts of kind 'stall')\n";
    // The per-step summaries the analyses and the viewer read first; without them the file is complete, only slower.
    if (tracedb::Status s = analysis::writeRunSummary(args->output); !s)
      std::cerr << "tpscope merge: warning: summaries not written (the analyses will compute them): " << s.message()
                << "\n";
  });
}

TPS_REGISTER_COMMAND(10, addMerge);

}  // namespace
}  // namespace tpscope::cli
