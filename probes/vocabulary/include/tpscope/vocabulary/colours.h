// The colours tpscope draws with, one table for the viewer (gui/models palette, Qt) and the HTML report
// (probes/report html/palette, CSS): span kinds in span-kind order (probes::SpanKind, tracedb::SpanKind), then the
// collective ops that have their own colour (collective_ops.h, CollectiveOp order), the severities most severe first
// (severity.h), the heatmap ramp and the marks. Each fill comes with the text colour that reads on it: light text
// on dark fills, dark text on light ones. Header-only and dependency-free (the vocabulary's rule).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "tpscope/vocabulary/collective_ops.h"

namespace tpscope::vocabulary {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
};

inline constexpr Rgb kLightText{255, 255, 255};
inline constexpr Rgb kDarkText{0, 0, 0};

// Light text where the fill is darker than the middle grey (Rec. 709 luma below 140 of 255), else dark text.
constexpr Rgb textOn(Rgb fill) {
  return 2126 * fill.r + 7152 * fill.g + 722 * fill.b < 140 * 10000 ? kLightText : kDarkText;
}

struct Swatch {
  Rgb fill;
  Rgb text;
};
constexpr Swatch swatch(Rgb fill) { return {fill, textOn(fill)}; }

// Span kinds, in span-kind order (compute = 0 ... wait = 11).
inline constexpr size_t kSpanKindColourCount = 12;
inline constexpr std::array<Swatch, kSpanKindColourCount> kSpanKindColours = {
    swatch({66, 133, 244}),   // compute
    swatch({234, 67, 53}),    // comm
    swatch({142, 110, 200}),  // data
    swatch({52, 168, 83}),    // optimizer
    swatch({90, 96, 110}),    // step
    swatch({160, 120, 80}),   // checkpoint
    swatch({0, 172, 193}),    // kernel
    swatch({255, 167, 38}),   // memcpy
    swatch({255, 204, 128}),  // memset
    swatch({239, 108, 0}),    // nccl_kernel
    swatch({120, 144, 156}),  // other
    swatch({189, 189, 189}),  // wait
};
inline constexpr size_t kOtherSpanKind = 10;  // the colour of a kind this table does not know

// Communication spans by the op their name mentions (opMentionedIn), in CollectiveOp order.
inline constexpr std::array<Swatch, kColouredOpCount> kOpColours = {
    swatch({229, 57, 53}),    // all_reduce
    swatch({236, 64, 122}),   // all_gather
    swatch({255, 112, 67}),   // reduce_scatter
    swatch({171, 71, 188}),   // broadcast
    swatch({141, 110, 99}),   // barrier
    swatch({255, 138, 101}),  // all_to_all
};

// Severities, in Severity order: critical, error, warning, info.
inline constexpr std::array<Swatch, 4> kSeverityColours = {
    swatch({211, 47, 47}), swatch({245, 124, 0}), swatch({251, 192, 45}), swatch({100, 160, 220})};

// The gradient heatmap's ramp: a piecewise-linear viridis, t = 0 at the first stop, 1 at the last.
inline constexpr std::array<Rgb, 5> kHeatStops = {
    {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}}};

inline constexpr Rgb kNonFinite{230, 0, 126};  // magenta: NaN / Inf cells

// t in [0, 1] on the ramp (clamped); a non-finite t is kNonFinite.
inline Rgb heat(double t) {
  if (!std::isfinite(t)) return kNonFinite;
  t = std::clamp(t, 0.0, 1.0) * (kHeatStops.size() - 1);
  const size_t i = std::min<size_t>(static_cast<size_t>(t), kHeatStops.size() - 2);
  const double f = t - static_cast<double>(i);
  auto mix = [&](uint8_t a, uint8_t b) { return static_cast<uint8_t>(std::lround(a + f * (b - a))); };
  const Rgb &lo = kHeatStops[i], &hi = kHeatStops[i + 1];
  return {mix(lo.r, hi.r), mix(lo.g, hi.g), mix(lo.b, hi.b)};
}
inline constexpr Rgb kStuck{220, 30, 30};      // a stuck collective, a missing rank
inline constexpr Rgb kWaiting{245, 160, 30};   // entered the stuck collective, never completed

}  // namespace tpscope::vocabulary
