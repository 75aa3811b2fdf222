// TimelinePainter (timeline_view.h): one frame of the timeline drawn from its layout and the frame's level of detail:
// spans, collectives, ruler, lane labels, group headers, selection, measured range and finding marks.
#include <QPainter>
#include <algorithm>
#include <array>
#include <cmath>
#include <set>

#include "timeline_view.h"
#include "tpscope/gui/palette.h"

namespace tpscope::gui {

QString formatDuration(double ns) {
  const double a = std::abs(ns);
  if (a >= 1e9) return QString::number(ns / 1e9, 'f', 3) + " s";
  if (a >= 1e6) return QString::number(ns / 1e6, 'f', 3) + " ms";
  if (a >= 1e3) return QString::number(ns / 1e3, 'f', 2) + " µs";
  return QString::number(ns, 'f', 0) + " ns";
}

namespace {

// A "nice" tick step (1, 2, 5 × 10^k ns) at least minNs.
double tickStep(double minNs) {
  double step = 1;
  while (step < minNs) {
    if (step * 2 >= minNs) return step * 2;
    if (step * 5 >= minNs) return step * 5;
    step *= 10;
  }
  return step;
}

}  // namespace

int TimelinePainter::laneY(int lane) const {
  return TimelineLayout::kRulerHeight + layout->laneTop[lane] - scrollY;
}

int TimelinePainter::laneOn(int rank, int thread) const {
  const TimelineData& t = *run->timeline;
  int lane = t.laneOf(rank, thread);
  if (lane < 0)
    for (size_t i = 0; i < t.lanes().size() && lane < 0; ++i)
      if (t.lanes()[i].rank == rank) lane = static_cast<int>(i);
  return lane;
}

QRectF TimelinePainter::criticalRect(const analysis::WhatIfSegment& s) const {
  const int lane = run && run->timeline ? laneOn(s.rank, s.thread) : -1;
  if (lane < 0 || layout->laneHeight[lane] == 0) return {};
  const double x0 = xOf(s.startNs), x1 = std::max(x0 + 2, xOf(s.endNs));
  return QRectF(x0, laneY(lane), x1 - x0, layout->laneHeight[lane] - TimelineLayout::kLaneGap);
}

// Each stretch outlined on its lane (transfers dashed), joined to the one before by a line from its end to the next
// one's start, so the chain reads across the ranks it runs through.
void TimelinePainter::paintCriticalPath(QPainter& p) const {
  if (!criticalPath || criticalPath->empty()) return;
  QColor fill = palette::kCriticalPath;
  fill.setAlpha(45);
  QPointF previous;  // the end of the stretch before, when `joined`
  bool joined = false;
  for (const analysis::WhatIfSegment& s : *criticalPath) {
    const QRectF r = criticalRect(s);
    if (r.isEmpty()) {
      joined = false;
      continue;
    }
    const QPointF start(r.left(), r.center().y());
    if (joined && std::abs(previous.y() - start.y()) > 1) {
      p.setPen(QPen(palette::kCriticalPath, 1.5));
      p.drawLine(previous, start);
    }
    previous = QPointF(r.right(), r.center().y());
    joined = true;
    p.fillRect(r, fill);
    p.setPen(QPen(palette::kCriticalPath, 2, s.kind == "transfer" ? Qt::DashLine : Qt::SolidLine));
    p.setBrush(Qt::NoBrush);
    p.drawRect(r);
  }
}

void TimelinePainter::paint(QPainter& p, const QSize& size, const Frame* frame) const {
  p.fillRect(QRect(QPoint(0, 0), size), palette::kBackground);
  p.setPen(palette::kText);
  if (!run || !run->timeline || run->timeline->lanes().empty()) {
    p.drawText(QRect(QPoint(0, 0), size), Qt::AlignCenter,
               run ? QString("This run has no spans.") : QString("Open a run: File → Open, or drop a run file here."));
    return;
  }
  const int width = size.width();
  const int top = TimelineLayout::kRulerHeight;
  QFont small = p.font();
  small.setPointSizeF(std::max(6.0, small.pointSizeF() - 1.5));
  p.setFont(small);

  p.save();
  p.setClipRect(QRect(TimelineLayout::kLabelWidth, top, width - TimelineLayout::kLabelWidth, size.height() - top));
  paintSpans(p, size, frame);
  paintSelection(p);
  paintCollectives(p, size);
  paintCriticalPath(p);
  paintRange(p, size);
  p.restore();
  paintLaneLabels(p, size);
  paintGroupHeaders(p, size);
  paintRuler(p, size);
  paintFindingMarks(p);
}

QPointF TimelinePainter::markPoint(const FindingMark& m) const {
  const double x = xOf(m.timeNs);
  if (m.rank >= 0 && run && run->timeline && layout) {
    const auto& lanes = run->timeline->lanes();
    for (size_t l = 0; l < lanes.size(); ++l)
      if (lanes[l].rank == m.rank) return {x, static_cast<double>(laneY(static_cast<int>(l)))};
  }
  return {x, static_cast<double>(TimelineLayout::kRulerHeight)};  // the whole run, or a rank without a lane
}

// Every finding's place: a downward triangle in its severity's colour whose tip is at (time, top of the rank's first
// lane), its kind beside it for warnings and worse.
void TimelinePainter::paintFindingMarks(QPainter& p) const {
  if (!findingMarks) return;
  for (const auto& m : *findingMarks) {
    const QPointF tip = markPoint(m);
    if (tip.x() < TimelineLayout::kLabelWidth || tip.y() < TimelineLayout::kRulerHeight) continue;
    const QColor c = palette::severity(m.severity);
    const QPointF tri[3] = {tip, tip + QPointF(-6, -9), tip + QPointF(6, -9)};
    p.setPen(QPen(Qt::black, 1));
    p.setBrush(c);
    p.drawPolygon(tri, 3);
    if (m.severity <= 2) {
      p.setPen(c);
      p.drawText(QPointF(tip.x() + 8, tip.y() - 1), m.label);
    }
  }
  p.setBrush(Qt::NoBrush);
}

// The lanes' background and the frame's spans (clipped to the timeline area by the caller).
void TimelinePainter::paintSpans(QPainter& p, const QSize& size, const Frame* frame) const {
  const TimelineData& t = frame ? frame->source(*run->timeline) : *run->timeline;
  const int width = size.width();
  const int top = TimelineLayout::kRulerHeight;
  const QFontMetrics fm(p.font());
  // Spans are batched by colour and drawn with one drawRects() per colour (the raster engine's fast path); labels
  // follow on top.
  std::vector<std::pair<QRgb, std::vector<QRect>>> batches;
  auto batchFor = [&](QRgb rgb) -> std::vector<QRect>& {
    for (auto& b : batches)
      if (b.first == rgb) return b.second;
    batches.emplace_back(rgb, std::vector<QRect>{});
    return batches.back().second;
  };
  struct Label {
    QRect rect;
    uint32_t name;
    bool dark;
  };
  std::vector<Label> labels;
  std::array<QRgb, kKindCount> kindRgb{}, blockRgb{};  // a kind's colour, and darker for a block of several spans
  for (int k = 0; k < kKindCount; ++k) {
    kindRgb[k] = palette::kind(k).rgb();
    blockRgb[k] = palette::kind(k).darker(125).rgb();
  }
  for (size_t l = 0; l < t.lanes().size(); ++l) {
    const int y0 = laneY(static_cast<int>(l));
    const int h = layout->laneHeight[l];
    if (h == 0 || y0 + h < top || y0 > size.height()) continue;  // collapsed, or off screen
    if (l % 2) p.fillRect(QRect(0, y0, width, h), palette::kLaneAlt);
    if (!frame || l >= frame->items.size()) continue;
    const Lane& lane = t.lanes()[l];
    for (size_t d = 0; d < frame->items[l].size(); ++d) {
      const LaneRow& r = lane.rows[d];
      const int ry = y0 + static_cast<int>(d) * TimelineLayout::kRowHeight + 1;
      const int rh = TimelineLayout::kRowHeight - 2;
      QRgb lastRgb = 0;
      std::vector<QRect>* batch = nullptr;
      for (const DrawItem& it : frame->items[l][d]) {
        const double fx0 = xOf(it.beginNs), fx1 = xOf(it.endNs);
        if (fx1 < TimelineLayout::kLabelWidth || fx0 > width) continue;
        const int x0 = static_cast<int>(std::max(fx0, TimelineLayout::kLabelWidth - 2.0));
        const int x1 = static_cast<int>(std::min(fx1, width + 2.0));
        const int w = std::max(1, x1 - x0);
        QRgb rgb;
        if (it.merged) {
          rgb = it.count > 1 ? blockRgb[it.kind % kKindCount] : kindRgb[it.kind % kKindCount];
        } else {
          const uint32_t name = r.name[it.first];
          rgb = nameColours && name < nameColours->size() && (*nameColours)[name].isValid()
                    ? (*nameColours)[name].rgb()
                    : kindRgb[it.kind % kKindCount];
        }
        if (!batch || rgb != lastRgb) {
          batch = &batchFor(rgb);
          lastRgb = rgb;
        } else if ((it.merged || w <= 36) && !batch->empty() && batch->back().top() == ry &&
                   x0 <= batch->back().right() + 1) {
          // The same colour touching the previous rectangle of this row: one wider rectangle, so a zoomed-out row
          // costs a rectangle per run of pixels, not per item.
          batch->back().setRight(std::max(batch->back().right(), x0 + w - 1));
          continue;
        }
        batch->emplace_back(x0, ry, w, rh);
        if (!it.merged && w > 36)
          labels.push_back({QRect(x0, ry, w, rh), r.name[it.first], QColor::fromRgb(rgb).lightness() > 150});
      }
    }
  }
  p.setPen(Qt::NoPen);
  for (const auto& [rgb, rects] : batches) {
    p.setBrush(QColor::fromRgb(rgb));
    p.drawRects(rects.data(), static_cast<int>(rects.size()));
  }
  for (const Label& label : labels) {
    const QString text = nameTexts && label.name < nameTexts->size() ? (*nameTexts)[label.name]
                                                                      : QString::fromStdString(t.string(label.name));
    p.setPen(label.dark ? Qt::black : Qt::white);
    const int room = label.rect.width() - 6;
    p.drawText(label.rect.adjusted(3, 0, -3, 0), Qt::AlignVCenter | Qt::AlignLeft,
               fm.horizontalAdvance(text) <= room ? text : fm.elidedText(text, Qt::ElideRight, room));
  }
  p.setBrush(Qt::NoBrush);
}

// The selected span, outlined.
void TimelinePainter::paintSelection(QPainter& p) const {
  const TimelineData& t = selectedIn ? *selectedIn : *run->timeline;
  if (t.contains(selectedSpan) && layout->laneHeight[selectedSpan.lane] > 0) {
    const LaneRow& r = t.row(selectedSpan);
    const int y = laneY(selectedSpan.lane) + selectedSpan.row * TimelineLayout::kRowHeight;
    const double x0 = xOf(r.begin[selectedSpan.index]);
    const double x1 = std::max(x0 + 2, xOf(r.end[selectedSpan.index]));
    p.setPen(QPen(Qt::white, 2));
    p.setBrush(Qt::NoBrush);
    p.drawRect(QRectF(x0, y, x1 - x0, TimelineLayout::kRowHeight));
  }
}

// The measured time range, shaded, with its duration.
void TimelinePainter::paintRange(QPainter& p, const QSize& size) const {
  const int top = TimelineLayout::kRulerHeight;
  if (range) {
    const double x0 = xOf(range->first), x1 = xOf(range->second);
    p.fillRect(QRectF(x0, top, x1 - x0, size.height() - top), palette::kSelection);
    p.setPen(QPen(palette::kSelection.lighter(250), 1));
    p.drawLine(QPointF(x0, top), QPointF(x0, size.height()));
    p.drawLine(QPointF(x1, top), QPointF(x1, size.height()));
    const QString text = formatDuration(static_cast<double>(range->second - range->first));
    const QRectF box(x0 + (x1 - x0) / 2 - 50, top + 4, 100, 18);
    p.fillRect(box, QColor(20, 20, 24, 220));
    p.setPen(Qt::white);
    p.drawText(box, Qt::AlignCenter, text);
  }
}

// The lane labels, left of the timeline.
void TimelinePainter::paintLaneLabels(QPainter& p, const QSize& size) const {
  const TimelineData& t = *run->timeline;
  const int width = size.width();
  const int top = TimelineLayout::kRulerHeight;
  p.fillRect(QRect(0, top, TimelineLayout::kLabelWidth, size.height() - top), QColor(24, 25, 29));
  p.setPen(palette::kText);
  for (size_t l = 0; l < t.lanes().size(); ++l) {
    const int y0 = laneY(static_cast<int>(l));
    if (layout->laneHeight[l] == 0 || y0 + layout->laneHeight[l] < top || y0 > size.height()) continue;
    p.drawText(QRect(6, y0, TimelineLayout::kLabelWidth - 8, TimelineLayout::kRowHeight), Qt::AlignVCenter,
               QString::fromStdString(t.lanes()[l].label));
    p.setPen(QColor(60, 62, 70));
    p.drawLine(0, y0 + layout->laneHeight[l] - 1, width, y0 + layout->laneHeight[l] - 1);
    p.setPen(palette::kText);
  }
}

// Each lane group's header across the whole width: ▸ collapsed (with how many lanes it hides) or ▾ expanded.
void TimelinePainter::paintGroupHeaders(QPainter& p, const QSize& size) const {
  const int top = TimelineLayout::kRulerHeight;
  for (const LaneGroup& g : layout->groups) {
    const int y = top + g.top - scrollY;
    if (y + TimelineLayout::kGroupHeight < top || y > size.height()) continue;
    const QRect band(0, y, size.width(), TimelineLayout::kGroupHeight);
    p.fillRect(band, QColor(38, 41, 50));
    p.setPen(QColor(70, 74, 86));
    p.drawLine(band.bottomLeft(), band.bottomRight());
    p.setPen(palette::kText);
    QString text = QString::fromUtf8(g.collapsed ? "\u25B8 " : "\u25BE ") + QString::fromStdString(g.label);
    if (g.collapsed) text += QString(" · %1 lanes").arg(g.lastLane - g.firstLane);
    p.drawText(band.adjusted(6, 0, -6, 0), Qt::AlignVCenter | Qt::AlignLeft, text);
  }
}

void TimelinePainter::paintRuler(QPainter& p, const QSize& size) const {
  const int h = TimelineLayout::kRulerHeight;
  p.fillRect(QRect(0, 0, size.width(), h), QColor(22, 23, 27));
  p.setPen(QColor(90, 92, 100));
  p.drawLine(0, h - 1, size.width(), h - 1);
  const double step = tickStep(90 * viewport.nsPerPx);
  const qint64 origin = run->beginNs;
  const double first = std::ceil((viewport.startNs - origin) / step) * step;
  p.setPen(palette::kText);
  for (double rel = first; origin + rel < viewport.endNs(); rel += step) {
    const double x = xOf(origin + static_cast<qint64>(rel));
    if (x < TimelineLayout::kLabelWidth) continue;
    p.drawLine(QPointF(x, h - 8), QPointF(x, h - 1));
    p.drawText(QPointF(x + 3, h - 10), formatDuration(rel));
  }
  p.drawText(QRect(6, 0, TimelineLayout::kLabelWidth - 8, h), Qt::AlignVCenter,
             QString("%1 / px").arg(formatDuration(viewport.nsPerPx)));
}

void TimelinePainter::paintCollectives(QPainter& p, const QSize& size) const {
  const int right = size.width() + 2;
  auto band = [&](const tracedb::CollectiveRow& c, qint64 end) -> QRectF {
    const int lane = laneOfRecord(c);
    if (lane < 0 || layout->laneHeight[lane] == 0) return {};
    const double x0 = xOf(c.enqueueNs);
    const double x1 = std::min<double>(std::max(x0 + 3, xOf(end)), right);
    return QRectF(x0, laneY(lane) + 1, x1 - x0, layout->laneHeight[lane] - TimelineLayout::kLaneGap - 2);
  };
  if (stuck) {
    QColor fill = palette::kStuck;
    fill.setAlpha(70);
    for (const auto* c : *stuck) {
      const QRectF r = band(*c, run->endNs);
      if (r.isEmpty()) continue;
      p.fillRect(r, fill);
      p.setPen(QPen(palette::kStuck, 2));
      p.setBrush(Qt::NoBrush);
      p.drawRect(r);
      p.setPen(Qt::white);
      p.drawText(r.adjusted(4, 0, 0, 0), Qt::AlignVCenter | Qt::AlignLeft,
                 QString("stuck: %1 #%2 %3").arg(QString::fromStdString(c->group)).arg(c->seq)
                     .arg(QString::fromStdString(c->op)));
    }
  }
  if (missing) {
    for (const auto& m : *missing) {
      const TimelineData& t = *run->timeline;
      for (size_t l = 0; l < t.lanes().size(); ++l) {
        if (t.lanes()[l].rank != m.rank) continue;
        if (layout->laneHeight[l] == 0) break;  // in a collapsed group
        const double x = xOf(m.timeNs);
        const int y0 = laneY(static_cast<int>(l));
        const int h = layout->laneHeight[l] - TimelineLayout::kLaneGap;
        p.setPen(QPen(palette::kStuck, 2, Qt::DashLine));
        p.drawLine(QPointF(x, y0), QPointF(x, y0 + h));
        const QRectF box(x + 4, y0 + h - TimelineLayout::kRowHeight, p.fontMetrics().horizontalAdvance(m.label) + 8,
                         TimelineLayout::kRowHeight - 1);
        p.fillRect(box, QColor(20, 20, 24, 230));
        p.setPen(palette::kStuck.lighter(150));
        p.drawText(box, Qt::AlignCenter, m.label);
        break;  // the rank's first lane
      }
    }
  }
  if (selected && !selected->empty()) {
    QColor fill = palette::kHighlight;
    fill.setAlpha(90);
    std::vector<std::pair<QPointF, QPointF>> ends;  // (arrival, completion) per record, in lane order
    for (const auto* c : *selected) {
      const QRectF r = band(*c, c->endNs.value_or(run->endNs));
      if (r.isEmpty()) continue;
      p.fillRect(r, fill);
      // A record that never completed keeps its red outline while selected.
      p.setPen(QPen(c->endNs ? palette::kHighlight : palette::kStuck, 2));
      p.setBrush(Qt::NoBrush);
      p.drawRect(r);
      ends.push_back({QPointF(r.left(), r.center().y()), QPointF(r.right(), r.center().y())});
    }
    std::sort(ends.begin(), ends.end(), [](const auto& a, const auto& b) { return a.first.y() < b.first.y(); });
    // Flows: arrivals joined rank to rank (the slant is the skew), completions likewise.
    p.setPen(QPen(palette::kHighlight, 1.5));
    for (size_t i = 1; i < ends.size(); ++i) {
      p.drawLine(ends[i - 1].first, ends[i].first);
      p.drawLine(ends[i - 1].second, ends[i].second);
    }
    p.setBrush(palette::kHighlight);
    for (const auto& e : ends) {
      p.drawEllipse(e.first, 3, 3);
      p.drawEllipse(e.second, 3, 3);
    }
  }
}

}  // namespace tpscope::gui
