// The run file's summaries (tracedb/summary.h), in the analysis's terms: what `tpscope merge`, capture's end and
// `tpscope import` write once so that `diagnose`, `report` and the viewer read per-rank, per-step figures instead of
// scanning every span. computeBreakdown() and profilePhases() use them when the file has current ones and compute the
// same figures from the records otherwise.
#pragma once

#include <filesystem>
#include <vector>

#include "tpscope/analysis/breakdown.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"
#include "tpscope/tracedb/summary.h"

namespace tpscope::analysis {

// The definition of the summarised figures (breakdown.h's time shares, the phase profile's busy times). Raise it when
// either definition changes: files summarised with another version are then read by computing from the records.
inline constexpr int kSummaryVersion = 1;

// Computes the summaries of the run file at `path` from its records and writes them into it, with the viewer's lane
// summary (tracedb/lane_summary.h).
tracedb::Status writeRunSummary(const std::filesystem::path& path);

// The pieces, for computeBreakdown, profilePhases and the tests.
tracedb::Result<tracedb::RunSummary> summaryFromRecords(tracedb::Reader& reader);
Breakdown breakdownFromSummary(const tracedb::RunSummary& summary);
// Per rank, span kind (except step) and phase: the union of those spans' time.
tracedb::Result<std::vector<tracedb::PhaseSummaryRow>> phaseBusyFromRecords(tracedb::Reader& reader);

}  // namespace tpscope::analysis
