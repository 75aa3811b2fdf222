// tpscope import kineto|chrome|nsys FILE... -o RUN: PyTorch profiler traces (.json or .json.gz, one per rank), any
// Chrome Trace Event JSON (one or several ranks per file) or Nsight Systems SQLite exports → a run file.
#include <iostream>

#include "command.h"
#include "tpscope/analysis/summary.h"
#include "tpscope/formats/kineto_import.h"
#include "tpscope/formats/flight_recorder_import.h"
#include "tpscope/formats/nsys_import.h"

namespace tpscope::cli {
namespace {

struct ImportArgs {
  std::vector<std::filesystem::path> inputs;
  std::filesystem::path output;
};

// import flight-recorder DIR -o RUN: a folder, not a list of files (one dump per rank, the rank in the name).
void addFlightRecorder(CLI::App& cmd, Context& ctx) {
  struct Args {
    std::filesystem::path dir, output;
  };
  auto args = std::make_shared<Args>();
  auto* sub = cmd.add_subcommand(
      "flight-recorder",
      "PyTorch Flight Recorder dumps: a folder with one file per rank, the rank at the end of its name "
      "(nccl_trace_rank_3, fr_3.json), pickle (_dump_nccl_trace, the watchdog's file) or JSON "
      "(_dump_fr_trace_json), format 2.3 to 2.10");
  sub->add_option("dir", args->dir, "Folder of the ranks' dumps (its files only, not subfolders)")
      ->required()
      ->check(CLI::ExistingDirectory);
  sub->add_option("-o,--output", args->output, "The run file to write (replaced only on success)")->required();
  sub->callback([args, &ctx]() {
    auto stats = formats::importFlightRecorder(args->dir, args->output);
    if (!stats) {
      printError("import flight-recorder", stats.error());
      ctx.exitCode = kExitBadInput;
      return;
    }
    std::cout << stats->summary() << "\n";
    if (tracedb::Status s = analysis::writeRunSummary(args->output); !s)
      std::cerr << "tpscope import: warning: summaries not written (the analyses will compute them): "
                << s.message() << "\n";
  });
}

void addImport(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand("import", "Import traces of other tools into a run file");
  cmd->require_subcommand(1);
  // import: Result<Stats> (*)(std::span<const std::filesystem::path>, const std::filesystem::path&), Stats with
  // summary() (KinetoImportStats, NsysImportStats).
  auto add = [&](const char* name, const char* help, auto import) {
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
  add("nsys",
      "Nsight Systems SQLite exports (nsys export --type sqlite), one file per rank or one file holding several "
      "processes (each a rank)",
      formats::importNsys);
  addFlightRecorder(*cmd, ctx);
}

TPS_REGISTER_COMMAND(90, addImport);

}  // namespace
}  // namespace tpscope::cli
