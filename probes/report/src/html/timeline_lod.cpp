// The timeline overview's level of detail (timeline_lod.h): one read of the window's spans per rank, nesting rows per
// lane, then per zoom level the rectangles within the lane's budget.
#include "html/timeline_lod.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <unordered_map>

#include "html/palette.h"

namespace tpscope::report::html {

namespace {

struct Item {
  int64_t beginNs, endNs;  // clipped to the window
  uint32_t name;
  uint8_t colour;
};

using Rows = std::vector<std::vector<Item>>;  // nesting depth → spans in begin order, not overlapping

// Names kept for hover text, and the colour of each (kind, name) met.
class NameTable {
 public:
  NameTable(tracedb::Reader& reader, std::vector<std::string>& names, int maxNames)
      : reader_(reader), names_(names), max_(static_cast<size_t>(maxNames)) {}
  uint8_t colour(tracedb::SpanKind kind, uint32_t name) {
    const uint64_t key = (static_cast<uint64_t>(name) << 8) | static_cast<uint8_t>(kind);
    auto [it, added] = colours_.try_emplace(key, 0);
    if (added) it->second = static_cast<uint8_t>(palette::spanColour(kind, reader_.string(name)));
    return it->second;
  }
  int32_t index(uint32_t name) {
    auto it = index_.find(name);
    if (it != index_.end()) return it->second;
    if (names_.size() >= max_) return -1;
    names_.push_back(reader_.string(name));
    return index_[name] = static_cast<int32_t>(names_.size() - 1);
  }

 private:
  tracedb::Reader& reader_;
  std::vector<std::string>& names_;
  size_t max_;
  std::unordered_map<uint64_t, uint8_t> colours_;
  std::unordered_map<uint32_t, int32_t> index_;
};

// Spans sorted by (begin, longer first) into nesting rows; depth ≥ maxRows is counted in `hidden`.
Rows nest(std::vector<Item>& items, int maxRows, int64_t& hidden) {
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return a.beginNs != b.beginNs ? a.beginNs < b.beginNs : a.endNs > b.endNs;
  });
  Rows rows;
  std::vector<int64_t> open;  // ends of the enclosing spans
  for (const Item& it : items) {
    while (!open.empty() && open.back() <= it.beginNs) open.pop_back();
    const size_t depth = open.size();
    open.push_back(it.endNs);
    if (depth >= static_cast<size_t>(maxRows)) {
      ++hidden;
      continue;
    }
    if (rows.size() <= depth) rows.resize(depth + 1);
    rows[depth].push_back(it);
  }
  return rows;
}

// One level: `tickNs` per tick; spans narrower than `minTicks` merge with close neighbours.
class LevelWriter {
 public:
  LevelWriter(int64_t originNs, double tickNs, double minTicks, NameTable& names, std::vector<int32_t>& out)
      : origin_(originNs), tick_(tickNs), min_(minTicks), names_(names), out_(out) {}

  void row(const std::vector<Item>& items, int row) {
    row_ = row;
    for (const Item& it : items) {
      const double x0 = static_cast<double>(it.beginNs - origin_) / tick_;
      const double x1 = static_cast<double>(it.endNs - origin_) / tick_;
      if (x1 - x0 >= min_) {
        flush();
        emit(x0, x1, it.colour, names_.index(it.name));
      } else if (count_ > 0 && x0 - blockEnd_ < min_ && x1 - blockBegin_ <= 3 * min_) {
        blockEnd_ = std::max(blockEnd_, x1);
        add(it);
      } else {
        flush();
        blockBegin_ = x0;
        blockEnd_ = x1;
        add(it);
      }
    }
    flush();
  }

 private:
  void add(const Item& it) {
    if (count_++ == 0) {
      colours_.fill(0);
      first_ = it;
    }
    ++colours_[it.colour];
  }
  void flush() {
    if (count_ == 1) emit(blockBegin_, blockEnd_, first_.colour, names_.index(first_.name));
    else if (count_ > 1)
      emit(blockBegin_, blockEnd_,
           static_cast<uint8_t>(std::max_element(colours_.begin(), colours_.end()) - colours_.begin()),
           -static_cast<int32_t>(std::min<int64_t>(count_, INT32_MAX)));
    count_ = 0;
  }
  void emit(double x0, double x1, uint8_t colour, int32_t name) {
    const auto a = static_cast<int32_t>(std::floor(x0));
    const auto b = std::max(a + 1, static_cast<int32_t>(std::ceil(x1)));
    out_.insert(out_.end(), {a, b - a, row_, colour, name});
  }

  int64_t origin_;
  double tick_, min_;
  NameTable& names_;
  std::vector<int32_t>& out_;
  int row_ = 0;
  double blockBegin_ = 0, blockEnd_ = 0;
  int64_t count_ = 0;
  Item first_{};
  std::array<int64_t, palette::kColourCount> colours_{};
};

std::vector<int32_t> levelRects(const Rows& rows, const TimelineWindow& w, int64_t ticks, int cap, NameTable& names) {
  const double tickNs = static_cast<double>(w.endNs - w.beginNs) / static_cast<double>(ticks);
  std::vector<int32_t> out;
  for (double minTicks = 2;; minTicks *= 2) {
    out.clear();
    LevelWriter writer(w.beginNs, tickNs, minTicks, names, out);
    for (size_t r = 0; r < rows.size(); ++r) writer.row(rows[r], static_cast<int>(r));
    if (out.size() <= static_cast<size_t>(cap) * kRectFields || minTicks >= static_cast<double>(ticks)) return out;
  }
}

