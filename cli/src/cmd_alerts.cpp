// tpscope alerts RUN [--json] [--min-severity S]: the alerts the ranks recorded while training (gradient health,
// non-finite values, ...), in time order.
#include <nlohmann/json.hpp>

#include <iostream>

#include "command.h"
#include "text.h"
#include "tpscope/analysis/finding.h"

namespace tpscope::cli {
namespace {

struct AlertsArgs {
  std::filesystem::path run;
  bool json = false;
  std::string minSeverity = "info";
};

// Alerts use the probes' severity names; unknown ones sort as warnings.
int rankOf(const std::string& severity) {
  auto s = analysis::parseSeverity(severity);
  return static_cast<int>(s.value_or(analysis::Severity::Warning));
}

void addAlerts(CLI::App& app, Context& ctx) {
  auto args = std::make_shared<AlertsArgs>();
  auto* cmd = app.add_subcommand("alerts", "The alerts recorded during the run, in time order");
  cmd->add_option("run", args->run, "Run file")->required();
  cmd->add_flag("--json", args->json, "Print JSON: a list of {rank, step, ts_ns, severity, kind, layer, param, "
                                      "message, evidence}");
  cmd->add_option("--min-severity", args->minSeverity, "Leave out alerts below this severity")
      ->check(CLI::IsMember({"critical", "error", "warning", "info"}));
  cmd->callback([args, &ctx]() {
    auto reader = openRun(args->run);
    if (!reader) {
      ctx.exitCode = kExitBadInput;
      return;
    }
    auto alerts = reader->alerts();
    if (!alerts) {
      printError("alerts", alerts.error());
      ctx.exitCode = kExitBadInput;
      return;
    }
    const int limit = rankOf(args->minSeverity);
    if (args->json) {
      nlohmann::ordered_json list = nlohmann::ordered_json::array();
      for (const auto& a : *alerts) {
        if (rankOf(a.severity) > limit) continue;
        nlohmann::ordered_json j;
        j["rank"] = a.rank;
        j["step"] = a.step;
        j["ts_ns"] = a.tsNs;
        j["severity"] = a.severity;
        j["kind"] = a.kind;
        j["layer"] = a.layer;
        j["param"] = a.param;
        j["message"] = a.message;
        auto ev = nlohmann::ordered_json::parse(a.evidence, nullptr, false);
        j["evidence"] = ev.is_discarded() ? nlohmann::ordered_json(a.evidence) : ev;
        list.push_back(std::move(j));
      }
      std::cout << list.dump(2) << "\n";
      return;
    }
    Table t({"step", "rank", "severity", "kind", "layer", "param", "message"}, "rrllrll");
    int shown = 0;
    for (const auto& a : *alerts) {
      if (rankOf(a.severity) > limit) continue;
      ++shown;
      t.add({std::to_string(a.step), std::to_string(a.rank), a.severity, a.kind,
             a.layer >= 0 ? std::to_string(a.layer) : "-", a.param.empty() ? "-" : a.param, a.message});
    }
    if (shown == 0) std::cout << "no alerts\n";
    else t.print(std::cout);
  });
}

TPS_REGISTER_COMMAND(40, addAlerts);

}  // namespace
}  // namespace tpscope::cli
