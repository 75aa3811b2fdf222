// TimelineView's input (timeline_view.h): zoom and pan, hit tests, the mouse, the keys and the tooltips.
#include <QHelpEvent>
#include <QKeyEvent>
#include <QToolTip>
#include <QWheelEvent>
#include <algorithm>
#include <cmath>
#include <utility>

#include "timeline_view.h"

namespace tpscope::gui {

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
