// The timeline: a lane per rank × thread/stream (rows by nesting depth inside), a time ruler, spans coloured by kind
// (communication by collective op), level of detail from FrameScheduler, collective highlighting with flows, the
// stuck collectives of the run marked, every finding's place (rank, time) marked with a triangle in its severity's
// colour, the what-if critical path outlined on request, range measurement, tooltips.
//
// Input (Perfetto/chrome://tracing habits): wheel or W/S zoom (around the cursor), drag or A/D pan, Shift+drag or a
// drag on the ruler measures a range, click selects a span (a communication span selects its collective on every
// rank), Esc clears. Frames are computed on the scheduler's worker thread; paint() draws the newest frame re-mapped
// to the current viewport, so input never waits for a query.
//
// Threading: UI thread. TimelinePainter is separate so the benchmark can draw frames into a QImage.
#pragma once

#include <QScrollBar>
#include <QThreadPool>
#include <QTimer>
#include <QWidget>
#include <map>
#include <optional>

#include "tpscope/gui/frame_scheduler.h"
#include "tpscope/gui/run_loader.h"

namespace tpscope::gui {

// A duration for display: "1.234 s", "12.345 ms", "3.21 µs", "850 ns".
QString formatDuration(double ns);

// A run of consecutive lanes shown under one header that collapses them (a TP group, or a host): what keeps a run of
// thousands of lanes navigable, as Perfetto's process groups do.
struct LaneGroup {
  std::string label;      // "tp-3 · ranks 24–31"
  int firstLane = 0;      // [firstLane, lastLane)
  int lastLane = 0;
  bool collapsed = false;
  int top = 0;            // y of the header, content coordinates
};

// The lane groups of a run: its TP groups when there are several and each holds consecutive lanes, else its hosts
// when there are several and each holds consecutive lanes, else none.
std::vector<LaneGroup> laneGroups(const RunData& run);

struct TimelineLayout {
  static constexpr int kRulerHeight = 26;
  static constexpr int kRowHeight = 16;
  static constexpr int kLaneGap = 6;
  static constexpr int kLabelWidth = 150;
  static constexpr int kGroupHeight = 18;
  std::vector<int> laneTop;     // y of each lane, content coordinates (0 = below the ruler)
  std::vector<int> laneHeight;  // 0 for a lane of a collapsed group
  std::vector<LaneGroup> groups;  // each with its header above its lanes; empty: no headers
  int totalHeight = 0;
  void build(const TimelineData& timeline, std::vector<LaneGroup> laneGroups = {});
  int groupAt(int contentY) const;  // the group whose header is at contentY; -1 if none
  int laneAt(int contentY) const;  // -1 if none
  int laneFrom(int contentY) const;  // the lane at or above contentY (0 above the first)
};

struct CollectiveKey {
  QString group;
  qint64 seq = -1;
  bool valid() const { return seq >= 0; }
  bool operator==(const CollectiveKey&) const = default;
};

// Draws one frame. All inputs are borrowed for the call.
struct TimelinePainter {
  const RunData* run = nullptr;
  const AnalysisData* analysis = nullptr;  // may be null: stuck collectives then come from the records alone
  const TimelineLayout* layout = nullptr;
  Viewport viewport;  // the time axis: x = kLabelWidth + (t - startNs) / nsPerPx
  int scrollY = 0;
  SpanRef selectedSpan;
  const TimelineData* selectedIn = nullptr;  // the timeline selectedSpan indexes (null: run->timeline)
  CollectiveKey selectedCollective;
  std::optional<std::pair<qint64, qint64>> range;  // measured range, ns
  const std::vector<QColor>* nameColours = nullptr;  // by string id; invalid: use the kind's colour
  const std::vector<QString>* nameTexts = nullptr;   // by string id (labels without per-frame conversion)
  const std::vector<const tracedb::CollectiveRow*>* stuck = nullptr;     // records never completed
  const std::vector<const tracedb::CollectiveRow*>* selected = nullptr;  // records of the selected collective
  struct MissingMark {
    int rank = 0;
    qint64 timeNs = 0;
    QString label;
  };
  const std::vector<MissingMark>* missing = nullptr;  // ranks that never entered a stuck collective
  struct FindingMark {
    int rank = -1;     // -1: the whole run (marked on the ruler)
    qint64 timeNs = 0;
    int severity = 3;  // analysis::Severity
    QString label;     // the finding's kind
  };
  const std::vector<FindingMark>* findingMarks = nullptr;  // every finding's place (rank, time)
  // The what-if critical path (analysis::WhatIfReport::criticalPath), each stretch outlined on its lane and joined to
  // the one before; null: not shown.
  const std::vector<analysis::WhatIfSegment>* criticalPath = nullptr;
  // Where a finding's mark is drawn: a triangle at the top of the rank's first lane (the ruler for rank −1).
  QPointF markPoint(const FindingMark& m) const;
  // Where a critical-path stretch is outlined (its lane: (rank, thread), else the rank's first); empty: not on screen
  // (no lane, or a collapsed group).
  QRectF criticalRect(const analysis::WhatIfSegment& s) const;

