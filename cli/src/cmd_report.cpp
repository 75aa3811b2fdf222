// tpscope report RUN [--json] [--steps] [--html FILE]: time breakdown per rank (and step), collective table, TP model
// check, stragglers, and (text) gradient norms by layer over the run; --html writes the self-contained HTML report
// (report/html_report.h) instead.
#include <iostream>

#include "command.h"
#include "text.h"
#include "tpscope/version.h"
#include "tpscope/analysis/anomalies.h"
#include "tpscope/analysis/report.h"
#include "tpscope/report/html_report.h"
#include "tpscope/report/json_output.h"

namespace tpscope::cli {
namespace {

using analysis::TimeShares;

std::vector<std::string> sharesRow(std::string first, int steps, const TimeShares& t) {
  const double perStep = steps > 0 ? static_cast<double>(t.stepNs) / steps : 0.0;
  return {std::move(first),      std::to_string(steps), ms(perStep),           pct(t.pct(t.computeNs)),
          pct(t.pct(t.commNs)),  pct(t.pct(t.exposedCommNs)), pct(t.pct(t.otherNs)), pct(t.pct(t.idleNs))};
}

// Only where some rank was read on its GPU streams (Kineto imports of GPU jobs): which lanes each rank's row is
// from, the memcpy/memset share and the idle split (analysis/breakdown.h).
void printDeviceLanes(const analysis::Breakdown& b, std::ostream& out) {
  bool any = false;
  for (const auto& rb : b.ranks) any = any || rb.lanes == analysis::Lanes::Device;
  if (!any) return;
  out << "device lanes (GPU streams): compute = kernels, comm = NCCL kernels, other = memcpy/memset alone\n";
  Table t({"rank", "lanes", "memcpy", "idle host wait", "idle kernel wait", "idle other"});
  for (const auto& rb : b.ranks) {
    const TimeShares& x = rb.time;
    t.add({std::to_string(rb.rank), analysis::lanesName(rb.lanes), pct(x.pct(x.memcpyNs)),
           pct(x.pct(x.idleHostWaitNs)), pct(x.pct(x.idleKernelWaitNs)), pct(x.pct(x.idleOtherNs))});
  }
  t.print(out);
}

void printText(const analysis::Report& r, const std::string& file, bool steps, std::ostream& out) {
  const auto& b = r.breakdown;
  int maxSteps = 0;
  for (const auto& rb : b.ranks) maxSteps = std::max(maxSteps, rb.steps);
  out << file << ": " << b.ranks.size() << " rank" << (b.ranks.size() == 1 ? "" : "s") << ", " << maxSteps
      << " step" << (maxSteps == 1 ? "" : "s") << " (step windows from " << analysis::stepSourceName(b.source)
      << ")\n\n";
  if (b.ranks.empty()) {
    out << "no spans or collectives recorded\n";
    return;
  }
  Table t({"rank", "steps", "step ms", "compute", "comm", "exposed comm", "other", "idle"});
  for (const auto& rb : b.ranks) t.add(sharesRow(std::to_string(rb.rank), rb.steps, rb.time));
  t.add(sharesRow("all", static_cast<int>(b.steps.size()), b.run));
  t.print(out);
  out << "comm overhead (exposed communication / step time): run " << pct(b.run.commOverheadPct()) << "\n";
  printDeviceLanes(b, out);
  if (steps) {
    out << "\n";
    Table s({"rank", "step", "step ms", "compute", "comm", "exposed comm", "other", "idle"});
    for (const auto& sb : b.steps) {
      auto row = sharesRow(std::to_string(sb.rank), 1, sb.time);
      row[1] = std::to_string(sb.step);
      s.add(row);
    }
    s.print(out);
  }

  const auto& ca = r.collectives;
  if (!ca.stats.empty()) {
    out << "\n";
    Table c({"group", "op", "n", "count", "size each", "total ms", "latency ms", "algbw GB/s", "busbw GB/s",
             "skew mean ms", "skew max ms"},
            "ll");
    for (const auto& s : ca.stats) {
      c.add({s.group, s.op, std::to_string(s.groupSize), std::to_string(s.count) +
                                                           (s.incomplete ? " (+" + std::to_string(s.incomplete) +
                                                                               " incomplete)"
                                                                         : ""),
             bytes(s.count ? static_cast<double>(s.bytes) / s.count : 0), ms(s.totalNs), ms(s.latencyNs),
             gbps(s.algbwGbps), gbps(s.busbwGbps), ms(s.meanSkewNs), ms(s.maxSkewNs)});
    }
    c.print(out);
    out << "(GB/s = 1e9 bytes/s; busbw = algbw × nccl-tests factor: all-reduce 2(n−1)/n, all-gather and "
           "reduce-scatter (n−1)/n)\n";
  }

  const auto& tp = ca.tp;
  if (tp.measuredPerStep > 0 || tp.haveModel) {
    out << "\nTP all-reduce (group tp-*): " << fixed(tp.measuredPerStep, 1) << "/step, " << bytes(tp.measuredBytesEach)
        << " each, busbw " << gbps(tp.busbwGbps) << " GB/s";
    if (tp.haveModel) {
      const auto& m = tp.model;
      out << "\n  the model of the config expects per step and TP group, " << tp.expectedElements
          << " elements each (" << (m.activationCheckpointing ? "6 per layer with activation checkpointing" : "4 per layer")
          << " × " << m.layers << " layers"
          << (m.vocabParallel ? ", + the vocab-parallel embedding and LM head" : "")
          << (m.gradAccumSteps > 1 ? ", × " + std::to_string(m.gradAccumSteps) + " micro-batches" : std::string())
          << "):\n  ";
      if (m.sequenceParallel)
        out << tp.expectedAllGatherPerStep << " all-gathers (measured " << fixed(tp.measuredAllGatherPerStep, 1)
            << ") and " << tp.expectedReduceScatterPerStep << " reduce-scatters (measured "
            << fixed(tp.measuredReduceScatterPerStep, 1) << ")";
      else
        out << tp.expectedPerStep << " all-reduces (measured " << fixed(tp.measuredModelSizedPerStep, 1) << ")";
      out << (tp.matches ? " — matches" : " — does not match");
    } else {
      out << " (no model dimensions in meta 'config' to compare with)";
    }
    out << "\n";
  }
  const auto& st = ca.stragglers;
  const analysis::RankStraggling* top = st.ranks.empty() ? nullptr : &st.ranks.front();
  if (top != nullptr && top->causedWaitNs > 0) {
    // A figure, with its significance: who is last at a collective is chance unless the test says otherwise.
    out << "arrivals: rank " << top->rank << " caused the most waiting, " << ms(top->causedWaitNs) << " ms (chance: "
        << ms(top->expectedWaitNs) << " ms, z " << fixed(top->z, 1) << ", p " << sci(top->pValue) << ")";
    if (st.steps > 0) out << ", " << ms(static_cast<double>(top->causedWaitNs) / st.steps) << " ms per step";
    out << "; tpscope diagnose names a straggler only when it is significant and material\n";
    out << "\nranks by the waiting they caused (decided collectives):\n";
    Table w({"rank", "collectives", "last", "last %", "caused wait ms", "by chance ms", "z", "own wait ms"});
    for (size_t i = 0; i < st.ranks.size() && i < 8; ++i) {
      const auto& r = st.ranks[i];
      w.add({std::to_string(r.rank), std::to_string(r.collectives), std::to_string(r.lastCount), pct(r.lastPct()),
             ms(r.causedWaitNs), ms(r.expectedWaitNs), fixed(r.z, 1), ms(r.waitedNs)});
    }
    w.print(out);
  }
  if (st.undecided > 0)
    out << st.undecided << " collective" << (st.undecided == 1 ? "" : "s")
        << " with arrival skew within the clock uncertainty (order undecided)\n";
}

// Pipeline runs: the measured bubble per stage next to the schedule's analytic one (analysis/pipeline.h).
void printPipeline(const analysis::PipelineReport& p, std::ostream& out) {
  if (!p.present) return;
  out << "\npipeline: " << p.schedule << ", " << p.stages << " stages, " << p.microbatches << " micro-batches"
      << (p.virtualStages > 1 ? ", " + std::to_string(p.virtualStages) + " chunks per stage" : std::string())
      << "; analytic bubble " << pct(p.analyticBubblePct) << " of the pipeline time, measured over " << p.steps
      << " step" << (p.steps == 1 ? "" : "s") << ":\n";
  Table t({"stage", "ranks", "window ms", "compute ms", "own compute ms", "bubble", "warm-up/cool-down",
           "dependency wait", "transfer"});
  for (const auto& s : p.perStage)
    t.add({std::to_string(s.stage), analysis::formatRanks(s.ranks), ms(s.stepNs), ms(s.computeNs),
           ms(s.ownComputeNs), pct(s.bubblePct), pct(s.warmupCooldownPct), pct(s.dependencyWaitPct),
           pct(s.transferPct)});
  t.print(out);
  if (p.longestStage >= 0)
    out << "longest stage: " << p.longestStage << " (" << pct(p.longestOverMeanPct)
        << " more own compute than the stages' mean)\n";
}

// Gradient norms by layer over the run (grad_stats: per step the median over ranks and parameters of the layer):
// a layer whose gradients grow or vanish by decades shows here long before it produces a NaN.
void printLayerTrends(const std::vector<analysis::LayerTrend>& trends, std::ostream& out) {
  if (trends.empty()) return;
  out << "\ngradient norm by layer (median over ranks and parameters; trend = least-squares slope of log10(norm)):\n";
  Table t({"layer", "steps", "first", "last", "last/first", "trend per 100 steps"});
  for (const auto& tr : trends) {
    const double ratio = tr.firstNorm > 0 ? tr.lastNorm / tr.firstNorm : 0.0;
    t.add({tr.layer < 0 ? "other" : std::to_string(tr.layer), std::to_string(tr.steps), fixed(tr.firstNorm, 4),
           fixed(tr.lastNorm, 4), fixed(ratio, 2) + "x", fixed(tr.decadesPer100Steps, 2) + " decades"});
  }
  t.print(out);
}

struct ReportArgs {
  std::filesystem::path run;
  bool json = false;
  bool steps = false;
  std::filesystem::path html;
};

// --html FILE: a damaged run is bad input (exit 2), a file that cannot be written an output failure (exit 6).
int writeHtml(tracedb::Reader& reader, const ReportArgs& args) {
  report::HtmlReportOptions options;
  options.generator = "tpscope " TPSCOPE_VERSION;
  auto page = report::renderHtmlReport(reader, options);
  if (!page) {
    printError("report", page.error());
    return kExitBadInput;
  }
  if (auto s = report::writeHtmlFile(args.html, page->html); !s) {
    printError("report", s.message());
    return kExitOutput;
  }
  std::cout << "wrote " << args.html.string() << " (" << bytes(static_cast<double>(page->stats.bytes)) << ", "
            << page->stats.lanes << " timeline lanes, " << page->stats.windowSpans << " spans in the window)\n";
  return kExitOk;
}

void addReport(CLI::App& app, Context& ctx) {
  auto args = std::make_shared<ReportArgs>();
  auto* cmd = app.add_subcommand("report", "Time breakdown per rank and step, collective bandwidth, TP model check, "
                                           "stragglers");
  cmd->add_option("run", args->run, "Run file")->required();
  cmd->add_flag("--json", args->json, "Print JSON (fields in docs/diagnosis.md)");
  cmd->add_flag("--steps", args->steps, "Also print the breakdown of every step of every rank");
  cmd->add_option("--html", args->html,
                  "Write a self-contained HTML report (diagnosis, breakdown, gradient heatmap, communication, desync, "
                  "timeline) to FILE instead; it opens from disk in any browser, with no network access")
      ->type_name("FILE")
      ->excludes("--json");
  cmd->callback([args, &ctx]() {
    auto reader = openRun(args->run);
    if (!reader) {
      ctx.exitCode = kExitBadInput;
      return;
    }
    if (!args->html.empty()) {
      ctx.exitCode = writeHtml(*reader, *args);
      return;
    }
    auto report = analysis::buildReport(*reader);
    if (!report) {
      printError("report", report.error());
      ctx.exitCode = kExitBadInput;
      return;
    }
    if (args->json) {
      std::cout << tpscope::report::reportToJson(*report, args->run.string());
      return;
    }
    printText(*report, args->run.string(), args->steps, std::cout);
    printPipeline(report->pipeline, std::cout);
    auto anomalies = analysis::analyzeAnomalies(*reader, report->info);
    if (anomalies) printLayerTrends(anomalies->layerTrends, std::cout);
    else printError("report: gradient norms by layer", anomalies.error());
  });
}

TPS_REGISTER_COMMAND(30, addReport);

}  // namespace
}  // namespace tpscope::cli
