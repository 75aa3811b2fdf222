// NaN/Inf origin: where the first non-finite value appeared, and how it spread.
//
// Events (per rank): grad_stats rows with nan_count > 0 or inf_count > 0 (gradients, taken before any reduction),
// alerts whose kind starts with "nonfinite", "nan" or "inf" (nonfinite_activation, nonfinite_grad, ...; their
// evidence JSON may carry nan_count, inf_count, numel, phase: a gradient's counts are taken from its grad_stats row
// all the same, the evidence's only where there is none), and step_stats rows with a non-finite loss or
// grad_norm (±Inf as stored; NaN, which SQLite stores as NULL, where the rank records that column at other steps).
// "First" is defined once (tpscope/vocabulary/nonfinite_order.h) and used by the live rule, this analysis and, through
// this analysis' origin finding, the viewer. The origin is the first event by:
//   1. step (smallest);
//   2. time, where events carry one (alerts.ts_ns; grad_stats have none);
//   3. backward order: the highest layer first, layer −1 (outside the transformer) last (the backward pass computes
//      layer L's gradients before layer L−1's, so a value born at layer L reaches lower layers afterwards);
//   4. the most non-finite elements, then the smallest rank.
// NaN beats Inf at the same position (a NaN origin is reported as nan_origin; Inf-only as inf_origin).
// Causal spread: a hop belongs to the path only if its payload can carry the value, and a rank is reached only if
// its own records show a non-finite value. From the origin (at its alert's time; for gradients, when backward
// reaches its layer), a reached rank passes the value through a collective it entered afterwards when: the payload
// is floating point (an integer vote carries nothing); the receiver's own first non-finite record is bounded by a
// time (alert time, else the end of its step) no earlier than the collective's completion (within the clock
// uncertainty); and the carrier is of a kind that leaves that record in the same step — a forward/backward
// collective of a non-DP group carries activations (so the receiver's activations or pre-reduction gradients show
// it), a DP gradient bucket or optimizer-phase collective carries reduced gradients or scalars (so only its step
// statistics show it). A record in a later step is explained by any carrier. Each receiver keeps its earliest
// carrier; affected ranks no carrier explains are "unexplained" (possible second origins).
// Incidents: a step recorded with no non-finite value on any rank ends one (NonFiniteReport::later).
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
  std::optional<int64_t> boundNs;   // the latest time the rank can have first held it: tsNs, else its step's end
  std::optional<double> prevNorm;   // the rank's l2 norm of the same param at the previous step, if recorded
  std::optional<double> medianNorm; // its median over the previous steps
  int microbatch = -1;  // a pipeline-parallel run's activation alert: the micro-batch whose forward produced it
  bool isNan() const { return nanCount > 0; }
};

struct SpreadHop {
  CollectiveRef collective;
  int step = -1;
  int fromRank = -1;
  std::vector<int> toRanks;  // members whose own records show the value and whose earliest carrier this is
};

struct NonFiniteReport {
  std::optional<NonFiniteEvent> origin;
  std::vector<NonFiniteEvent> firstPerRank;  // each affected rank's first event, by rank
  std::vector<int> receivers;                // affected ranks other than the origin, reached by the spread path
  std::vector<int> unexplained;              // affected ranks the spread path does not reach
  std::vector<SpreadHop> spread;             // in order of the hops
  // Later incidents: where a recorded step between two non-finite ones shows none on any rank (the policy skipped the
  // step with the value, --on-nonfinite skip-step, and the state stayed finite), the next value is born anew: its own
  // origin and spread, from the records of its steps on. Only the first incident's report holds them.
  std::vector<NonFiniteReport> later;
  int afterCleanStep = -1;  // a later incident: the last clean step before it
};

tracedb::Result<NonFiniteReport> analyzeNonFinite(tracedb::Reader& reader, const RunInfo& info);
std::vector<Finding> nonFiniteFindings(const NonFiniteReport& report, const RunInfo& info);
// The incident (`report` itself or one of its `later`) whose origin is on `rank` at `step`; null where none is.
const NonFiniteReport* incidentAt(const NonFiniteReport* report, int rank, int step);

}  // namespace tpscope::analysis
