// Timeline data with level of detail: the spans of a run split into lanes (rank × thread/stream) and, inside a lane,
// into rows by nesting depth; queried per frame in O(visible output × log n), never O(spans).
//
// Layout. A lane's spans are sorted by (begin, longer first) and given a depth with a stack (a span nests under every
// open span that has not ended when it begins). Within one row (lane, depth) spans never overlap, so both begins and
// ends are sorted — a binary search finds the first visible span and the end of a run of tiny spans.
//
// Level of detail (after Tracy's zone merging, with Perfetto's per-pixel summaries): a span at least kMinVisiblePx
// wide on screen is drawn as itself; consecutive narrower spans are merged into one block that carries how many spans
// it holds and its majority kind. The exact rule is queryRow()'s comment; tests check it against a linear scan.
// Precomputed summaries: per row, every kKindBlock spans, the running count of each kind, so a block's majority kind
// costs O(kKindBlock) whatever the number of spans merged.
//
// Threading: a TimelineData is immutable once built; any number of threads may query it concurrently.
// Units: ns in the run's time base (merged run file: rank 0's clock since the run's epoch).
#pragma once

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tpscope/tracedb/lane_summary.h"
#include "tpscope/tracedb/records.h"

namespace tpscope::gui {

inline constexpr int kKindCount = tracedb::kSpanKindCount;
inline constexpr double kMinVisiblePx = 2.0;  // spans narrower than this are merged
inline constexpr double kMergeGapPx = 2.0;    // tiny spans closer than this join one block
inline constexpr double kMaxMergePx = 6.0;    // a merged block stops growing once this wide (keeps local colour)
inline constexpr uint32_t kKindBlock = 16;    // spans per kind-count summary entry

// The spans at one nesting depth of one lane, structure of arrays, sorted by begin; ends sorted too.
struct LaneRow {
  std::vector<int64_t> begin;  // ns
  std::vector<int64_t> end;    // ns, >= begin
  std::vector<uint32_t> name;  // string id (TimelineData::strings)
  std::vector<int32_t> step;
  std::vector<int16_t> layer;
  std::vector<uint8_t> kind;   // tracedb::SpanKind
  std::vector<uint8_t> phase;  // tracedb::Phase
  // kindPrefix[b][k]: spans of kind k among indices [0, b * kKindBlock) (entries counted by weight). Size:
  // size() / kKindBlock + 1.
  std::vector<std::array<uint32_t, kKindCount>> kindPrefix;
  // How many spans each entry stands for, in a timeline built from a lane summary (tracedb/lane_summary.h), where an
  // entry may be the hull of a bucket's short spans; empty: every entry is one span.
  std::vector<uint32_t> weight;

