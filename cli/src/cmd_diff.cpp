// tpscope diff RUN_A RUN_B [--json] [--threshold PCT]: what got slower or faster, per phase and collective class.
#include <cmath>
#include <iostream>

#include "command.h"
#include "text.h"
#include "tpscope/report/json_output.h"
#include "tpscope/analysis/report.h"

namespace tpscope::cli {
namespace {

struct DiffArgs {
  std::filesystem::path a, b;
  bool json = false;
  double threshold = 1.0;
};

std::string value(double v, const std::string& unit) {
  if (unit == "ns") return ms(v) + " ms";
  if (unit == "GB/s") return gbps(v) + " GB/s";
  return fixed(v, 2);
}

void addDiff(CLI::App& app, Context& ctx) {
  auto args = std::make_shared<DiffArgs>();
  auto* cmd = app.add_subcommand("diff", "Compare two runs: step time, time per phase, collective latency and "
                                         "bandwidth");
  cmd->add_option("run_a", args->a, "The baseline run file")->required();
  cmd->add_option("run_b", args->b, "The run to compare with it")->required();
  cmd->add_flag("--json", args->json, "Print JSON");
  cmd->add_option("--threshold", args->threshold, "Hide changes smaller than this many percent (default 1)");
  cmd->callback([args, &ctx]() {
    analysis::PhaseProfile profiles[2];
    const std::filesystem::path* files[2] = {&args->a, &args->b};
    for (int i = 0; i < 2; ++i) {
      auto reader = openRun(*files[i]);
      if (!reader) {
        ctx.exitCode = kExitBadInput;
        return;
      }
      auto report = analysis::buildReport(*reader);
      if (!report) {
        printError("diff", report.error());
        ctx.exitCode = kExitBadInput;
        return;
      }
      auto profile = analysis::profilePhases(*reader, *report);
      if (!profile) {
        printError("diff", profile.error());
        ctx.exitCode = kExitBadInput;
        return;
      }
      profiles[i] = std::move(*profile);
    }
    const auto d = analysis::diffProfiles(profiles[0], profiles[1]);
    if (args->json) {
      std::cout << report::diffToJson(d, args->a.string(), args->b.string());
      return;
    }
    std::cout << "A: " << args->a.string() << " (" << d.ranksA << " ranks, " << d.stepsA << " steps)\n"
              << "B: " << args->b.string() << " (" << d.ranksB << " ranks, " << d.stepsB << " steps)\n\n";
    Table t({"what", "A", "B", "change"});
    int hidden = 0;
    for (const auto& e : d.entries) {
      const bool both = e.a != 0 && e.b != 0;
      if (both && std::fabs(e.changePct()) < args->threshold && e.what != "step time") {
        ++hidden;
        continue;
      }
      if (e.a == 0 && e.b == 0) continue;
      std::string change = both ? (e.changePct() >= 0 ? "+" : "") + fixed(e.changePct(), 1) + "%"
                                : (e.a == 0 ? "only in B" : "only in A");
      if (both && e.unit == "ns") change += e.b > e.a ? " slower" : e.b < e.a ? " faster" : "";
      t.add({e.what, value(e.a, e.unit), value(e.b, e.unit), change});
    }
    t.print(std::cout);
    if (hidden > 0) std::cout << hidden << " entries changed by less than " << fixed(args->threshold, 1) << "%\n";
  });
}

TPS_REGISTER_COMMAND(60, addDiff);

}  // namespace
}  // namespace tpscope::cli
