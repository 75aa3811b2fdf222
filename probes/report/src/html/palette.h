// The HTML report's colours, as CSS colour strings. They are the viewer's (gui/models palette.h, Qt-only) so a
// report and the viewer read alike: span kinds in tracedb::SpanKind order, communication by collective op,
// severities in analysis::Severity order, the viridis ramp of the gradient heatmap, magenta for non-finite cells.
#pragma once

#include <array>
#include <string>
#include <string_view>

#include "tpscope/analysis/finding.h"
#include "tpscope/tracedb/records.h"

namespace tpscope::report::html::palette {

using namespace tpscope::analysis;  // the findings and tables the page draws

// The timeline's colour table: tracedb::kSpanKindCount kinds, then one per collective op (kOps order).
inline constexpr std::array<std::string_view, 6> kOps = {"all_reduce", "all_gather", "reduce_scatter",
                                                         "broadcast",  "barrier",    "all_to_all"};
inline constexpr int kColourCount = tracedb::kSpanKindCount + static_cast<int>(kOps.size());
std::string_view colour(int index);      // index < kColourCount
std::string_view colourName(int index);  // "compute", ..., "all_reduce", ...
// The colour index of a span: its op's for comm / nccl_kernel spans whose name says which op (case-insensitive,
// "all_reduce", "ncclAllReduce..." alike), else its kind's.
int spanColour(tracedb::SpanKind kind, std::string_view name);

std::string_view severity(Severity severity);

// t in [0, 1] on viridis (piecewise linear, as the viewer's heat()).
std::string heat(double t);
inline constexpr std::string_view kNonFinite = "#e6007e";
inline constexpr std::string_view kNoData = "#d9d9de";
inline constexpr std::string_view kStuck = "#dc1e1e";
inline constexpr std::string_view kWaiting = "#f5a01e";

// Breakdown shares.
inline constexpr std::string_view kCompute = "#4285f4";
inline constexpr std::string_view kExposedComm = "#ea4335";
inline constexpr std::string_view kOther = "#8e6ec8";
inline constexpr std::string_view kIdle = "#c8c8d0";

}  // namespace tpscope::report::html::palette
