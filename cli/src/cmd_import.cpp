// tpscope import kineto|chrome FILE... -o RUN: PyTorch profiler traces (.json or .json.gz, one per rank) or any
// Chrome Trace Event JSON (one or several ranks per file) → a run file.
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
  using ImportFn = tracedb::Result<formats::KinetoImportStats> (*)(std::span<const std::filesystem::path>,
                                                                   const std::filesystem::path&);
  auto add = [&](const char* name, const char* help, ImportFn import) {
    auto args = std::make_shared<ImportArgs>();
    auto* sub = cmd->add_subcommand(name, help);
    sub->add_option("files", args->inputs, "Trace files")->required()->check(CLI::ExistingFile);
    sub->add_option("-o,--output", args->output, "The run file to write (replaced only on success)")->required();
    sub->callback([args, &ctx, name, import]() {
      auto stats = import(args->inputs, args->output);
      if (!stats) {
        printError(std::string("import ") + name, stats.error());
        ctx.exitCode = kExitBadInput;
        return;
      }
      std::cout << stats->summary() << "\n";
      if (tracedb::Status s = analysis::writeRunSummary(args->output); !s)
        std::cerr << "tpscope import: warning: summaries not written (the analyses will compute them): "
                  << s.message() << "\n";
    });
  };
  add("kineto", "PyTorch profiler (Kineto) traces, one file per rank, .json or .json.gz", formats::importKineto);
  add("chrome",
      "Chrome Trace Event JSON of any tool (Megatron-style pipeline traces, tpscope's own export), .json or .json.gz",
      formats::importChrome);
}

TPS_REGISTER_COMMAND(90, addImport);

}  // namespace
}  // namespace tpscope::cli
