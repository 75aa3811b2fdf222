// tpscope export RUN --format chrome -o FILE: Chrome Trace Event JSON (Perfetto, chrome://tracing).
#include <iostream>

#include "command.h"
#include "tpscope/formats/chrome_export.h"

namespace tpscope::cli {
namespace {

struct ExportArgs {
  std::filesystem::path run;
  std::string format = "chrome";
  std::filesystem::path output;
};

void addExport(CLI::App& app, Context& ctx) {
  auto args = std::make_shared<ExportArgs>();
  auto* cmd = app.add_subcommand("export", "Export a run file to another trace format");
  cmd->add_option("run", args->run, "Run file")->required();
  cmd->add_option("--format", args->format, "Output format: chrome (Trace Event JSON for Perfetto/chrome://tracing)")
      ->check(CLI::IsMember({"chrome"}));
  cmd->add_option("-o,--output", args->output, "Output file (replaced only on success)")->required();
  cmd->callback([args, &ctx]() {
    // Check the input first so that a bad run is reported as bad input, not as an output failure.
    if (!openRun(args->run)) {
      ctx.exitCode = kExitBadInput;
      return;
    }
    auto stats = formats::exportChrome(args->run, args->output);
    if (!stats) {
      printError("export", stats.error());
      ctx.exitCode = kExitOutput;
      return;
    }
    std::cout << stats->summary() << "\n";
  });
}

TPS_REGISTER_COMMAND(80, addExport);

}  // namespace
}  // namespace tpscope::cli
