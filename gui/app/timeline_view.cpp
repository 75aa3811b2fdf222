#include "timeline_view.h"

#include <QApplication>
#include <QElapsedTimer>
#include <QHelpEvent>
#include <QKeyEvent>
#include <QPainter>
#include <QThread>
#include <QToolTip>
#include <QWheelEvent>
#include <algorithm>
#include <array>
#include <set>
#include <cmath>

#include "tpscope/gui/findings_model.h"
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

// ---------------------------------------------------------------------------------------------------------------
// Layout

std::vector<LaneGroup> laneGroups(const RunData& run) {
  if (!run.timeline) return {};
  const auto& lanes = run.timeline->lanes();
  // A key per lane: its rank's TP group, or its rank's host.
  auto keysBy = [&](auto keyOfRank) {
    std::vector<std::string> keys;
    for (const Lane& lane : lanes) keys.push_back(keyOfRank(lane.rank));
    return keys;
  };
  std::map<int, std::string> tpOf, hostOf;
  for (const auto& g : run.groups)
    if (g.name.rfind("tp-", 0) == 0)
      for (int r : g.ranks) tpOf[r] = g.name;
  for (const auto& r : run.ranks)
    if (!r.host.empty()) hostOf[r.rank] = r.host;
  auto grouped = [&](const std::vector<std::string>& keys) -> std::vector<LaneGroup> {
    std::vector<LaneGroup> out;
    std::set<std::string> seen;
    for (size_t l = 0; l < keys.size(); ++l) {
      if (keys[l].empty()) return {};
      if (!out.empty() && keys[l] == keys[out.back().firstLane]) {
        out.back().lastLane = static_cast<int>(l) + 1;
        continue;
      }
      if (!seen.insert(keys[l]).second) return {};  // a group's lanes are not consecutive
      out.push_back({keys[l], static_cast<int>(l), static_cast<int>(l) + 1, false, 0});
    }
    if (out.size() < 2) return {};
    for (LaneGroup& g : out) {
      const int a = lanes[g.firstLane].rank, b = lanes[g.lastLane - 1].rank;
      g.label += a == b ? " · rank " + std::to_string(a) : " · ranks " + std::to_string(a) + "–" + std::to_string(b);
    }
    return out;
  };
  auto groups = grouped(keysBy([&](int rank) { return tpOf.count(rank) ? tpOf[rank] : std::string(); }));
  if (groups.empty()) groups = grouped(keysBy([&](int rank) { return hostOf.count(rank) ? hostOf[rank] : ""; }));
  return groups;
}

void TimelineLayout::build(const TimelineData& timeline, std::vector<LaneGroup> laneGroups) {
  laneTop.clear();
  laneHeight.clear();
  groups = std::move(laneGroups);
  int y = 0;
  size_t g = 0;
  for (size_t l = 0; l < timeline.lanes().size(); ++l) {
    bool hidden = false;
    if (g < groups.size() && static_cast<int>(l) == groups[g].firstLane) {
      groups[g].top = y;
      y += kGroupHeight;
    }
    if (g < groups.size() && static_cast<int>(l) >= groups[g].firstLane && static_cast<int>(l) < groups[g].lastLane) {
      hidden = groups[g].collapsed;
      if (static_cast<int>(l) + 1 == groups[g].lastLane) ++g;
    }
    const int h =
        hidden ? 0 : std::max<int>(1, static_cast<int>(timeline.lanes()[l].rows.size())) * kRowHeight + kLaneGap;
    laneTop.push_back(y);
    laneHeight.push_back(h);
    y += h;
  }
  totalHeight = y;
}

int TimelineLayout::groupAt(int contentY) const {
  for (size_t g = 0; g < groups.size(); ++g)
    if (contentY >= groups[g].top && contentY < groups[g].top + kGroupHeight) return static_cast<int>(g);
  return -1;
}

int TimelineLayout::laneAt(int contentY) const {
  auto it = std::upper_bound(laneTop.begin(), laneTop.end(), contentY);
  if (it == laneTop.begin()) return -1;
  const int lane = static_cast<int>(it - laneTop.begin()) - 1;
  return contentY < laneTop[lane] + laneHeight[lane] ? lane : -1;
}

