// tpscope import kineto FILE... -o RUN: PyTorch profiler traces (.json or .json.gz, one per rank) → a run file.
#include <iostream>

#include "command.h"
#include "tpscope/analysis/summary.h"
#include "tpscope/formats/kineto_import.h"

namespace tpscope::cli {
namespace {

struct ImportArgs {
  std::vector<std::filesystem::path> inputs;
  std::filesystem::path output;
};

void addImport(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand("import", "Import traces of other tools into a run file");
  cmd->require_subcommand(1);
  auto args = std::make_shared<ImportArgs>();
  auto* kineto = cmd->add_subcommand("kineto", "PyTorch profiler (Kineto) traces, one file per rank, .json or .json.gz");
  kineto->add_option("files", args->inputs, "Trace files")->required()->check(CLI::ExistingFile);
  kineto->add_option("-o,--output", args->output, "The run file to write (replaced only on success)")->required();
  kineto->callback([args, &ctx]() {
    auto stats = formats::importKineto(args->inputs, args->output);
    if (!stats) {
      printError("import kineto", stats.error());
      ctx.exitCode = kExitBadInput;
      return;
    }
    std::cout << stats->summary() << "\n";
    if (tracedb::Status s = analysis::writeRunSummary(args->output); !s)
      std::cerr << "tpscope import: warning: summaries not written (the analyses will compute them): " << s.message()
                << "\n";
  });
}

TPS_REGISTER_COMMAND(90, addImport);

}  // namespace
}  // namespace tpscope::cli