std::string laneLabel(int rank, int thread, const std::map<std::pair<int, int>, tracedb::ThreadInfo>& threads) {
  std::string name;
  if (auto it = threads.find({rank, thread}); it != threads.end()) {
    name = it->second.name;
    if (name.empty()) name = (it->second.kind == "cuda-stream" ? "stream " : "thread ") + std::to_string(thread);
  } else {
    name = "thread " + std::to_string(thread);
  }
  return "rank " + std::to_string(rank) + " · " + name;
}

void addMarks(TimelineOverview& o, const Breakdown& breakdown, const DesyncReport& desync) {
  const int firstRank = breakdown.steps.empty() ? -1 : breakdown.steps.front().rank;
  for (const auto& s : breakdown.steps)
    if (s.rank == firstRank && std::binary_search(o.window.steps.begin(), o.window.steps.end(), s.step))
      o.stepMarks.emplace_back(s.step, std::max<int64_t>(0, s.beginNs - o.window.beginNs));
  for (const auto& g : desync.groups) {
    if (!g.stuckSeq) continue;
    const std::string what = g.group + " #" + std::to_string(*g.stuckSeq);
    int64_t firstArrival = INT64_MAX;
    for (const auto& rec : g.stuckRecords) {
      firstArrival = std::min(firstArrival, rec.enqueueNs);
      const int lane = laneOf(o, rec.rank);
      if (lane < 0 || rec.endNs || rec.enqueueNs >= o.window.endNs) continue;
      o.stuck.push_back({lane, std::max<int64_t>(0, rec.enqueueNs - o.window.beginNs), "stuck: " + what + " " + rec.op});
    }
    for (int r : g.missingRanks) {
      const int lane = laneOf(o, r);
      if (lane < 0 || firstArrival == INT64_MAX || firstArrival >= o.window.endNs) continue;
      o.stuck.push_back({lane, std::max<int64_t>(0, firstArrival - o.window.beginNs), "never entered " + what});
    }
  }
}

}  // namespace

int laneOf(const TimelineOverview& o, int rank, int thread) {
  int first = -1;
  for (size_t i = 0; i < o.lanes.size(); ++i) {
    if (o.lanes[i].rank != rank) continue;
    if (o.lanes[i].thread == thread) return static_cast<int>(i);
    if (first < 0) first = static_cast<int>(i);
  }
  return first;
}

tracedb::Result<TimelineOverview> buildTimelineOverview(tracedb::Reader& reader, const TimelineWindow& window,
                                                        const RunInfo& info, const Breakdown& breakdown,
                                                        const DesyncReport& desync, const TimelineOptions& options) {
  TimelineOverview o;
  o.window = window;
  o.runBeginNs = info.beginNs;
  o.options = options;
  auto threadRows = reader.threads();
  if (!threadRows) return threadRows.status();
  std::map<std::pair<int, int>, tracedb::ThreadInfo> threads;
  for (auto& t : *threadRows) threads[{t.rank, t.thread}] = t;
  const int expectedLanes = std::clamp(static_cast<int>(threads.size()), 1, options.maxLanes);
  const int levels = std::max(1, options.levels);
  o.rectCap = std::max<int>(options.minRectsPerLaneLevel,
                            static_cast<int>(options.rectBudget / (static_cast<int64_t>(expectedLanes) * levels)));
  NameTable names(reader, o.names, options.maxNames);

  for (const auto& rank : info.ranks) {
    std::map<int, std::vector<Item>> byThread;
    tracedb::SpanQuery q;
    q.rank = rank.rank;
    q.fromNs = window.beginNs;
    q.toNs = window.endNs;
    tracedb::Status s = reader.forEachSpan(q, [&](const tracedb::SpanRow& span) {
      byThread[span.thread].push_back({std::max(span.beginNs, window.beginNs), std::min(span.endNs(), window.endNs),
                                       span.name, names.colour(span.kind, span.name)});
      return true;
    });
    if (!s) return s;
    for (auto& [thread, items] : byThread) {
      if (static_cast<int>(o.lanes.size()) >= options.maxLanes) {
        ++o.lanesOmitted;
        continue;
      }
      TimelineLane lane;
      lane.rank = rank.rank;
      lane.thread = thread;
      lane.label = laneLabel(rank.rank, thread, threads);
      lane.spans = static_cast<int64_t>(items.size());
      const Rows rows = nest(items, options.maxRows, lane.hiddenDeep);
      lane.rows = std::max<int>(1, static_cast<int>(rows.size()));
      for (int k = 0; k < levels; ++k) {
        lane.levels.push_back(levelRects(rows, window, static_cast<int64_t>(options.baseTicks) << k, o.rectCap, names));
        o.rects += static_cast<int64_t>(lane.levels.back().size() / kRectFields);
      }
      o.spans += lane.spans;
      o.lanes.push_back(std::move(lane));
    }
  }
  addMarks(o, breakdown, desync);
  return o;
}

}  // namespace tpscope::report::html
