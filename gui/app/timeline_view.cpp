// TimelineView (timeline_view.h): the run and its analysis, the viewport, the frames requested from the scheduler
// (or read from a window of the file) and their painting. Its input (zoom, pan, hits, mouse, keys):
// timeline_view_input.cpp.
#include "timeline_view.h"

#include <QCoreApplication>
#include <QElapsedTimer>
#include <QPainter>
#include <QThread>
#include <algorithm>
#include <string>
#include <string_view>

#include "tpscope/gui/findings_model.h"
#include "tpscope/gui/palette.h"

namespace tpscope::gui {

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
  p.criticalPath = criticalPath();
  return p;
}

void TimelineView::setShowCriticalPath(bool on) {
  showCriticalPath_ = on;
  update();
}

const std::vector<analysis::WhatIfSegment>* TimelineView::criticalPath() const {
  if (!showCriticalPath_ || !analysis_ || analysis_->whatIf.criticalPath.empty()) return nullptr;
  return &analysis_->whatIf.criticalPath;
}

std::vector<QRectF> TimelineView::criticalPathRects() const {
  std::vector<QRectF> out;
  const TimelinePainter p = painter();
  if (p.criticalPath)
    for (const auto& s : *p.criticalPath) out.push_back(p.criticalRect(s));
  return out;
}

QString TimelineView::criticalPathText() const {
  if (!analysis_) return "The critical path comes with the analysis, which is still running.";
  if (analysis_->whatIf.criticalPath.empty())
    return "No critical path: the what-if replay needs step windows and records of the run's collectives.";
  return QString::fromStdString(analysis::criticalPathSummary(analysis_->whatIf)) +
         " (what-if replay; outlined: work, dashed: transfers)";
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

}  // namespace tpscope::gui
