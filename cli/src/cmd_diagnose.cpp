// tpscope diagnose RUN [--json] [--fail-on SEVERITY]: the root-cause chain, then every other finding, most severe
// first.
#include <iostream>

#include "command.h"
#include "findings_text.h"
#include "tpscope/analysis/diagnose.h"
#include "tpscope/analysis/json_output.h"

namespace tpscope::cli {
namespace {

using analysis::Finding;
using analysis::Severity;

struct DiagnoseArgs {
  std::filesystem::path run;
  bool json = false;
  std::string failOn;
};

void addDiagnose(CLI::App& app, Context& ctx) {
  auto args = std::make_shared<DiagnoseArgs>();
  auto* cmd = app.add_subcommand("diagnose", "The root-cause chain (cause → consequences, each sized by what it "
                                             "cost), then every other finding (NaN origin, hang, desync, crash, "
                                             "stragglers, spikes, overhead), most severe first");
  cmd->add_option("run", args->run, "Run file (merged, a rank's file, or imported)")->required();
  cmd->add_flag("--json", args->json, "Print the chain and the findings as JSON (the stable contract of "
                                      "docs/diagnosis.md)");
  cmd->add_option("--fail-on", args->failOn, "Exit with status 7 when a finding is at or above this severity")
      ->check(CLI::IsMember({"critical", "error", "warning", "info"}));
  cmd->callback([args, &ctx]() {
    auto reader = openRun(args->run);
    if (!reader) {
      ctx.exitCode = kExitBadInput;
      return;
    }
    const auto result = analysis::diagnose(*reader);
    if (args->json) std::cout << analysis::diagnosisToJson(result, args->run.string());
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