  void paint(QPainter& p, const QSize& size, const Frame* frame) const;
  double xOf(qint64 t) const { return TimelineLayout::kLabelWidth + (t - viewport.startNs) / viewport.nsPerPx; }

 private:
  void paintRuler(QPainter& p, const QSize& size) const;
  // The steps of paint(), in its order.
  void paintSpans(QPainter& p, const QSize& size, const Frame* frame) const;
  void paintSelection(QPainter& p) const;
  void paintRange(QPainter& p, const QSize& size) const;
  void paintLaneLabels(QPainter& p, const QSize& size) const;
  void paintGroupHeaders(QPainter& p, const QSize& size) const;
  void paintCollectives(QPainter& p, const QSize& size) const;
  void paintFindingMarks(QPainter& p) const;
  void paintCriticalPath(QPainter& p) const;
  int laneY(int lane) const;
  int laneOn(int rank, int thread) const;  // (rank, thread)'s lane, else the rank's first; -1: none
  int laneOfRecord(const tracedb::CollectiveRow& c) const { return laneOn(c.rank, c.thread); }
};

// A windowed run's window is read only when the summary says the time holds at most this many spans (about 1 s to
// read on the development machine, 80 MB laid out); zoomed out further, the summary is the picture.
inline constexpr size_t kWindowSpanBudget = 1'000'000;

class TimelineView : public QWidget {
  Q_OBJECT
 public:
  explicit TimelineView(QWidget* parent = nullptr);

  void setRun(RunPtr run, bool keepViewport = false);
  void setAnalysis(AnalysisPtr analysis);
  RunPtr run() const { return run_; }

  // Shows [beginNs, endNs) (with a small margin) and scrolls the lanes of `rank` into view (-1: keep).
  void showRange(qint64 beginNs, qint64 endNs, int rank = -1);
  void zoomAll();
  // Collapses or expands every lane group (View menu), or one group (a click on its header).
  void setGroupsCollapsed(bool collapsed);
  void toggleGroup(int group);
  const TimelineLayout& layout() const { return layout_; }
  void selectCollective(const CollectiveKey& key);
  void selectSpan(const SpanRef& ref);  // also scrolls to it

  const Viewport& viewport() const { return viewport_; }
  SpanRef selectedSpan() const { return selectedSpan_; }
  CollectiveKey selectedCollective() const { return selectedCollective_; }
  std::optional<std::pair<qint64, qint64>> range() const { return range_; }
  // Rectangle of a lane in widget coordinates (for tests and jumping).
  QRect laneRect(int lane) const;
  // Blocks until the frame for the current viewport is ready (tests, screenshots).
  void waitForFrame();
  // Human-readable description of a span (the details panel).
  QString describeSpan(const SpanRef& ref) const;
  // The newest frame (what is on screen, re-mapped to the viewport); null before the first.
  std::shared_ptr<const Frame> latestFrame() const { return scheduler_.latest(); }
  QString describeCollective(const CollectiveKey& key) const;
  // The marks of the analysis' findings, one per finding placed in time (set by setAnalysis).
  const std::vector<TimelinePainter::FindingMark>& findingMarks() const { return findingMarks_; }
  // Where mark `m` is drawn, in widget coordinates (tests).
  QPointF markPoint(const TimelinePainter::FindingMark& m) const { return painter().markPoint(m); }
  // The what-if critical path of the analysis' median step outlined over the lanes (View → Show critical path).
  void setShowCriticalPath(bool on);
  bool showsCriticalPath() const { return showCriticalPath_; }
  // What is drawn: the analysis' critical path while shown, else null (hidden, no analysis yet, or none).
  const std::vector<analysis::WhatIfSegment>* criticalPath() const;
  // Where each of its stretches is outlined, in widget coordinates (empty rect: off screen); empty when none is drawn.
  std::vector<QRectF> criticalPathRects() const;
  // "critical path of step 7: 47.000 ms, compute 45.000 ms, transfer 2.000 ms", or why there is none.
  QString criticalPathText() const;

