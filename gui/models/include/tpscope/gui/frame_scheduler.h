// Per-frame timeline queries on a worker thread, so zooming and panning never wait for the query.
//
// The widget asks for a viewport with request(); the scheduler runs at most one query at a time and coalesces
// requests that arrive meanwhile (only the newest is run next). frameReady() is emitted on the scheduler's thread
// with the finished frame; the widget paints the newest frame it has, re-mapped to its current viewport.
//
// Threading: FrameScheduler lives on the UI thread; computeFrame() is pure and may run on any thread. The destructor
// waits for the query in flight.
#pragma once

#include <QObject>
#include <QThreadPool>
#include <memory>
#include <optional>
#include <vector>

#include "tpscope/gui/timeline_data.h"

namespace tpscope::gui {

struct Frame {
  Viewport viewport;
  std::vector<std::vector<std::vector<DrawItem>>> items;  // [lane][row] → draw items in time order
  // The level of detail the items index (TimelineData::level): -1 the timeline itself, else one of its coarser
  // levels, for a frame zoomed out to a level's bucket per pixel or coarser.
  int level = -1;
  // A window of a big run's spans (FrameScheduler::setWindow) the frame was drawn from instead of the timeline.
  std::shared_ptr<const TimelineData> window;
  quint64 serial = 0;
  size_t itemCount() const;
  // The timeline whose rows the items index.
  const TimelineData& source(const TimelineData& timeline) const {
    const TimelineData& base = window ? *window : timeline;
    return level < static_cast<int>(base.levels().size()) ? base.level(level) : base;
  }
};

// The LOD query of every row of every lane, on the coarsest level of the timeline whose bucket is at most a pixel
// (TimelineData::levelFor), else on the timeline. O(output × log n).
Frame computeFrame(const TimelineData& timeline, const Viewport& viewport);

class FrameScheduler : public QObject {
  Q_OBJECT
 public:
  explicit FrameScheduler(QObject* parent = nullptr);
  ~FrameScheduler() override;

  void setTimeline(std::shared_ptr<const TimelineData> timeline);  // drops frames of the previous timeline
  const std::shared_ptr<const TimelineData>& timeline() const { return timeline_; }
  // A window of every span of a big run's time range (TimelineData::buildWindow on the timeline's lanes): a frame
  // whose viewport it covers is drawn from it, any other from the timeline (the summary). Kept until the next
  // setWindow or setTimeline.
  void setWindow(std::shared_ptr<const TimelineData> window) { window_ = std::move(window); }
  const std::shared_ptr<const TimelineData>& window() const { return window_; }
  void request(const Viewport& viewport);
  std::shared_ptr<const Frame> latest() const { return latest_; }
  bool idle() const { return !busy_ && !pending_; }
  void waitForDone() { pool_.waitForDone(); }

 signals:
  void frameReady();

 private:
  void startNext();

  QThreadPool pool_;
  std::shared_ptr<const TimelineData> timeline_;
  std::shared_ptr<const TimelineData> window_;
  std::shared_ptr<const Frame> latest_;
  std::optional<Viewport> pending_;
  bool busy_ = false;
  quint64 serial_ = 0;
  quint64 epoch_ = 0;  // bumped by setTimeline
};

}  // namespace tpscope::gui
