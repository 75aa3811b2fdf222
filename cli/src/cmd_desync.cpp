// tpscope desync RUN [--json] [--all]: per process group, each rank's progress through the collective sequence,
// the stuck sequence number, who never entered it, and mismatched collectives (flight-recorder match states).
#include <iostream>

#include "command.h"
#include "text.h"
#include "tpscope/analysis/desync.h"
#include "tpscope/report/json_output.h"

namespace tpscope::cli {
namespace {

using analysis::GroupDesync;

std::string seqText(int64_t s) { return s > 0 ? std::to_string(s) : "-"; }

void printGroup(const GroupDesync& g, std::ostream& out) {
  out << "group " << g.group << " (ranks " << analysis::formatRanks(g.members) << "): ";
  if (g.healthy()) out << "in step";
  if (g.stuckSeq) out << "STUCK at seq " << *g.stuckSeq << " (" << analysis::matchStateName(g.stuckState) << ")";
  if (g.stuckSeq && g.mismatchCount) out << "; ";
  if (g.mismatchCount) out << g.mismatchCount << " mismatched seq" << (g.mismatchCount == 1 ? "" : "s");
  out << "\n";
  Table t({"rank", "last enqueued", "last started", "last completed", "state", "callsite"}, "rrrrll");
  for (const auto& p : g.progress) {
    std::string state = "-", callsite;
    if (p.lastRecord) {
      state = p.lastRecord->state;
      callsite = p.lastRecord->callsite;
    }
    bool missing = false;
    for (int m : g.missingRanks) missing = missing || m == p.rank;
    if (missing) {
      state = "never entered";
      if (p.lastSpan) {
        callsite = "last span: " + p.lastSpan->name;
        if (p.lastSpan->step >= 0) callsite += ", step " + std::to_string(p.lastSpan->step);
      }
    }
    t.add({std::to_string(p.rank), seqText(p.lastEnqueued), seqText(p.lastStarted), seqText(p.lastCompleted), state,
           callsite});
  }
  t.print(out, "  ");
  for (const auto& m : g.mismatches) {
    out << "  seq " << m.seq << ": " << analysis::matchStateName(m.state) << "\n";
    for (const auto& r : m.records) {
      out << "    rank " << r.rank << ": " << r.op << " " << r.dtype << " [";
      for (size_t i = 0; i < r.shape.size(); ++i) out << (i ? "," : "") << r.shape[i];
      out << "] " << r.state;
      if (!r.callsite.empty()) out << " at " << r.callsite;
      out << "\n";
    }
  }
  if (g.mismatchCount > static_cast<int64_t>(g.mismatches.size()))
    out << "  (" << g.mismatchCount - static_cast<int64_t>(g.mismatches.size()) << " more mismatched seqs)\n";
}

struct DesyncArgs {
  std::filesystem::path run;
  bool json = false;
};

void addDesync(CLI::App& app, Context& ctx) {
  auto args = std::make_shared<DesyncArgs>();
  auto* cmd = app.add_subcommand("desync", "Per process group: each rank's last enqueued/started/completed collective, "
                                           "the stuck one, who never entered it, mismatches");
  cmd->add_option("run", args->run, "Run file")->required();
  cmd->add_flag("--json", args->json, "Print JSON");
  cmd->callback([args, &ctx]() {
    auto reader = openRun(args->run);
    if (!reader) {
      ctx.exitCode = kExitBadInput;
      return;
    }
    auto info = analysis::loadRunInfo(*reader);
    if (!info) {
      printError("desync", info.error());
      ctx.exitCode = kExitBadInput;
      return;
    }
    auto report = analysis::analyzeDesync(*reader, *info);
    if (!report) {
      printError("desync", report.error());
      ctx.exitCode = kExitBadInput;
      return;
    }
    if (args->json) {
      std::cout << tpscope::report::desyncToJson(*report, args->run.string());
      return;
    }
    if (report->groups.empty()) std::cout << "no collectives recorded\n";
    for (const auto& g : report->groups) printGroup(g, std::cout);
  });
}

TPS_REGISTER_COMMAND(50, addDesync);

}  // namespace
}  // namespace tpscope::cli
