// Internal: the breakdown's pass over the spans, shared with the summaries (summary.cpp).
#pragma once

#include <map>
#include <tuple>
#include <vector>

#include "intervals.h"
#include "tpscope/analysis/breakdown.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/summary.h"

namespace tpscope::analysis::detail {

// (rank, span kind, phase) → the [begin, begin + dur) of its spans, steps left out (phaseBusyFromRecords's input).
using PhaseIntervals = std::map<std::tuple<int, int, int>, std::vector<Interval>>;

// The rows of `rank` in `phases` (per kind and phase, the measure of the union of its intervals) appended to `out`,
// in (kind, phase) order, and taken out of `phases`.
void takePhaseRows(PhaseIntervals& phases, int rank, std::vector<tracedb::PhaseSummaryRow>& out);

// computeBreakdownFromRecords, and where `phases` is given, the phases' busy time (phaseBusyFromRecords's rows, in
// (rank, kind, phase) order) from the same pass over the spans (a summary needs both: one read of the spans, not two).
tracedb::Result<Breakdown> breakdownAndPhases(tracedb::Reader& reader, std::vector<tracedb::PhaseSummaryRow>* phases);

}  // namespace tpscope::analysis::detail
