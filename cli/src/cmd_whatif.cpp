// tpscope whatif RUN [--json] [--busbw GBPS [--collective CLASS:OP]]: the step time without the problem — each change
// replayed on the run's dependency graph across ranks (analysis/whatif.h): the predicted step time, the saving and the
// ranks whose critical path it shortens; the replay with no change against the measured step time; the critical path
// of the median step.
#include <iostream>

#include "command.h"
#include "text.h"
#include "tpscope/analysis/run_info.h"
#include "tpscope/analysis/whatif.h"
#include "tpscope/vocabulary/collective_ops.h"

namespace tpscope::cli {
namespace {

void printText(const analysis::WhatIfReport& r, const std::string& file, std::ostream& out) {
  out << file << ": " << r.steps << " step" << (r.steps == 1 ? "" : "s") << " measured";
  if (r.firstStep >= 0) out << " (from step " << r.firstStep << ")";
  out << ", " << (r.device ? "device" : "host") << " lanes\n";
  if (r.steps == 0) {
    out << "no step windows: nothing to replay\n";
    return;
  }
  const double gap = r.measuredStepNs > 0 ? 100.0 * (r.replayedStepNs - r.measuredStepNs) / r.measuredStepNs : 0;
  out << "step time: measured " << ms(r.measuredStepNs) << ", replayed with no change " << ms(r.replayedStepNs) << " ("
      << (gap >= 0 ? "+" : "") << fixed(gap, 1) << " %)\n";
  out << "model: " << r.collectives << " collectives and messages, " << r.boundBlocks << " blocking spans bound, "
      << r.unboundBlocks << " left as work, " << r.unboundRecords << " records without a blocking span";
  if (r.forced > 0) out << ", " << r.forced << " released without all their arrivals";
  out << "\n\n";
  Table t({"change", "predicted step", "saving", "", "critical path shortened on", "what"}, "lrrrll");
  for (const auto& ch : r.changes) {
    const double share = r.measuredStepNs > 0 ? 100.0 * ch.savingNs / r.measuredStepNs : 0;
    t.add({analysis::whatIfChangeName(ch.kind), ms(ch.predictedStepNs), ms(ch.savingNs), pct(share),
           ch.ranks.empty() ? "-" : analysis::rankList(ch.ranks), ch.description + (ch.replayed ? "" : " [analytic]")});
  }
  t.print(out);
  for (const auto& n : r.notes) out << "not applicable: " << n << "\n";
  if (r.criticalPath.empty()) return;
  out << "\ncritical path of step " << r.criticalStep << " (the median step), " << ms(r.criticalPathNs) << ":\n";
  Table p({"rank", "kind", "time", "what"}, "rlrl");
  for (const auto& s : r.criticalPath)
    p.add({std::to_string(s.rank), s.kind, ms(s.durNs),
           s.what + (s.count > 1 ? (s.what.empty() ? "" : ", ") + std::to_string(s.count) + " segments" : "")});
  p.print(out, "  ");
}

struct WhatIfArgs {
  std::filesystem::path run;
  bool json = false;
  double busbw = 0;
  std::string collective;
};

void addWhatIf(CLI::App& app, Context& ctx) {
  auto args = std::make_shared<WhatIfArgs>();
  auto* cmd = app.add_subcommand("whatif",
                                 "The step time without the problem: the straggler, a stage's imbalance, "
                                 "exposed communication, the bubble, a collective's bandwidth, replayed");
  cmd->add_option("run", args->run, "Run file (merged capture or import)")->required();
  cmd->add_flag("--json", args->json, "Print JSON");
  cmd->add_option("--busbw", args->busbw, "Replay one kind of collective at this bus bandwidth, GB/s (nccl-tests)")
      ->check(CLI::PositiveNumber);
  std::string ops;  // the catalogue's names, as the trace stores them
  for (std::string_view op : vocabulary::kCollectiveOpNames) ops += (ops.empty() ? "" : ", ") + std::string(op);
  cmd->add_option("--collective", args->collective,
                  "With --busbw: which collectives, OP or CLASS:OP (tp:all_reduce; OP one of " + ops +
                      "); default: the one with the most transfer on the critical path");
  cmd->callback([args, &ctx]() {
    auto reader = openRun(args->run);
    if (!reader) {
      ctx.exitCode = kExitBadInput;
      return;
    }
    analysis::WhatIfOptions options;
    if (args->busbw > 0) options.busbwGbps = args->busbw;
    options.collective = args->collective;
    auto report = analysis::analyzeWhatIf(*reader, options);
    if (!report) {
      printError("whatif", report.error());
      ctx.exitCode = kExitBadInput;
      return;
    }
    if (args->json)
      std::cout << analysis::whatIfToJson(*report, args->run.string());
    else
      printText(*report, args->run.string(), std::cout);
  });
}

TPS_REGISTER_COMMAND(55, addWhatIf);

}  // namespace
}  // namespace tpscope::cli
