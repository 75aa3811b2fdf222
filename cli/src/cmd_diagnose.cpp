// tpscope diagnose RUN [--json] [--fail-on SEVERITY]: every finding, most severe first.
#include <algorithm>
#include <iostream>
#include <map>

#include "command.h"
#include "tpscope/analysis/diagnose.h"
#include "tpscope/analysis/json_output.h"

namespace tpscope::cli {
namespace {

using analysis::Finding;
using analysis::Severity;

std::string upper(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::toupper(c); });
  return out;
}

void printText(const analysis::DiagnoseResult& r, std::ostream& out) {
  if (r.findings.empty()) out << "no findings\n";
  size_t kindWidth = 0;
  for (const Finding& f : r.findings) kindWidth = std::max(kindWidth, analysis::findingKindName(f.kind).size());
  std::map<Severity, int> counts;
  for (const Finding& f : r.findings) {
    ++counts[f.severity];
    std::string sev = upper(analysis::severityName(f.severity));
    sev.resize(9, ' ');
    std::string kind(analysis::findingKindName(f.kind));
    kind.resize(kindWidth + 2, ' ');
    out << sev << kind << f.message << "\n";
    for (const auto& d : f.details) out << std::string(9 + kindWidth + 2, ' ') << d << "\n";
  }
  for (const auto& [kind, n] : r.omitted) out << "(" << n << " more " << kind << " findings left out)\n";
  for (const auto& e : r.errors) out << "analysis failed: " << e << "\n";
  if (!r.findings.empty()) {
    out << r.findings.size() << " finding" << (r.findings.size() == 1 ? "" : "s") << ":";
    bool first = true;
    for (const auto& [sev, n] : counts) {
      out << (first ? " " : ", ") << n << " " << analysis::severityName(sev);
      first = false;
    }
    out << "\n";
  }
}

struct DiagnoseArgs {
  std::filesystem::path run;
  bool json = false;
  std::string failOn;
};

void addDiagnose(CLI::App& app, Context& ctx) {
  auto args = std::make_shared<DiagnoseArgs>();
  auto* cmd = app.add_subcommand("diagnose", "Every finding (NaN origin, hang, desync, crash, stragglers, spikes, "
                                             "overhead), most severe first");
  cmd->add_option("run", args->run, "Run file (merged, a rank's file, or imported)")->required();
  cmd->add_flag("--json", args->json, "Print the findings as JSON (the stable contract of docs/diagnosis.md)");
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
    else printText(result, std::cout);
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