  size_t size() const { return begin.size(); }
  // Appends one entry after the last (the caller keeps the row sorted); weights, if any, are the caller's.
  void push(int64_t b, int64_t e, uint32_t nameId, int32_t stepNo, int16_t layerNo, uint8_t kindId, uint8_t phaseId) {
    begin.push_back(b);
    end.push_back(e);
    name.push_back(nameId);
    step.push_back(stepNo);
    layer.push_back(layerNo);
    kind.push_back(kindId);
    phase.push_back(phaseId);
  }
  // Counts of each kind among spans [first, last).
  std::array<uint32_t, kKindCount> kindCounts(uint32_t first, uint32_t last) const;
  void buildSummaries();
};

struct Lane {
  int rank = 0;
  int thread = 0;
  std::string label;     // "rank 3 · main" / "rank 3 · stream 7"
  std::vector<LaneRow> rows;  // by depth; rows[0] = outermost spans
};

// One thing to draw in a row. A single span (merged == false, count == 1, first = its index) or a block of merged
// spans [first, first + count) spanning [beginNs, endNs) whose colour is `kind`, their majority kind (ties: lowest id).
struct DrawItem {
  int64_t beginNs = 0;
  int64_t endNs = 0;
  uint32_t first = 0;
  uint32_t count = 0;
  uint8_t kind = 0;
  bool merged = false;
  bool operator==(const DrawItem&) const = default;
};

// What one frame shows: [startNs, startNs + nsPerPx * widthPx).
struct Viewport {
  int64_t startNs = 0;
  double nsPerPx = 1.0;  // > 0
  int widthPx = 1;       // > 0
  // The lanes a frame covers, [firstLane, lastLane): the view asks for those on screen (with a margin), so a run of
  // thousands of lanes costs a frame what the screen shows.
  int firstLane = 0;
  int lastLane = INT32_MAX;
  int64_t endNs() const;
};

// The LOD thresholds of a viewport in ns (each at least 1): kMinVisiblePx, kMergeGapPx, kMaxMergePx pixels, rounded up.
struct LodThresholds {
  int64_t minNs = 1;
  int64_t gapNs = 1;
  int64_t maxNs = 1;
};
LodThresholds lodThresholds(const Viewport& viewport);

// Where a span lives: lane, row (depth), index in the row.
struct SpanRef {
  int lane = -1;
  int row = -1;
  uint32_t index = 0;
  bool valid() const { return lane >= 0; }
  bool operator==(const SpanRef&) const = default;
};

// Plain input span for building (a tracedb::SpanRow without the optional columns).
struct InputSpan {
  int rank = 0;
  int thread = 0;
  int64_t beginNs = 0;
  int64_t endNs = 0;
  uint32_t name = 0;
  int32_t step = -1;
  int16_t layer = -1;
  uint8_t kind = 0;
  uint8_t phase = 0;
};

class TimelineData {
 public:
  // Builds lanes from spans in any order. Lanes are ordered by (rank, thread); `threadLabel(rank, thread)` names them.
  // Consumes `spans`. Sorting runs on up to `threads` threads (the calling one included). O(n log n).
  static TimelineData build(std::vector<InputSpan> spans, std::vector<std::string> strings,
                            const std::vector<tracedb::ThreadInfo>& threads = {}, int workers = 1);
  // The same from spans in several chunks (e.g. read by parallel readers); consumes the chunks.
  static TimelineData build(std::vector<std::vector<InputSpan>> chunks, std::vector<std::string> strings,
                            const std::vector<tracedb::ThreadInfo>& threads = {}, int workers = 1);
  // A summary timeline, for the first frame of a run whose file has a lane summary: rows are the summary's (same
  // depths as build() gives), an entry of several spans carries its weight and is drawn as a merged block.
  // `nameMap` maps the file's string ids to `strings`; `shiftNs(rank)` moves a rank's times onto the run's base.
  // spanCount() is the number of spans summarised. O(entries).
  static TimelineData fromSummary(const tracedb::LaneSummary& summary, const std::vector<uint32_t>& nameMap,
                                  const std::function<int64_t(int rank)>& shiftNs, std::vector<std::string> strings,
                                  const std::vector<tracedb::ThreadInfo>& threads = {});
  // Whether this timeline is a summary (fromSummary) rather than every span.
  bool summary() const { return summary_; }
  // A window of a run too big to hold every span in memory (issue #17; run_data.h loadWindow): `spans` (every span
  // that overlaps [fromNs, toNs), in any order) laid out in the lanes of `layout` — the same lanes, in the same order,
  // so a frame of either paints in one lane layout; spans of a lane `layout` lacks are dropped. Rows by nesting depth
  // as build() gives them: a span's depth counts the spans open when it begins, and every one of those overlaps the
  // window too.
  static TimelineData buildWindow(const TimelineData& layout, std::vector<InputSpan> spans, int64_t fromNs,
                                  int64_t toNs, int workers = 1);
  // Whether this is a window (buildWindow) holding every span of [fromNs, toNs).
  bool covers(int64_t fromNs, int64_t toNs) const {
    return windowEnd_ > windowBegin_ && fromNs >= windowBegin_ && toNs <= windowEnd_;
  }
  int64_t windowBeginNs() const { return windowBegin_; }
  int64_t windowEndNs() const { return windowEnd_; }
  // The spans the entries overlapping [fromNs, toNs) stand for (by weight), over every row: on a summary, about what
  // a window of that time would read. O(rows × log n + entries in the range).
  size_t weightIn(int64_t fromNs, int64_t toNs) const;
  // Coarser levels of detail (Perfetto's mipmaps): summaries of this timeline's rows (tracedb::RowSummarizer) at
  // bucket widths 4× apart, from 1/4,096 of the run down to where a level would hold more than 1/8 of the spans.
  // computeFrame() queries the coarsest level whose bucket is at most a pixel, so a zoomed-out frame costs the
  // pixels it fills, not the spans under them. Built once (buildLevels), before the timeline is shared.
  void buildLevels(int workers = 1);
  const std::vector<std::shared_ptr<const TimelineData>>& levels() const { return levels_; }  // coarsest first
  // The index of the level a frame at `nsPerPx` is drawn from; -1 for this timeline.
  int levelFor(double nsPerPx) const;
  const TimelineData& level(int index) const { return index < 0 ? *this : *levels_[static_cast<size_t>(index)]; }
  // The bucket width of a level (buildLevels), the finest row's of a summary timeline (fromSummary), 0 otherwise.
  int64_t bucketNs() const { return bucketNs_; }

