#include "html/palette.h"

#include <algorithm>

namespace tpscope::report::html::palette {

namespace {

constexpr std::array<Hex, kColourCount> kColours = [] {
  std::array<Hex, kColourCount> out{};
  for (size_t k = 0; k < vocabulary::kSpanKindColourCount; ++k) out[k] = hex(vocabulary::kSpanKindColours[k].fill);
  for (size_t o = 0; o < vocabulary::kColouredOpCount; ++o)
    out[vocabulary::kSpanKindColourCount + o] = hex(vocabulary::kOpColours[o].fill);
  return out;
}();

constexpr std::array<Hex, vocabulary::kSeverityColours.size()> kSeverities = [] {
  std::array<Hex, vocabulary::kSeverityColours.size()> out{};
  for (size_t s = 0; s < out.size(); ++s) out[s] = hex(vocabulary::kSeverityColours[s].fill);
  return out;
}();

}  // namespace

std::string_view colour(int index) {
  return kColours[static_cast<size_t>(std::clamp(index, 0, kColourCount - 1))].view();
}

std::string_view colourName(int index) {
  if (index >= tracedb::kSpanKindCount && index < kColourCount)
    return vocabulary::opName(static_cast<vocabulary::CollectiveOp>(index - tracedb::kSpanKindCount));
  return tracedb::spanKindName(static_cast<tracedb::SpanKind>(std::clamp(index, 0, tracedb::kSpanKindCount - 1)));
}

int spanColour(tracedb::SpanKind kind, std::string_view name) {
  if (kind == tracedb::SpanKind::Comm || kind == tracedb::SpanKind::NcclKernel)
    if (const auto op = vocabulary::opMentionedIn(name); op != vocabulary::CollectiveOp::Unknown)
      return tracedb::kSpanKindCount + static_cast<int>(op);
  return static_cast<int>(kind);
}

std::string_view severity(Severity s) {
  const auto i = static_cast<size_t>(s);
  return kSeverities[std::min(i, kSeverities.size() - 1)].view();
}

std::string heat(double t) { return std::string(hex(vocabulary::heat(t)).view()); }

}  // namespace tpscope::report::html::palette
