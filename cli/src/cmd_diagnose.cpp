// tpscope diagnose RUN [--json] [--fail-on SEVERITY]: the root-cause chain, then every other finding, most severe
// first. RUN is a run file, or capture folders / rank files, diagnosed through a diagnosis file in the temporary
// folder (analysis::writeDiagnosisFile) without writing a merged run file.
#include <unistd.h>

#include <iostream>

#include "command.h"
#include "findings_text.h"
#include "tpscope/analysis/diagnose.h"
#include "tpscope/analysis/json_output.h"

namespace tpscope::cli {
namespace {

using analysis::Finding;
using analysis::Severity;

// The diagnosis file of rank files: removed when the command ends, however it ends.
struct DiagnosisFile {
  std::filesystem::path path;
  DiagnosisFile() = default;
  DiagnosisFile(const DiagnosisFile&) = delete;
  DiagnosisFile& operator=(const DiagnosisFile&) = delete;
  ~DiagnosisFile() {
    if (path.empty()) return;
    std::error_code ec;
    for (const char* suffix : {"", "-journal", "-wal", "-shm"}) std::filesystem::remove(path.string() + suffix, ec);
  }
};

struct DiagnoseArgs {
  std::vector<std::filesystem::path> runs;
  bool json = false;
  std::string failOn;
};

void addDiagnose(CLI::App& app, Context& ctx) {
  auto args = std::make_shared<DiagnoseArgs>();
  auto* cmd = app.add_subcommand("diagnose", "The root-cause chain (cause → consequences, each sized by what it "
                                             "cost), then every other finding (NaN origin, hang, desync, crash, "
                                             "stragglers, spikes, overhead), most severe first");
  cmd->add_option("run", args->runs,
                  "Run file (merged, a rank's file, or imported), or capture folders (one per node) and rank files: "
                  "diagnosed straight from the rank files, read in parallel, without a merged file")
      ->required();
  cmd->add_flag("--json", args->json, "Print the chain and the findings as JSON (the stable contract of "
                                      "docs/diagnosis.md)");
  cmd->add_option("--fail-on", args->failOn, "Exit with status 7 when a finding is at or above this severity")
      ->check(CLI::IsMember({"critical", "error", "warning", "info"}));
  cmd->callback([args, &ctx]() {
    std::error_code ec;
    const bool runFile = args->runs.size() == 1 && !std::filesystem::is_directory(args->runs.front(), ec);
    DiagnosisFile scratch;
    if (!runFile) {
      auto files = rankFilesOf(args->runs, "diagnose");
      if (!files) {
        ctx.exitCode = kExitBadInput;
        return;
      }
      scratch.path = std::filesystem::temp_directory_path(ec) /
                     ("tpscope-diagnose-" + std::to_string(::getpid()) + ".db");
      if (tracedb::Status s = analysis::writeDiagnosisFile(*files, scratch.path); !s) {
        printError("diagnose", s.message());
        ctx.exitCode = kExitBadInput;
        return;
      }
    }
    auto reader = openRun(runFile ? args->runs.front() : scratch.path);
    if (!reader) {
      ctx.exitCode = kExitBadInput;
      return;
    }
    const auto result = analysis::diagnose(*reader);
    std::string name;
    for (const auto& r : args->runs) name += (name.empty() ? "" : " ") + r.string();
    if (args->json) std::cout << analysis::diagnosisToJson(result, name);
    else printDiagnosis(result, std::cout);
    if (!result.errors.empty()) {
      for (const auto& e : result.errors) printError("diagnose", e);
      ctx.exitCode = kExitBadInput;
      return;
    }
    if (!args->failOn.empty()) {
      const Severity limit = *analysis::parseSeverity(args->failOn);
      for (const Finding& f : result.findings)
        if (f.severity <= limit) ctx.exitCode = kExitFindings;
    }
  });
}

TPS_REGISTER_COMMAND(20, addDiagnose);

}  // namespace
}  // namespace tpscope::cli
