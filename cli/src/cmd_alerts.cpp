// tpscope alerts RUN [--json] [--min-severity S]: the alerts the ranks recorded while training (gradient health,
// non-finite values, ...), in time order. --follow DIR: the alerts of a job still running (a capture folder or a
// TPSCOPE_OUT folder) as its ranks record them, with the live stall lines, until it ends (capture/job_watch.h).
#include <nlohmann/json.hpp>

#include <iostream>
#include <map>

#if TPSCOPE_CLI_CAPTURE
#include <unistd.h>

#include "capture/job_watch.h"
#include "capture/run_poller.h"
#endif
#include "command.h"
#include "tpscope/report/findings_text.h"
#include "tpscope/analysis/finding.h"

namespace tpscope::cli {
namespace {

struct AlertsArgs {
  std::filesystem::path run;
  bool json = false;
  std::string minSeverity = "info";
  bool follow = false;
  double hangTimeoutS = 300;
};

nlohmann::ordered_json alertJson(const tracedb::AlertRow& a) {
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
  return j;
}

#if TPSCOPE_CLI_CAPTURE
// --follow on a folder: the ranks' alerts as their files get them, and the live stall lines (kind 'stall'), printed
// one by one (--json: one object per line), until the job ends or makes no progress for --hang-timeout (the watch's
// last line on stderr says which, with capture's status); then 0. 1: no rank file appeared.
int followAlerts(const AlertsArgs& args) {
  const analysis::Severity limit = analysis::storedSeverity(args.minSeverity);
  capture::WatchOptions o;
  o.dir = args.run;
  o.hangTimeoutS = args.hangTimeoutS;
  o.progress = false;
  o.noticesToErr = true;
  o.journal = false;          // a reader: it writes nothing into the job's folder
  o.skipEarlierJobs = false;  // a job that already ended: its alerts, then the end
  o.onAlert = [&](const capture::LiveAlert& a) {
    if (analysis::storedSeverity(a.row.severity) > limit) return;
    if (args.json) std::cout << alertJson(a.row).dump() << std::endl;
    else std::cout << capture::liveAlertText(a) << std::endl;
  };
  o.onStallLine = [&](const std::string& line) {
    // A stall line is a critical alert while the job is stalled; RESUMED says it was a straggler (info).
    const bool resumed = line.starts_with("RESUMED");
    if (analysis::storedSeverity(resumed ? "info" : "critical") > limit) return;
    if (!args.json) {
      std::cout << line << std::endl;
      return;
    }
    nlohmann::ordered_json j;
    j["severity"] = resumed ? "info" : "critical";
    j["kind"] = "stall";
    j["message"] = line;
    std::cout << j.dump() << std::endl;
  };
  const int status = capture::runWatch(o, stdout, stderr);
  return status == 1 || status == 2 ? status : kExitOk;
}
#endif

void addAlerts(CLI::App& app, Context& ctx) {
  auto args = std::make_shared<AlertsArgs>();
  auto* cmd = app.add_subcommand("alerts", "The alerts recorded during the run, in time order");
  cmd->add_option("run", args->run, "Run file")->required();
  cmd->add_flag("--json", args->json, "Print JSON: a list of {rank, step, ts_ns, severity, kind, layer, param, "
                                      "message, evidence}");
  cmd->add_option("--min-severity", args->minSeverity, "Leave out alerts below this severity")
      ->check(CLI::IsMember({"critical", "error", "warning", "info"}));
#if TPSCOPE_CLI_CAPTURE
  cmd->add_flag("-f,--follow", args->follow,
                "RUN is the folder of a job still running (capture --out, TPSCOPE_OUT): print its ranks' alerts and "
                "the live stall lines as they appear, until the job ends (stderr: how it ended)");
  cmd->add_option("--hang-timeout", args->hangTimeoutS,
                  "--follow: seconds without progress on any rank before it gives up (exit 3)")
      ->default_val(300)
      ->check(CLI::PositiveNumber);
#endif
  cmd->callback([args, &ctx]() {
#if TPSCOPE_CLI_CAPTURE
    if (args->follow && std::filesystem::is_directory(args->run)) {
      ctx.exitCode = followAlerts(*args);
      return;
    }
#endif
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
        nlohmann::ordered_json j = alertJson(a);
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
      std::cout << report::alertText(a, hosts[a.rank]) << "\n";
    }
    if (printed == 0) std::cout << "no alerts\n";
  });
}

TPS_REGISTER_COMMAND(40, addAlerts);

}  // namespace
}  // namespace tpscope::cli
