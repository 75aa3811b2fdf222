// The HTML report's colours, as CSS colour strings rendered from the one colour table (tpscope/vocabulary/colours.h)
// that the viewer draws with too, so a report and the viewer read alike: span kinds in tracedb::SpanKind order,
// communication by collective op, severities in analysis::Severity order, the viridis ramp of the gradient heatmap,
// magenta for non-finite cells.
#pragma once

#include <array>
#include <string>
#include <string_view>

#include "tpscope/analysis/finding.h"
#include "tpscope/tracedb/records.h"
#include "tpscope/vocabulary/collective_ops.h"
#include "tpscope/vocabulary/colours.h"

namespace tpscope::report::html::palette {

using namespace tpscope::analysis;  // the findings and tables the page draws

// "#rrggbb" of a colour, lower-case, usable in constant expressions.
struct Hex {
  std::array<char, 8> text{};
  constexpr std::string_view view() const { return {text.data(), 7}; }
};
constexpr Hex hex(vocabulary::Rgb c) {
  constexpr std::string_view kDigits = "0123456789abcdef";
  return {{'#', kDigits[c.r >> 4], kDigits[c.r & 15], kDigits[c.g >> 4], kDigits[c.g & 15], kDigits[c.b >> 4],
           kDigits[c.b & 15], '\0'}};
}
constexpr vocabulary::Rgb kindFill(tracedb::SpanKind kind) {
  return vocabulary::kSpanKindColours[static_cast<size_t>(kind)].fill;
}

// The timeline's colour table: tracedb::kSpanKindCount kinds, then one per coloured collective op (CollectiveOp
// order).
static_assert(vocabulary::kSpanKindColourCount == tracedb::kSpanKindCount, "one colour per span kind");
inline constexpr int kColourCount = tracedb::kSpanKindCount + static_cast<int>(vocabulary::kColouredOpCount);
std::string_view colour(int index);      // index < kColourCount
std::string_view colourName(int index);  // "compute", ..., "all_reduce", ...
// The colour index of a span: its op's for comm / nccl_kernel spans whose name mentions one (case-insensitive,
// "all_reduce", "ncclAllReduce..." alike; vocabulary::opMentionedIn), else its kind's.
int spanColour(tracedb::SpanKind kind, std::string_view name);

std::string_view severity(Severity severity);

// t in [0, 1] on viridis (vocabulary::heat, as the viewer's).
std::string heat(double t);

namespace detail {
inline constexpr Hex kNonFinite = hex(vocabulary::kNonFinite), kStuck = hex(vocabulary::kStuck),
                     kWaiting = hex(vocabulary::kWaiting), kCompute = hex(kindFill(tracedb::SpanKind::Compute)),
                     kComm = hex(kindFill(tracedb::SpanKind::Comm)), kData = hex(kindFill(tracedb::SpanKind::Data));
}  // namespace detail
inline constexpr std::string_view kNonFinite = detail::kNonFinite.view();
inline constexpr std::string_view kNoData = "#d9d9de";  // the page's light grey (the viewer's is dark)
inline constexpr std::string_view kStuck = detail::kStuck.view();
inline constexpr std::string_view kWaiting = detail::kWaiting.view();

// Breakdown shares, in the colours of the span kinds they are made of (other: the data kind's).
inline constexpr std::string_view kCompute = detail::kCompute.view();
inline constexpr std::string_view kExposedComm = detail::kComm.view();
inline constexpr std::string_view kOther = detail::kData.view();
inline constexpr std::string_view kIdle = "#c8c8d0";

}  // namespace tpscope::report::html::palette
