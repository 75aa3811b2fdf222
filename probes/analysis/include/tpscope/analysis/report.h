// The performance report (tpscope report) and the comparison of two runs (tpscope diff).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tpscope/analysis/breakdown.h"
#include "tpscope/analysis/collectives.h"
#include "tpscope/analysis/kernels.h"
#include "tpscope/analysis/pipeline.h"
#include "tpscope/analysis/run_info.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis {

struct Report {
  RunInfo info;
  Breakdown breakdown;
  CollectiveAnalysis collectives;
  PipelineReport pipeline;  // present only for a pipeline-parallel run (pipeline.h)
  KernelSummary kernels;    // present only for a run with device lanes (kernels.h)
};

tracedb::Result<Report> buildReport(tracedb::Reader& reader);

// Time per phase: Σ span durations of one (kind, phase) — e.g. ("compute", "fwd") — divided by ranks × steps, so
// runs with different step counts compare. Nested spans of the same kind and phase are counted once (interval
// union per rank).
struct PhaseTime {
  std::string kind;
  std::string phase;
  double nsPerRankStep = 0;
};

// A collective class: (group class, op), e.g. ("tp", "all_reduce"), so "tp-0" in one run meets "tp-0" in another
// even when the group count differs.
struct CollectiveClassTime {
  std::string groupClass;
  std::string op;
  double countPerStep = 0;      // collectives per group per step
  double meanLatencyNs = 0;     // Σ latency / count
  double meanTimeNs = 0;        // Σ mean member duration / count
  double busbwGbps = 0;
};

struct DiffEntry {
  std::string what;   // "phase compute/fwd", "collective tp all_reduce latency", "step time", ...
  double a = 0, b = 0;  // values in A and B (ns, or count / GB/s where `unit` says so)
  std::string unit;     // "ns", "count", "GB/s", "%"
  double change() const { return b - a; }
  double changePct() const { return a != 0 ? 100.0 * (b - a) / a : 0.0; }
};

struct RunDiff {
  std::vector<DiffEntry> entries;  // step time first, then phases, then collectives; by |changePct| desc within
  int stepsA = 0, stepsB = 0, ranksA = 0, ranksB = 0;
};

struct PhaseProfile {
  std::vector<PhaseTime> phases;
  std::vector<CollectiveClassTime> collectives;
  double stepNs = 0;  // mean step time
  int steps = 0, ranks = 0;
};

tracedb::Result<PhaseProfile> profilePhases(tracedb::Reader& reader, const Report& report);
RunDiff diffProfiles(const PhaseProfile& a, const PhaseProfile& b);

}  // namespace tpscope::analysis
