// Internal: the breakdown's pass over the spans, shared with the summaries (summary.cpp).
#pragma once

#include <map>
#include <tuple>
#include <vector>

#include "intervals.h"
#include "tpscope/analysis/breakdown.h"
#include "tpscope/tracedb/reader.h"

namespace tpscope::analysis::detail {

// (rank, span kind, phase) → the [begin, begin + dur) of its spans, steps left out (phaseBusyFromRecords's input).
using PhaseIntervals = std::map<std::tuple<int, int, int>, std::vector<Interval>>;

// computeBreakdownFromRecords, and where `phases` is given, the phases' intervals gathered by the same pass over the
// spans (a summary needs both: one read of the spans instead of two).
tracedb::Result<Breakdown> breakdownAndPhases(tracedb::Reader& reader, PhaseIntervals* phases);

}  // namespace tpscope::analysis::detail
