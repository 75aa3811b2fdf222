// tpscope alerts RUN [--json] [--min-severity S]: the alerts the ranks recorded while training (gradient health,
// non-finite values, ...), in time order.
#include <nlohmann/json.hpp>

#include <iostream>
#include <map>

#include "command.h"
#include "findings_text.h"
#include "tpscope/analysis/finding.h"

namespace tpscope::cli {
namespace {

struct AlertsArgs {
  std::filesystem::path run;
  bool json = false;
  std::string minSeverity = "info";
};

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
    const analysis::Severity limit = analysis::storedSeverity(args->minSeverity);
    auto shown = [&](const tracedb::AlertRow& a) { return analysis::storedSeverity(a.severity) <= limit; };
    if (args->json) {
      nlohmann::ordered_json list = nlohmann::ordered_json::array();
      for (const auto& a : *alerts) {
        if (!shown(a)) continue;
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
    std::map<int, std::string> hosts;
    if (auto ranks = reader->ranks())
      for (const auto& r : *ranks) hosts[r.rank] = r.host;
    int printed = 0;
    for (const auto& a : *alerts) {
      if (!shown(a)) continue;
      ++printed;
      std::cout << alertText(a, hosts[a.rank]) << "\n";
    }
    if (printed == 0) std::cout << "no alerts\n";
  });
}

TPS_REGISTER_COMMAND(40, addAlerts);

}  // namespace
}  // namespace tpscope::cli
