#include "tpscope/gui/frame_scheduler.h"

#include <algorithm>

namespace tpscope::gui {

size_t Frame::itemCount() const {
  size_t n = 0;
  for (const auto& lane : items)
    for (const auto& row : lane) n += row.size();
  return n;
}

Frame computeFrame(const TimelineData& timeline, const Viewport& viewport) {
  Frame frame;
  frame.viewport = viewport;
  // Zoomed out to a level's bucket per pixel or coarser, the level draws the same picture from a few entries per
  // pixel instead of thousands of spans (the frame's cost then follows the pixels, not the spans).
  frame.level = timeline.levelFor(viewport.nsPerPx);
  const TimelineData& source = frame.source(timeline);
  frame.items.resize(source.lanes().size());
  const size_t first = static_cast<size_t>(std::max(0, viewport.firstLane));
  const size_t last = std::min(source.lanes().size(), static_cast<size_t>(std::max(0, viewport.lastLane)));
  for (size_t l = first; l < last; ++l) {  // lanes off the requested range keep no items
    const size_t rows = source.lanes()[l].rows.size();
    frame.items[l].resize(rows);
    for (size_t d = 0; d < rows; ++d)
      frame.items[l][d] = source.queryRow(static_cast<int>(l), static_cast<int>(d), viewport);
  }
  return frame;
}

FrameScheduler::FrameScheduler(QObject* parent) : QObject(parent) { pool_.setMaxThreadCount(1); }

FrameScheduler::~FrameScheduler() { pool_.waitForDone(); }

void FrameScheduler::setTimeline(std::shared_ptr<const TimelineData> timeline) {
  timeline_ = std::move(timeline);
  window_.reset();
  latest_.reset();
  ++epoch_;
}

void FrameScheduler::request(const Viewport& viewport) {
  pending_ = viewport;
  if (!busy_) startNext();
}

void FrameScheduler::startNext() {
  if (!pending_ || !timeline_) return;
  const Viewport viewport = *pending_;
  pending_.reset();
  busy_ = true;
  const quint64 serial = ++serial_;
  const quint64 epoch = epoch_;
  const bool windowed = window_ && window_->covers(viewport.startNs, viewport.endNs());
  pool_.start([this, timeline = windowed ? window_ : timeline_, windowed, viewport, serial, epoch] {
    auto frame = std::make_shared<Frame>(computeFrame(*timeline, viewport));
    if (windowed) frame->window = timeline;
    frame->serial = serial;
    QMetaObject::invokeMethod(this, [this, frame, epoch] {
      busy_ = false;
      if (epoch == epoch_) {
        latest_ = frame;
        emit frameReady();
      }
      startNext();
    });
  });
}

}  // namespace tpscope::gui