  const std::vector<Lane>& lanes() const { return lanes_; }
  const std::string& string(uint32_t id) const;
  const std::vector<std::string>& strings() const { return strings_; }
  int64_t beginNs() const { return beginNs_; }
  int64_t endNs() const { return endNs_; }
  size_t spanCount() const { return spanCount_; }
  int laneOf(int rank, int thread) const;  // -1 if none

  // Level of detail for one row. Exact rule (px = nsPerPx, t0 = startNs, t1 = endNs()):
  //   i = first span with end > t0; while i < n and begin[i] < t1:
  //     a span with end - begin >= minNs is emitted alone;
  //     else a block starts at i with runEnd = end[i] and grows, while runEnd - begin[i] < maxNs, by
  //       (a) every following span that ends before runEnd + gapNs (each of those is narrower than the gap),
  //       or, when there is none, (b) the next span if it is narrower than minNs and begins before runEnd + gapNs;
  //       runEnd becomes the last absorbed span's end. The block is emitted and i moves past it.
  //   (minNs, gapNs, maxNs: lodThresholds(viewport).)
  // Cost: O(items × log n). Any thread.
  std::vector<DrawItem> queryRow(int lane, int row, const Viewport& viewport) const;

  // The innermost span under time t in a lane (deepest row first), within `slackNs` either side; invalid if none.
  SpanRef spanAt(int lane, int64_t t, int64_t slackNs = 0) const;
  // The longest span of `rank` within [fromNs, toNs) with that layer (and phase, unless phase < 0); invalid if none.
  // Used to land on "the backward pass of layer L on rank R". O(lanes × rows × log n + spans in the window).
  SpanRef findSpan(int rank, int64_t fromNs, int64_t toNs, int layer, int phase = -1) const;
  // Spans whose name contains `needle` (case-insensitive), in time order across lanes, at most `limit`.
  std::vector<SpanRef> search(const std::string& needle, size_t limit = 1000) const;

  const LaneRow& row(const SpanRef& ref) const { return lanes_[ref.lane].rows[ref.row]; }
  // Whether `ref` names a span of this timeline (a ref kept across a reload may not).
  bool contains(const SpanRef& ref) const {
    return ref.lane >= 0 && ref.lane < static_cast<int>(lanes_.size()) && ref.row >= 0 &&
           ref.row < static_cast<int>(lanes_[ref.lane].rows.size()) && ref.index < lanes_[ref.lane].rows[ref.row].size();
  }

  // Binary cache of the built timeline (timeline_cache.cpp), so reopening a big run skips reading and sorting its
  // spans. `key` identifies the source (file size, mtime); readCache returns nothing when the file is missing, of
  // another format version or key, or damaged. writeCache writes to a temporary file and renames it: a reader sees
  // a complete cache or none. Any thread; both block on file I/O.
  bool writeCache(const std::string& path, const std::string& key) const;
  static std::optional<TimelineData> readCache(const std::string& path, const std::string& key);

 private:
  std::vector<Lane> lanes_;
  std::vector<std::string> strings_;
  int64_t beginNs_ = 0;
  int64_t endNs_ = 0;
  size_t spanCount_ = 0;
  bool summary_ = false;
  int64_t bucketNs_ = 0;
  int64_t windowBegin_ = 0, windowEnd_ = 0;  // buildWindow's [fromNs, toNs)
  std::vector<std::shared_ptr<const TimelineData>> levels_;
};

// The majority kind of a kind-count histogram (ties: lowest id).
uint8_t majorityKind(const std::array<uint32_t, kKindCount>& counts);

}  // namespace tpscope::gui