 signals:
  void spanSelected(tpscope::gui::SpanRef ref);
  void collectiveSelected(QString group, qint64 seq);
  void rangeMeasured(qint64 beginNs, qint64 endNs);
  void viewportChanged();

 protected:
  void paintEvent(QPaintEvent*) override;
  void resizeEvent(QResizeEvent*) override;
  void wheelEvent(QWheelEvent*) override;
  void mousePressEvent(QMouseEvent*) override;
  void mouseMoveEvent(QMouseEvent*) override;
  void mouseReleaseEvent(QMouseEvent*) override;
  void keyPressEvent(QKeyEvent*) override;
  bool event(QEvent*) override;

 private:
  void zoomAt(double factor, double x);
  void pan(double px);
  void clampViewport();
  void revealLane(int lane);  // expands the group that holds it
  void requestFrame();
  int plotWidth() const;
  qint64 timeAt(double x) const;
  SpanRef hit(const QPoint& pos, int* lane = nullptr) const;
  CollectiveKey collectiveAt(const TimelineData& timeline, const SpanRef& ref) const;
  QString describeSpanIn(const TimelineData& timeline, const SpanRef& ref) const;
  // The timeline the newest frame was drawn from: a window of a windowed run's spans, or the run's timeline.
  std::shared_ptr<const TimelineData> shown() const;
  void loadWindowNow();  // a windowed run: reads every span of three screens' time around the view, within budget
  TimelinePainter painter() const;

  RunPtr run_;
  AnalysisPtr analysis_;
  FrameScheduler scheduler_;
  TimelineLayout layout_;
  Viewport viewport_;
  std::pair<int, int> coveredLanes_{0, INT32_MAX};  // the lanes of the newest frame request, [first, last)
  std::map<std::string, bool> collapsed_;  // by group label: kept across reloads of the same run
  QScrollBar* vbar_ = nullptr;
  SpanRef selectedSpan_;
  std::shared_ptr<const TimelineData> selectedIn_;  // the timeline selectedSpan_ indexes
  CollectiveKey selectedCollective_;
  std::optional<std::pair<qint64, qint64>> range_;
  // Precomputed per run: colours of communication span names, records per rank by arrival, stuck records.
  std::vector<QColor> nameColours_;
  std::vector<QString> nameTexts_;
  std::map<int, std::vector<const tracedb::CollectiveRow*>> collectivesByRank_;
  std::vector<const tracedb::CollectiveRow*> stuck_, selected_;
  std::vector<TimelinePainter::MissingMark> missing_;
  std::vector<TimelinePainter::FindingMark> findingMarks_;
  bool showCriticalPath_ = false;
  // Mouse gesture state.
  enum class Drag { None, Pan, Measure } drag_ = Drag::None;
  QPoint pressPos_;
  qint64 pressStartNs_ = 0;
  bool moved_ = false;
  // A windowed run (RunData::windowed): the time around the view is read once the view settles (windowTimer_), on
  // windowPool_, if the summary says it holds at most kWindowSpanBudget spans.
  QTimer windowTimer_;
  bool windowLoading_ = false;
  bool windowFailed_ = false;
  quint64 windowGeneration_ = 0;
  QThreadPool windowPool_;
};

}  // namespace tpscope::gui
