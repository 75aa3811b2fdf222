#include "html/palette.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

namespace tpscope::report::html::palette {

namespace {

constexpr std::array<std::string_view, kColourCount> kColours = {
    "#4285f4",  // compute
    "#ea4335",  // comm
    "#8e6ec8",  // data
    "#34a853",  // optimizer
    "#5a606e",  // step
    "#a07850",  // checkpoint
    "#00acc1",  // kernel
    "#ffa726",  // memcpy
    "#ffcc80",  // memset
    "#ef6c00",  // nccl_kernel
    "#78909c",  // other
    "#bdbdbd",  // wait
    "#e53935",  // all_reduce
    "#ec407a",  // all_gather
    "#ff7043",  // reduce_scatter
    "#ab47bc",  // broadcast
    "#8d6e63",  // barrier
    "#ff8a65",  // all_to_all
};

// Name fragments that identify an op, lower-case, with and without the underscore (NCCL kernel names).
constexpr std::array<std::array<std::string_view, 2>, kOps.size()> kOpNames = {{{"all_reduce", "allreduce"},
                                                                                 {"all_gather", "allgather"},
                                                                                 {"reduce_scatter", "reducescatter"},
                                                                                 {"broadcast", "broadcast"},
                                                                                 {"barrier", "barrier"},
                                                                                 {"all_to_all", "alltoall"}}};

}  // namespace

std::string_view colour(int index) { return kColours[static_cast<size_t>(std::clamp(index, 0, kColourCount - 1))]; }

std::string_view colourName(int index) {
  if (index >= tracedb::kSpanKindCount && index < kColourCount) return kOps[index - tracedb::kSpanKindCount];
  return tracedb::spanKindName(static_cast<tracedb::SpanKind>(std::clamp(index, 0, tracedb::kSpanKindCount - 1)));
}

int spanColour(tracedb::SpanKind kind, std::string_view name) {
  if (kind == tracedb::SpanKind::Comm || kind == tracedb::SpanKind::NcclKernel) {
    std::string lower(name);
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    // reduce_scatter before all_reduce: "reducescatter" must not be read as a reduce.
    for (size_t op : {size_t{2}, size_t{1}, size_t{0}, size_t{3}, size_t{4}, size_t{5}})
      for (std::string_view fragment : kOpNames[op])
        if (lower.find(fragment) != std::string::npos) return tracedb::kSpanKindCount + static_cast<int>(op);
  }
  return static_cast<int>(kind);
}

std::string_view severity(Severity s) {
  switch (s) {
    case Severity::Critical: return "#d32f2f";
    case Severity::Error: return "#f57c00";
    case Severity::Warning: return "#fbc02d";
    case Severity::Info: break;
  }
  return "#64a0dc";
}

std::string heat(double t) {
  static constexpr std::array<std::array<int, 3>, 5> kStops = {
      {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}}};
  if (!std::isfinite(t)) return std::string(kNonFinite);
  t = std::clamp(t, 0.0, 1.0) * (kStops.size() - 1);
  const size_t i = std::min<size_t>(static_cast<size_t>(t), kStops.size() - 2);
  const double f = t - static_cast<double>(i);
  char buf[8];
  auto mix = [&](int c) { return static_cast<int>(std::lround(kStops[i][c] + f * (kStops[i + 1][c] - kStops[i][c]))); };
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", mix(0), mix(1), mix(2));
  return buf;
}

}  // namespace tpscope::report::html::palette