int TimelineLayout::laneFrom(int contentY) const {
  auto it = std::upper_bound(laneTop.begin(), laneTop.end(), contentY);
  return std::max(0, static_cast<int>(it - laneTop.begin()) - 1);
}

// ---------------------------------------------------------------------------------------------------------------
// Painter

int TimelinePainter::laneY(int lane) const {
  return TimelineLayout::kRulerHeight + layout->laneTop[lane] - scrollY;
}

int TimelinePainter::laneOfRecord(const tracedb::CollectiveRow& c) const {
  const TimelineData& t = *run->timeline;
  int lane = t.laneOf(c.rank, c.thread);
  if (lane < 0)
    for (size_t i = 0; i < t.lanes().size() && lane < 0; ++i)
      if (t.lanes()[i].rank == c.rank) lane = static_cast<int>(i);
  return lane;
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

// ---------------------------------------------------------------------------------------------------------------
// View

TimelineView::TimelineView(QWidget* parent) : QWidget(parent) {
  setFocusPolicy(Qt::StrongFocus);
  setMouseTracking(true);
  setMinimumSize(400, 200);
  setAttribute(Qt::WA_OpaquePaintEvent);
  vbar_ = new QScrollBar(Qt::Vertical, this);
  connect(vbar_, &QScrollBar::valueChanged, this, [this] {
    // A scroll past the lanes the last frame covers asks for the lanes now on screen.
    if (layout_.laneFrom(vbar_->value()) < coveredLanes_.first ||
        layout_.laneFrom(vbar_->value() + height()) >= coveredLanes_.second)
      requestFrame();
    else update();
  });
  connect(&scheduler_, &FrameScheduler::frameReady, this, [this] { update(); });
  windowTimer_.setSingleShot(true);
  windowTimer_.setInterval(150);
  connect(&windowTimer_, &QTimer::timeout, this, &TimelineView::loadWindowNow);
  windowPool_.setMaxThreadCount(1);
}

std::shared_ptr<const TimelineData> TimelineView::shown() const {
  if (!run_) return nullptr;
  const auto frame = scheduler_.latest();
  return frame && frame->window ? frame->window : run_->timeline;
}

void TimelineView::loadWindowNow() {
  if (!run_ || !run_->windowed || windowLoading_ || windowFailed_) return;
  const qint64 w = std::max<qint64>(1, viewport_.endNs() - viewport_.startNs);
  const qint64 from = viewport_.startNs - w, to = viewport_.endNs() + w;
  const auto& current = scheduler_.window();
  if (current && current->covers(viewport_.startNs - w / 2, viewport_.endNs() + w / 2)) return;
  if (run_->timeline->weightIn(from, to) > kWindowSpanBudget) return;  // zoomed out: the summary is the picture
  windowLoading_ = true;
  const quint64 generation = windowGeneration_;
  windowPool_.start([this, run = run_, from, to, generation] {
    auto window = loadWindow(*run, from, to, std::max(1, QThread::idealThreadCount()));
    std::shared_ptr<const TimelineData> data = window ? *window : nullptr;
    QMetaObject::invokeMethod(this, [this, data, generation] {
      windowLoading_ = false;
      if (generation != windowGeneration_) return;
      if (data) scheduler_.setWindow(data);
      else windowFailed_ = true;  // not again for this run
      requestFrame();  // drawn from the window now, or the next window if the view moved on meanwhile
    });
  });
}

int TimelineView::plotWidth() const {
  return std::max(1, width() - TimelineLayout::kLabelWidth - vbar_->sizeHint().width());
}

qint64 TimelineView::timeAt(double x) const {
  return viewport_.startNs + static_cast<qint64>((x - TimelineLayout::kLabelWidth) * viewport_.nsPerPx);
}

void TimelineView::setRun(RunPtr run, bool keepViewport) {
  run_ = std::move(run);
  nameColours_.clear();
  nameTexts_.clear();
  collectivesByRank_.clear();
  stuck_.clear();
  selected_.clear();
  missing_.clear();
  if (!keepViewport) {
    selectedSpan_ = {};
    selectedCollective_ = {};
    range_.reset();
  } else {
    selectedSpan_ = {};  // indices do not survive a reload
  }
  selectedIn_ = run_ ? run_->timeline : nullptr;
  ++windowGeneration_;  // a window being read belongs to the previous run
  windowFailed_ = false;
  if (run_ && run_->timeline) {
    const auto& strings = run_->timeline->strings();
    nameColours_.resize(strings.size());
    nameTexts_.resize(strings.size());
    for (size_t i = 0; i < strings.size(); ++i) {
      nameTexts_[i] = QString::fromStdString(strings[i]);
      nameColours_[i] = palette::collectiveOp(nameTexts_[i]);
    }
    for (const auto& c : run_->collectives) {
      collectivesByRank_[c.rank].push_back(&c);
      if (!c.endNs) stuck_.push_back(&c);
    }
    for (auto& [rank, list] : collectivesByRank_)
      std::sort(list.begin(), list.end(), [](const auto* a, const auto* b) { return a->enqueueNs < b->enqueueNs; });
    // Lane groups keep the state the user left them in; a new run with many lanes opens with all but the first
    // collapsed, so the first screen shows the shape of the job rather than 64 lanes of it.
    auto groups = laneGroups(*run_);
    if (!keepViewport) collapsed_.clear();
    const bool many = run_->timeline->lanes().size() > 64;
    for (size_t g = 0; g < groups.size(); ++g) {
      auto [it, added] = collapsed_.emplace(groups[g].label, many && g > 0);
      groups[g].collapsed = it->second;
    }
    layout_.build(*run_->timeline, std::move(groups));
  } else {
    layout_ = {};
  }
  scheduler_.setTimeline(run_ ? run_->timeline : nullptr);
  if (keepViewport && selectedCollective_.valid()) selectCollective(selectedCollective_);
  resizeEvent(nullptr);
  if (!keepViewport) zoomAll();
  else requestFrame();
}

void TimelineView::setAnalysis(AnalysisPtr analysis) {
  analysis_ = std::move(analysis);
  missing_.clear();
  findingMarks_.clear();
  if (analysis_ && run_) {
    for (const auto& f : analysis_->findings) {
      const std::string_view kind = analysis::findingKindName(f.kind);
      EvidenceTarget t = placeOf(kind, f.rank, f.step, f.layer, f.collective);
      placeInTime(t, *run_);
      if (!t.timeNs) continue;
      findingMarks_.push_back(
          {f.rank, *t.timeNs, static_cast<int>(f.severity), QString::fromStdString(std::string(kind))});
    }
  }
  if (analysis_ && run_) {
    for (const auto& g : analysis_->desync.groups) {
      if (!g.stuckSeq) continue;
      qint64 at = run_->endNs;
      for (const auto& r : g.stuckRecords) at = std::min<qint64>(at, r.enqueueNs);
      for (int rank : g.missingRanks)
        missing_.push_back({rank, at, QString("never entered %1 #%2").arg(QString::fromStdString(g.group))
                                          .arg(*g.stuckSeq)});
    }
  }
  update();
}

void TimelineView::zoomAll() {
  if (!run_) return;
  const qint64 extent = std::max<qint64>(1, run_->endNs - run_->beginNs);
  viewport_.widthPx = plotWidth();
  viewport_.nsPerPx = static_cast<double>(extent) * 1.02 / viewport_.widthPx;
  viewport_.startNs = run_->beginNs - static_cast<qint64>(extent * 0.01);
  requestFrame();
}

void TimelineView::toggleGroup(int group) {
  if (!run_ || group < 0 || group >= static_cast<int>(layout_.groups.size())) return;
  auto groups = layout_.groups;
  groups[group].collapsed = !groups[group].collapsed;
  collapsed_[groups[group].label] = groups[group].collapsed;
  layout_.build(*run_->timeline, std::move(groups));
  resizeEvent(nullptr);  // the scroll range follows the new height
  requestFrame();
}

void TimelineView::setGroupsCollapsed(bool collapsed) {
  if (!run_ || layout_.groups.empty()) return;
  auto groups = layout_.groups;
  for (auto& g : groups) collapsed_[g.label] = g.collapsed = collapsed;
  layout_.build(*run_->timeline, std::move(groups));
  resizeEvent(nullptr);
  requestFrame();
}

void TimelineView::revealLane(int lane) {
  for (size_t g = 0; g < layout_.groups.size(); ++g)
    if (lane >= layout_.groups[g].firstLane && lane < layout_.groups[g].lastLane && layout_.groups[g].collapsed)
      toggleGroup(static_cast<int>(g));
}

void TimelineView::showRange(qint64 beginNs, qint64 endNs, int rank) {
  if (!run_) return;
  const qint64 extent = std::max<qint64>(1000, endNs - beginNs);
  viewport_.widthPx = plotWidth();
  viewport_.nsPerPx = static_cast<double>(extent) * 1.1 / viewport_.widthPx;
  viewport_.startNs = beginNs - extent / 20;
  if (rank >= 0 && run_->timeline) {
    for (size_t l = 0; l < run_->timeline->lanes().size(); ++l)
      if (run_->timeline->lanes()[l].rank == rank) {
        revealLane(static_cast<int>(l));
        vbar_->setValue(layout_.laneTop[l] - (layout_.groups.empty() ? 0 : TimelineLayout::kGroupHeight));
        break;
      }
  }
  clampViewport();
  requestFrame();
}

void TimelineView::selectCollective(const CollectiveKey& key) {
  selectedCollective_ = key;
  selected_.clear();
  if (run_ && key.valid())
    for (const auto& c : run_->collectives)
      if (c.seq == key.seq && QString::fromStdString(c.group) == key.group) selected_.push_back(&c);
  update();
}

void TimelineView::selectSpan(const SpanRef& ref) {
  selectedSpan_ = run_ && run_->timeline->contains(ref) ? ref : SpanRef{};
  selectedIn_ = run_ ? run_->timeline : nullptr;
  if (selectedSpan_.valid()) {
    const LaneRow& r = run_->timeline->row(ref);
    const qint64 b = r.begin[ref.index], e = r.end[ref.index];
    if (b < viewport_.startNs || e > viewport_.endNs() || (e - b) / viewport_.nsPerPx < 4)
      showRange(b - (e - b) * 2, e + (e - b) * 2, -1);
    revealLane(ref.lane);
    const int top = layout_.laneTop[ref.lane];
    if (top < vbar_->value() || top > vbar_->value() + height() - 80) vbar_->setValue(top);
  }
  update();
}

void TimelineView::clampViewport() {
  viewport_.nsPerPx = std::clamp(viewport_.nsPerPx, 0.01, 1e12);
  if (!run_) return;
  const qint64 extent = std::max<qint64>(1, run_->endNs - run_->beginNs);
  const qint64 span = viewport_.endNs() - viewport_.startNs;
  viewport_.startNs = std::clamp<qint64>(viewport_.startNs, run_->beginNs - extent / 2 - span / 2,
                                         run_->endNs + extent / 2 - span / 2);
}

void TimelineView::requestFrame() {
  viewport_.widthPx = plotWidth();
  clampViewport();
  if (run_) {
    // Half a viewport of margin either side, so a pan shows spans at the edges before the next frame arrives.
    Viewport wide = viewport_;
    wide.startNs -= static_cast<qint64>(viewport_.widthPx / 2 * viewport_.nsPerPx);
    wide.widthPx = viewport_.widthPx * 2;
    // The lanes on screen, and a screen's height of them either side, so a scroll shows lanes before the next frame.
    const int screen = std::max(1, height() - TimelineLayout::kRulerHeight);
    wide.firstLane = layout_.laneFrom(vbar_->value() - screen);
    wide.lastLane = layout_.laneFrom(vbar_->value() + 2 * screen) + 1;
    coveredLanes_ = {wide.firstLane, wide.lastLane};
    scheduler_.request(wide);
    if (run_->windowed && !(scheduler_.window() && scheduler_.window()->covers(wide.startNs, wide.endNs())))
      windowTimer_.start();  // once the view settles
  }
  emit viewportChanged();
  update();
}

void TimelineView::waitForFrame() {
  requestFrame();
  if (windowTimer_.isActive()) {
    windowTimer_.stop();
    loadWindowNow();
  }
  QElapsedTimer timer;
  timer.start();
  while ((!scheduler_.idle() || windowLoading_ || windowTimer_.isActive()) && timer.elapsed() < 10000) {
    if (windowTimer_.isActive()) {
      windowTimer_.stop();
      loadWindowNow();
    }
    scheduler_.waitForDone();
    windowPool_.waitForDone();
    QCoreApplication::processEvents(QEventLoop::AllEvents, 20);
  }
  QCoreApplication::processEvents();
}

QRect TimelineView::laneRect(int lane) const {
  if (lane < 0 || lane >= static_cast<int>(layout_.laneTop.size())) return {};
  return QRect(0, TimelineLayout::kRulerHeight + layout_.laneTop[lane] - vbar_->value(), width(),
               layout_.laneHeight[lane]);
}

TimelinePainter TimelineView::painter() const {
  TimelinePainter p;
  p.run = run_.get();
  p.analysis = analysis_.get();
  p.layout = &layout_;
  p.viewport = viewport_;
  p.scrollY = vbar_->value();
  p.selectedSpan = selectedSpan_;
  p.selectedIn = selectedIn_.get();
  p.selectedCollective = selectedCollective_;
  p.range = range_;
  p.nameColours = &nameColours_;
  p.nameTexts = &nameTexts_;
  p.stuck = &stuck_;
  p.selected = &selected_;
  p.missing = &missing_;
  p.findingMarks = &findingMarks_;
  return p;
}

void TimelineView::paintEvent(QPaintEvent*) {
  QPainter p(this);
  const auto frame = scheduler_.latest();
  QSize size = this->size();
  size.setWidth(size.width() - vbar_->width());
  painter().paint(p, size, frame.get());
}

void TimelineView::resizeEvent(QResizeEvent*) {
  const int w = vbar_->sizeHint().width();
  vbar_->setGeometry(width() - w, TimelineLayout::kRulerHeight, w, height() - TimelineLayout::kRulerHeight);
  vbar_->setRange(0, std::max(0, layout_.totalHeight - (height() - TimelineLayout::kRulerHeight) + 20));
  vbar_->setPageStep(height());
  if (run_ && viewport_.widthPx != plotWidth()) {
    // Keep the shown time range when the width changes.
    const double shownNs = viewport_.nsPerPx * viewport_.widthPx;
    viewport_.widthPx = plotWidth();
    viewport_.nsPerPx = shownNs / viewport_.widthPx;
  }
  requestFrame();
}

void TimelineView::zoomAt(double factor, double x) {
  const qint64 anchor = timeAt(x);
  viewport_.nsPerPx *= factor;
  clampViewport();
  viewport_.startNs = anchor - static_cast<qint64>((x - TimelineLayout::kLabelWidth) * viewport_.nsPerPx);
  requestFrame();
}

void TimelineView::pan(double px) {
  viewport_.startNs += static_cast<qint64>(px * viewport_.nsPerPx);
  requestFrame();
}

void TimelineView::wheelEvent(QWheelEvent* e) {
  if (e->modifiers() & Qt::ShiftModifier) {
    vbar_->setValue(vbar_->value() - e->angleDelta().y() / 2);
  } else {
    const double x = std::max<double>(TimelineLayout::kLabelWidth, e->position().x());
    zoomAt(std::pow(1.0015, -e->angleDelta().y()), x);
  }
  e->accept();
}

SpanRef TimelineView::hit(const QPoint& pos, int* laneOut) const {
  if (!run_ || pos.y() < TimelineLayout::kRulerHeight || pos.x() < TimelineLayout::kLabelWidth) return {};
  const int contentY = pos.y() - TimelineLayout::kRulerHeight + vbar_->value();
  const int lane = layout_.laneAt(contentY);
  if (laneOut) *laneOut = lane;
  if (lane < 0) return {};
  const int row = (contentY - layout_.laneTop[lane]) / TimelineLayout::kRowHeight;
  const auto shownTimeline = shown();
  if (lane >= static_cast<int>(shownTimeline->lanes().size())) return {};
  const Lane& l = shownTimeline->lanes()[lane];
  if (row >= static_cast<int>(l.rows.size())) return {};
  const LaneRow& r = l.rows[row];
  const qint64 t = timeAt(pos.x());
  const qint64 slack = static_cast<qint64>(2 * viewport_.nsPerPx);
  const size_t i = std::upper_bound(r.end.begin(), r.end.end(), t - slack) - r.end.begin();
  if (i < r.size() && r.begin[i] <= t + slack) return {lane, row, static_cast<uint32_t>(i)};
  return {};
}

CollectiveKey TimelineView::collectiveAt(const TimelineData& t, const SpanRef& ref) const {
  if (!run_ || !t.contains(ref)) return {};
  const LaneRow& r = t.row(ref);
  const uint8_t kind = r.kind[ref.index];
  if (kind != static_cast<uint8_t>(tracedb::SpanKind::Comm) && kind != static_cast<uint8_t>(tracedb::SpanKind::NcclKernel))
    return {};
  const int rank = t.lanes()[ref.lane].rank;
  auto it = collectivesByRank_.find(rank);
  if (it == collectivesByRank_.end()) return {};
  const qint64 b = r.begin[ref.index], e = r.end[ref.index];
  const auto& list = it->second;
  auto pos = std::upper_bound(list.begin(), list.end(), e,
                              [](qint64 v, const tracedb::CollectiveRow* c) { return v < c->enqueueNs; });
  const tracedb::CollectiveRow* best = nullptr;
  qint64 bestOverlap = -1;
  for (int steps = 0; pos != list.begin() && steps < 64; ++steps) {
    const tracedb::CollectiveRow* c = *--pos;
    const qint64 ce = c->endNs.value_or(run_->endNs);
    const qint64 overlap = std::min<qint64>(e, ce) - std::max<qint64>(b, c->enqueueNs);
    if (overlap > bestOverlap) {
      bestOverlap = overlap;
      best = c;
    }
    if (ce < b && c->enqueueNs < b - (e - b)) break;
  }
  if (!best || bestOverlap < 0) return {};
  return {QString::fromStdString(best->group), best->seq};
}

void TimelineView::mousePressEvent(QMouseEvent* e) {
  if (e->button() != Qt::LeftButton) return;
  setFocus();
  pressPos_ = e->pos();
  moved_ = false;
  if (e->pos().y() < TimelineLayout::kRulerHeight || (e->modifiers() & Qt::ShiftModifier)) {
    drag_ = Drag::Measure;
    pressStartNs_ = timeAt(e->pos().x());
    range_ = std::make_pair(pressStartNs_, pressStartNs_);
  } else {
    drag_ = Drag::Pan;
  }
}

void TimelineView::mouseMoveEvent(QMouseEvent* e) {
  if (drag_ == Drag::None) return;
  const QPoint delta = e->pos() - pressPos_;
  if (!moved_ && delta.manhattanLength() < 3) return;
  moved_ = true;
  if (drag_ == Drag::Pan) {
    pan(-delta.x());
    vbar_->setValue(vbar_->value() - delta.y());
    pressPos_ = e->pos();
  } else {
    const qint64 t = timeAt(e->pos().x());
    range_ = std::make_pair(std::min(t, pressStartNs_), std::max(t, pressStartNs_));
    update();
  }
}

void TimelineView::mouseReleaseEvent(QMouseEvent* e) {
  if (e->button() != Qt::LeftButton) return;
  const Drag drag = drag_;
  drag_ = Drag::None;
  if (drag == Drag::Measure) {
    if (moved_ && range_) emit rangeMeasured(range_->first, range_->second);
    else range_.reset();
    update();
    return;
  }
  if (drag == Drag::Pan && !moved_) {
    const int group = layout_.groupAt(e->pos().y() - TimelineLayout::kRulerHeight + vbar_->value());
    if (e->pos().y() >= TimelineLayout::kRulerHeight && group >= 0) {  // a click on a group's header folds it
      toggleGroup(group);
      return;
    }
    const auto t = shown();
    const SpanRef ref = hit(e->pos());
    selectedSpan_ = ref;
    selectedIn_ = t;
    const CollectiveKey key = t ? collectiveAt(*t, ref) : CollectiveKey{};
    selectCollective(key);
    emit spanSelected(ref);
    if (key.valid()) emit collectiveSelected(key.group, key.seq);
    update();
  }
}

void TimelineView::keyPressEvent(QKeyEvent* e) {
  const QPoint cursor = mapFromGlobal(QCursor::pos());
  const double x = rect().contains(cursor) && cursor.x() > TimelineLayout::kLabelWidth
                       ? cursor.x()
                       : TimelineLayout::kLabelWidth + plotWidth() / 2.0;
  switch (e->key()) {
    case Qt::Key_W: zoomAt(0.8, x); break;
    case Qt::Key_S: zoomAt(1.25, x); break;
    case Qt::Key_A: pan(-plotWidth() * 0.15); break;
    case Qt::Key_D: pan(plotWidth() * 0.15); break;
    case Qt::Key_0:
    case Qt::Key_Home: zoomAll(); break;
    case Qt::Key_Escape:
      range_.reset();
      selectedSpan_ = {};
      selectCollective({});
      break;
    default: QWidget::keyPressEvent(e); return;
  }
  e->accept();
}

QString TimelineView::describeSpan(const SpanRef& ref) const {
  if (!run_) return {};
  return describeSpanIn(ref == selectedSpan_ && selectedIn_ ? *selectedIn_ : *run_->timeline, ref);
}

QString TimelineView::describeSpanIn(const TimelineData& t, const SpanRef& ref) const {
  if (!run_ || !t.contains(ref)) return {};
  const LaneRow& r = t.row(ref);
  const size_t i = ref.index;
  if (!r.weight.empty() && r.weight[i] > 1)  // an entry of the run's lane summary, shown until every span is read
    return QString("%1 spans, mostly %2, the longest \"%3\"\n%4\nbegin %5 · over %6\n%7")
        .arg(r.weight[i])
        .arg(QString::fromStdString(std::string(tracedb::spanKindName(static_cast<tracedb::SpanKind>(r.kind[i])))),
             QString::fromStdString(t.string(r.name[i])), QString::fromStdString(t.lanes()[ref.lane].label),
             formatDuration(static_cast<double>(r.begin[i] - run_->beginNs)),
             formatDuration(static_cast<double>(r.end[i] - r.begin[i])),
             run_->windowed ? "(a summary: zoom in to read these spans)" : "(a summary: every span is being read)");
  QString text = QString("%1\n%2 · %3\nbegin %4 · duration %5")
                     .arg(QString::fromStdString(t.string(r.name[i])),
                          QString::fromStdString(t.lanes()[ref.lane].label),
                          QString::fromStdString(std::string(tracedb::spanKindName(static_cast<tracedb::SpanKind>(r.kind[i])))),
                          formatDuration(static_cast<double>(r.begin[i] - run_->beginNs)),
                          formatDuration(static_cast<double>(r.end[i] - r.begin[i])));
  if (r.step[i] >= 0) text += QString("\nstep %1").arg(r.step[i]);
  if (r.layer[i] >= 0) text += QString(" · layer %1").arg(r.layer[i]);
  if (r.phase[i] > 0)
    text += QString(" · %1").arg(QString::fromStdString(std::string(tracedb::phaseName(static_cast<tracedb::Phase>(r.phase[i])))));
  return text;
}

QString TimelineView::describeCollective(const CollectiveKey& key) const {
  if (!run_ || !key.valid()) return {};
  QStringList lines;
  for (const auto& c : run_->collectives) {
    if (c.seq != key.seq || QString::fromStdString(c.group) != key.group) continue;
    if (lines.isEmpty())
      lines << QString("%1 #%2 %3 · %4 · %5 bytes · %6")
                   .arg(key.group)
                   .arg(key.seq)
                   .arg(QString::fromStdString(c.op), QString::fromStdString(c.dtype))
                   .arg(c.bytes)
                   .arg(QString::fromStdString(c.callsite));
    lines << QString("  rank %1: arrived %2, %3%4")
                 .arg(c.rank)
                 .arg(formatDuration(static_cast<double>(c.enqueueNs - run_->beginNs)))
                 .arg(QString::fromStdString(std::string(tracedb::collectiveStateName(c.state))))
                 .arg(c.endNs ? QString(", took %1").arg(formatDuration(static_cast<double>(*c.endNs - c.startNs.value_or(c.enqueueNs))))
                              : QString(", never completed"));
  }
  return lines.join('\n');
}

bool TimelineView::event(QEvent* e) {
  if (e->type() == QEvent::ToolTip) {
    auto* help = static_cast<QHelpEvent*>(e);
    int lane = -1;
    const auto t = shown();
    const SpanRef ref = hit(help->pos(), &lane);
    if (ref.valid() && t && t->contains(ref)) {
      const LaneRow& r = t->row(ref);
      QString text = describeSpanIn(*t, ref);
      if ((r.end[ref.index] - r.begin[ref.index]) < lodThresholds(viewport_).minNs)
        text += "\n(among tiny spans merged at this zoom — zoom in to see each)";
      QToolTip::showText(help->globalPos(), text, this);
    } else {
      QToolTip::hideText();
    }
    return true;
  }
  return QWidget::event(e);
}

}  // namespace tpscope::gui
