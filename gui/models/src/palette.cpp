#include "tpscope/gui/palette.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace tpscope::gui::palette {

QColor kind(int kind) {
  static const std::array<QColor, 12> kColors = {
      QColor(66, 133, 244),   // compute
      QColor(234, 67, 53),    // comm
      QColor(142, 110, 200),  // data
      QColor(52, 168, 83),    // optimizer
      QColor(90, 96, 110),    // step
      QColor(160, 120, 80),   // checkpoint
      QColor(0, 172, 193),    // kernel
      QColor(255, 167, 38),   // memcpy
      QColor(255, 204, 128),  // memset
      QColor(239, 108, 0),    // nccl_kernel
      QColor(120, 144, 156),  // other
      QColor(189, 189, 189),  // wait
  };
  return kind >= 0 && kind < static_cast<int>(kColors.size()) ? kColors[kind] : kColors[10];
}

QColor collectiveOp(const QString& nameOrOp) {
  const QString n = nameOrOp.toLower();
  if (n.contains("reduce_scatter") || n.contains("reducescatter")) return {255, 112, 67};
  if (n.contains("all_gather") || n.contains("allgather")) return {236, 64, 122};
  if (n.contains("all_reduce") || n.contains("allreduce")) return {229, 57, 53};
  if (n.contains("broadcast")) return {171, 71, 188};
  if (n.contains("barrier")) return {141, 110, 99};
  if (n.contains("all_to_all") || n.contains("alltoall")) return {255, 138, 101};
  return {};
}

QColor span(int k, const QString& name) {
  if (k == 1 || k == 9) {
    const QColor op = collectiveOp(name);
    if (op.isValid()) return k == 9 ? op.darker(115) : op;
  }
  return kind(k);
}

QColor severity(int s) {
  switch (s) {
    case 0: return {211, 47, 47};
    case 1: return {245, 124, 0};
    case 2: return {251, 192, 45};
    default: return {100, 160, 220};
  }
}

QColor heat(double t) {
  // Piecewise-linear approximation of viridis.
  static const std::array<std::array<int, 3>, 5> kStops = {
      {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}}};
  if (!std::isfinite(t)) return kNonFinite;
  t = std::clamp(t, 0.0, 1.0) * (kStops.size() - 1);
  const size_t i = std::min<size_t>(static_cast<size_t>(t), kStops.size() - 2);
  const double f = t - i;
  auto mix = [&](int c) { return static_cast<int>(std::lround(kStops[i][c] + f * (kStops[i + 1][c] - kStops[i][c]))); };
  return {mix(0), mix(1), mix(2)};
}

}  // namespace tpscope::gui::palette
