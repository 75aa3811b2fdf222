// NaN/Inf origin: where the first non-finite value appeared, and how it spread.
//
// Events (per rank): grad_stats rows with nan_count > 0 or inf_count > 0 (gradients, taken before any reduction),
// alerts whose kind starts with "nonfinite", "nan" or "inf" (nonfinite_activation, nonfinite_grad, ...; their
// evidence JSON may carry nan_count, inf_count, numel, phase), and step_stats rows with an infinite loss or grad_norm
// (weakest evidence, no layer; SQLite stores NaN as NULL, which cannot be told from "not recorded").
// The origin is the first event by:
//   1. step (smallest);
//   2. time, where events carry one (alerts.ts_ns; grad_stats have none);
//   3. backward order: the highest layer (the backward pass computes layer L's gradients before layer L−1's, so
//      a NaN that entered at layer L shows there first on its rank and in lower layers after the TP all-reduce);
//   4. the most non-finite elements, then the smallest rank.
// NaN beats Inf at the same position (a NaN origin is reported as nan_origin; Inf-only as inf_origin).
// Receivers: every other rank with a non-finite event. A receiver got it through the collectives the origin rank
// issued after the origin point: per group the origin belongs to, the first collective on the origin rank in the
// origin step at or after the origin (alert time; else, for gradients, the first backward collective at the origin
// layer or below; else the first of the step). Spreading is transitive: a DP all-reduce carries what a TP
// all-reduce delivered. Receivers the spread path does not reach are listed as "unexplained" (possible second
// origins).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tpscope/analysis/finding.h"
#include "tpscope/analysis/run_info.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis {

struct NonFiniteEvent {
  std::string source;  // "grad_stats", "alerts", "step_stats"
  int rank = 0;
  int step = -1;
  int layer = -1;
  std::string param;   // parameter name, alert param/phase, or "loss" / "grad_norm"
  std::string phase;   // "bwd" for gradients; from the alert's evidence/param otherwise; may be ""
  int64_t nanCount = 0, infCount = 0, numel = 0;
  std::optional<int64_t> tsNs;
  std::optional<double> prevNorm;   // the rank's l2 norm of the same param at the previous step, if recorded
  std::optional<double> medianNorm; // its median over the previous steps
  bool isNan() const { return nanCount > 0; }
};

struct SpreadHop {
  CollectiveRef collective;
  int step = -1;
  int fromRank = -1;
  std::vector<int> toRanks;  // members of the group that received it (all members but fromRank)
};

struct NonFiniteReport {
  std::optional<NonFiniteEvent> origin;
  std::vector<NonFiniteEvent> firstPerRank;  // each affected rank's first event, by rank
  std::vector<int> receivers;                // affected ranks other than the origin, reached by the spread path
  std::vector<int> unexplained;              // affected ranks the spread path does not reach
  std::vector<SpreadHop> spread;             // in order of the hops
};

tracedb::Result<NonFiniteReport> analyzeNonFinite(tracedb::Reader& reader, const RunInfo& info);
std::vector<Finding> nonFiniteFindings(const NonFiniteReport& report, const RunInfo& info);

}  // namespace tpscope::analysis
