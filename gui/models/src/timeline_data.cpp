#include "tpscope/gui/timeline_data.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <map>
#include <thread>
#include <unordered_set>

namespace tpscope::gui {

int64_t Viewport::endNs() const {
  return startNs + static_cast<int64_t>(std::ceil(nsPerPx * widthPx));
}

LodThresholds lodThresholds(const Viewport& viewport) {
  LodThresholds t;
  t.minNs = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(kMinVisiblePx * viewport.nsPerPx)));
  t.gapNs = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(kMergeGapPx * viewport.nsPerPx)));
  t.maxNs = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(kMaxMergePx * viewport.nsPerPx)));
  return t;
}

uint8_t majorityKind(const std::array<uint32_t, kKindCount>& counts) {
  int best = 0;
  for (int k = 1; k < kKindCount; ++k)
    if (counts[k] > counts[best]) best = k;
  return static_cast<uint8_t>(best);
}

void LaneRow::buildSummaries() {
  kindPrefix.assign(size() / kKindBlock + 1, {});
  std::array<uint32_t, kKindCount> running{};
  for (size_t i = 0; i < size(); ++i) {
    if (i % kKindBlock == 0) kindPrefix[i / kKindBlock] = running;
    running[kind[i] < kKindCount ? kind[i] : kKindCount - 1] += weight.empty() ? 1 : weight[i];
  }
  if (size() % kKindBlock == 0) kindPrefix[size() / kKindBlock] = running;
}

std::array<uint32_t, kKindCount> LaneRow::kindCounts(uint32_t first, uint32_t last) const {
  auto prefix = [&](uint32_t x) {
    auto counts = kindPrefix[x / kKindBlock];
    for (uint32_t i = x / kKindBlock * kKindBlock; i < x; ++i)
      counts[kind[i] < kKindCount ? kind[i] : kKindCount - 1] += weight.empty() ? 1 : weight[i];
    return counts;
  };
  auto a = prefix(first);
  auto b = prefix(last);
  for (int k = 0; k < kKindCount; ++k) b[k] -= a[k];
  return b;
}

namespace {

// Sorts one lane's spans and distributes them into rows by nesting depth.
void buildLane(std::vector<InputSpan>& spans, Lane& lane) {
  auto before = [](const InputSpan& a, const InputSpan& b) {
    if (a.beginNs != b.beginNs) return a.beginNs < b.beginNs;
    return a.endNs > b.endNs;  // the enclosing span first
  };
  if (!std::is_sorted(spans.begin(), spans.end(), before)) std::sort(spans.begin(), spans.end(), before);
  std::vector<int64_t> openEnds;  // stack of ends of open spans
  for (const InputSpan& s : spans) {
    while (!openEnds.empty() && openEnds.back() <= s.beginNs) openEnds.pop_back();
    const size_t depth = openEnds.size();
    if (lane.rows.size() <= depth) lane.rows.resize(depth + 1);
    lane.rows[depth].push(s.beginNs, s.endNs, s.name, s.step, s.layer, s.kind, s.phase);
    openEnds.push_back(s.endNs);
  }
  std::vector<InputSpan>().swap(spans);
  for (LaneRow& r : lane.rows) r.buildSummaries();
}

// Lanes are independent: sorts them on `workers` threads, biggest first (consumes perLane).
void buildLanes(std::vector<std::vector<InputSpan>>& perLane, std::vector<Lane>& lanes, int workers) {
  std::vector<size_t> order(perLane.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return perLane[a].size() > perLane[b].size(); });
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k; (k = next.fetch_add(1)) < order.size();) buildLane(perLane[order[k]], lanes[order[k]]);
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < std::max(1, workers); ++w) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
}

void nameLane(Lane& lane, int rank, int thread, const std::vector<tracedb::ThreadInfo>& threads) {
  lane.rank = rank;
  lane.thread = thread;
  std::string name;
  for (const auto& t : threads)
    if (t.rank == rank && t.thread == thread) name = t.name.empty() ? t.kind : t.name;
  if (name.empty()) name = thread == 0 ? "main" : "thread " + std::to_string(thread);
  lane.label = "rank " + std::to_string(rank) + " · " + name;
}

}  // namespace

TimelineData TimelineData::fromSummary(const tracedb::LaneSummary& summary, const std::vector<uint32_t>& nameMap,
                                       const std::function<int64_t(int rank)>& shiftNs,
                                       std::vector<std::string> strings,
                                       const std::vector<tracedb::ThreadInfo>& threads) {
  TimelineData data;
  data.strings_ = std::move(strings);
  data.summary_ = true;
  data.bucketNs_ = INT64_MAX;  // the finest row's
  for (const tracedb::LaneSummaryRow& in : summary.rows) data.bucketNs_ = std::min(data.bucketNs_, in.bucketNs);
  if (summary.rows.empty()) data.bucketNs_ = 0;
  data.spanCount_ = static_cast<size_t>(std::max<int64_t>(0, summary.spanCount));
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  int lastRank = INT32_MIN;
  int64_t sh = 0;
  for (const tracedb::LaneSummaryRow& in : summary.rows) {  // by rank, thread, depth
    if (data.lanes_.empty() || data.lanes_.back().rank != in.rank || data.lanes_.back().thread != in.thread) {
      data.lanes_.emplace_back();
      nameLane(data.lanes_.back(), in.rank, in.thread, threads);
    }
    if (in.rank != lastRank) {
      lastRank = in.rank;
      sh = shiftNs(in.rank);
    }
    Lane& lane = data.lanes_.back();
    if (lane.rows.size() <= static_cast<size_t>(in.depth)) lane.rows.resize(static_cast<size_t>(in.depth) + 1);
    LaneRow& r = lane.rows[static_cast<size_t>(in.depth)];
    for (const tracedb::LaneSummaryEntry& e : in.entries) {
      r.push(e.beginNs + sh, std::max(e.beginNs, e.endNs) + sh, e.name < nameMap.size() ? nameMap[e.name] : 0, e.step,
             e.layer, static_cast<uint8_t>(std::min<int>(e.kind, kKindCount - 1)), e.phase);
      r.weight.push_back(std::max<uint32_t>(1, e.count));
      lo = std::min(lo, r.begin.back());
      hi = std::max(hi, r.end.back());
    }
  }
  for (Lane& lane : data.lanes_)
    for (LaneRow& r : lane.rows) r.buildSummaries();
  data.beginNs_ = lo <= hi ? lo : 0;
  data.endNs_ = lo <= hi ? hi : 0;
  return data;
}

TimelineData TimelineData::buildWindow(const TimelineData& layout, std::vector<InputSpan> spans, int64_t fromNs,
                                       int64_t toNs, int workers) {
  TimelineData data;
  data.strings_ = layout.strings_;
  data.windowBegin_ = fromNs;
  data.windowEnd_ = toNs;
  data.lanes_.resize(layout.lanes_.size());
  std::map<std::pair<int, int>, size_t> index;
  for (size_t l = 0; l < layout.lanes_.size(); ++l) {
    data.lanes_[l].rank = layout.lanes_[l].rank;
    data.lanes_[l].thread = layout.lanes_[l].thread;
    data.lanes_[l].label = layout.lanes_[l].label;
    index[{layout.lanes_[l].rank, layout.lanes_[l].thread}] = l;
  }
  std::vector<std::vector<InputSpan>> perLane(data.lanes_.size());
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  std::pair<int, int> last{INT32_MIN, INT32_MIN};
  std::vector<InputSpan>* target = nullptr;
  for (const InputSpan& s : spans) {
    if (s.rank != last.first || s.thread != last.second) {
      last = {s.rank, s.thread};
      auto it = index.find(last);
      target = it == index.end() ? nullptr : &perLane[it->second];
    }
    if (target == nullptr) continue;
    target->push_back(s);
    ++data.spanCount_;
    lo = std::min(lo, s.beginNs);
    hi = std::max(hi, s.endNs);
  }
  std::vector<InputSpan>().swap(spans);
  data.beginNs_ = data.spanCount_ ? lo : fromNs;
  data.endNs_ = data.spanCount_ ? hi : fromNs;
  buildLanes(perLane, data.lanes_, workers);
  return data;
}

size_t TimelineData::weightIn(int64_t fromNs, int64_t toNs) const {
  size_t total = 0;
  for (const Lane& lane : lanes_)
    for (const LaneRow& r : lane.rows) {
      // Ends are sorted within a row: the first entry ending after fromNs, then every entry beginning before toNs.
      size_t i = static_cast<size_t>(std::upper_bound(r.end.begin(), r.end.end(), fromNs) - r.end.begin());
      for (; i < r.size() && r.begin[i] < toNs; ++i) total += r.weight.empty() ? 1 : r.weight[i];
    }
  return total;
}

TimelineData TimelineData::build(std::vector<InputSpan> spans, std::vector<std::string> strings,
                                 const std::vector<tracedb::ThreadInfo>& threads, int workers) {
  std::vector<std::vector<InputSpan>> chunks;
  chunks.push_back(std::move(spans));
  return build(std::move(chunks), std::move(strings), threads, workers);
}

TimelineData TimelineData::build(std::vector<std::vector<InputSpan>> chunks, std::vector<std::string> strings,
                                 const std::vector<tracedb::ThreadInfo>& threads, int workers) {
  TimelineData data;
  data.strings_ = std::move(strings);

  // Lane keys in (rank, thread) order, and a count per lane so each lane's vector is allocated once.
  std::map<std::pair<int, int>, size_t> keys;
  for (const auto& chunk : chunks) {
    // Consecutive spans usually share a lane: count runs, look the key up once per run.
    size_t i = 0;
    while (i < chunk.size()) {
      size_t j = i + 1;
      while (j < chunk.size() && chunk[j].rank == chunk[i].rank && chunk[j].thread == chunk[i].thread) ++j;
      keys[{chunk[i].rank, chunk[i].thread}] += j - i;
      i = j;
    }
  }
  std::vector<std::vector<InputSpan>> perLane(keys.size());
  {
    size_t i = 0;
    for (auto& [key, count] : keys) {
      perLane[i].reserve(count);
      data.spanCount_ += count;
      count = i++;
    }
  }
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (auto& chunk : chunks) {
    // Consecutive spans usually share a lane: look the key up only when it changes.
    std::pair<int, int> last{INT32_MIN, INT32_MIN};
    std::vector<InputSpan>* target = nullptr;
    for (const InputSpan& s : chunk) {
      if (s.rank != last.first || s.thread != last.second) {
        last = {s.rank, s.thread};
        target = &perLane[keys[last]];
      }
      target->push_back(s);
      lo = std::min(lo, s.beginNs);
      hi = std::max(hi, s.endNs);
    }
    std::vector<InputSpan>().swap(chunk);
  }
  data.beginNs_ = keys.empty() ? 0 : lo;
  data.endNs_ = keys.empty() ? 0 : hi;

  data.lanes_.resize(keys.size());
  for (const auto& [key, index] : keys) nameLane(data.lanes_[index], key.first, key.second, threads);
  buildLanes(perLane, data.lanes_, workers);
  return data;
}

namespace {

// One row of a timeline summarised at `bucketNs` (tracedb::RowSummarizer), into `out`.
void summarizeRow(const LaneRow& r, int64_t originNs, int64_t bucketNs, LaneRow& out) {
  std::vector<tracedb::LaneSummaryEntry> entries;
  tracedb::RowSummarizer summarizer(originNs, bucketNs, entries);
  for (size_t i = 0; i < r.size(); ++i)
    summarizer.add({r.begin[i], r.end[i], r.name[i], r.step[i], 1, r.layer[i], r.kind[i], r.phase[i]},
                   r.weight.empty() ? 1 : r.weight[i]);
  summarizer.finish();
  for (const auto& e : entries) {
    out.push(e.beginNs, e.endNs, e.name, e.step, e.layer, e.kind, e.phase);
    out.weight.push_back(e.count);
  }
  out.buildSummaries();
}

}  // namespace

void TimelineData::buildLevels(int workers) {
  levels_.clear();
  if (lanes_.empty() || endNs_ <= beginNs_) return;
  int64_t bucketNs = std::max<int64_t>(1, (endNs_ - beginNs_ + tracedb::kLaneSummaryBuckets - 1) /
                                              tracedb::kLaneSummaryBuckets);
  std::vector<std::pair<size_t, size_t>> rows;  // (lane, depth) of every row, for the workers
  for (size_t l = 0; l < lanes_.size(); ++l)
    for (size_t d = 0; d < lanes_[l].rows.size(); ++d) rows.emplace_back(l, d);
  for (;;) {
    auto level = std::make_shared<TimelineData>();
    level->strings_ = strings_;
    level->summary_ = true;
    level->bucketNs_ = bucketNs;
    level->spanCount_ = spanCount_;
    level->beginNs_ = beginNs_;
    level->endNs_ = endNs_;
    level->lanes_.resize(lanes_.size());
    for (size_t l = 0; l < lanes_.size(); ++l) {
      level->lanes_[l].rank = lanes_[l].rank;
      level->lanes_[l].thread = lanes_[l].thread;
      level->lanes_[l].label = lanes_[l].label;
      level->lanes_[l].rows.resize(lanes_[l].rows.size());
    }
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t k; (k = next.fetch_add(1)) < rows.size();) {
        const auto [l, d] = rows[k];
        summarizeRow(lanes_[l].rows[d], beginNs_, bucketNs, level->lanes_[l].rows[d]);
      }
    };
    std::vector<std::thread> pool;
    for (int w = 1; w < std::max(1, workers); ++w) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    size_t entries = 0;
    for (const Lane& lane : level->lanes_)
      for (const LaneRow& r : lane.rows) entries += r.size();
    // A level that holds more than an eighth of the spans saves little over the spans themselves.
    if (entries * 8 > spanCount_) break;
    levels_.push_back(std::move(level));
    if (bucketNs < 4) break;
    bucketNs /= 4;
  }
}

int TimelineData::levelFor(double nsPerPx) const {
  for (size_t i = 0; i < levels_.size(); ++i)  // coarsest first: the first whose bucket fits in a pixel
    if (static_cast<double>(levels_[i]->bucketNs_) <= nsPerPx) return static_cast<int>(i);
  return -1;
}

const std::string& TimelineData::string(uint32_t id) const {
  static const std::string kEmpty;
  return id < strings_.size() ? strings_[id] : kEmpty;
}

int TimelineData::laneOf(int rank, int thread) const {
  for (size_t i = 0; i < lanes_.size(); ++i)
    if (lanes_[i].rank == rank && lanes_[i].thread == thread) return static_cast<int>(i);
  return -1;
}

std::vector<DrawItem> TimelineData::queryRow(int laneIndex, int rowIndex, const Viewport& viewport) const {
  std::vector<DrawItem> out;
  if (laneIndex < 0 || laneIndex >= static_cast<int>(lanes_.size())) return out;
  const Lane& lane = lanes_[laneIndex];
  if (rowIndex < 0 || rowIndex >= static_cast<int>(lane.rows.size())) return out;
  const LaneRow& r = lane.rows[rowIndex];
  const LodThresholds th = lodThresholds(viewport);
  const int64_t t1 = viewport.endNs();
  const size_t n = r.size();

  size_t i = std::upper_bound(r.end.begin(), r.end.end(), viewport.startNs) - r.end.begin();
  while (i < n && r.begin[i] < t1) {
    if (r.end[i] - r.begin[i] >= th.minNs) {
      const uint32_t w = r.weight.empty() ? 1 : r.weight[i];  // a summary's bucket of several is drawn merged
      out.push_back({r.begin[i], r.end[i], static_cast<uint32_t>(i), w, r.kind[i], w > 1});
      ++i;
      continue;
    }
    size_t j = i + 1;
    int64_t runEnd = r.end[i];
    while (j < n && runEnd - r.begin[i] < th.maxNs) {
      const size_t k = std::lower_bound(r.end.begin() + j, r.end.end(), runEnd + th.gapNs) - r.end.begin();
      if (k > j) {  // (a) spans that end within the gap
        runEnd = r.end[k - 1];
        j = k;
        continue;
      }
      if (r.end[j] - r.begin[j] < th.minNs && r.begin[j] < runEnd + th.gapNs) {  // (b)
        runEnd = r.end[j];
        ++j;
        continue;
      }
      break;
    }
    const auto counts = r.kindCounts(static_cast<uint32_t>(i), static_cast<uint32_t>(j));
    out.push_back({r.begin[i], runEnd, static_cast<uint32_t>(i), static_cast<uint32_t>(j - i), majorityKind(counts),
                   true});
    i = j;
  }
  return out;
}

SpanRef TimelineData::spanAt(int laneIndex, int64_t t, int64_t slackNs) const {
  if (laneIndex < 0 || laneIndex >= static_cast<int>(lanes_.size())) return {};
  const Lane& lane = lanes_[laneIndex];
  for (int d = static_cast<int>(lane.rows.size()) - 1; d >= 0; --d) {
    const LaneRow& r = lane.rows[d];
    const size_t i = std::upper_bound(r.end.begin(), r.end.end(), t - slackNs) - r.end.begin();
    if (i < r.size() && r.begin[i] <= t + slackNs) return {laneIndex, d, static_cast<uint32_t>(i)};
  }
  return {};
}

SpanRef TimelineData::findSpan(int rank, int64_t fromNs, int64_t toNs, int layer, int phase) const {
  SpanRef best;
  int64_t bestDur = -1;
  for (size_t l = 0; l < lanes_.size(); ++l) {
    if (lanes_[l].rank != rank) continue;
    for (size_t d = 0; d < lanes_[l].rows.size(); ++d) {
      const LaneRow& r = lanes_[l].rows[d];
      for (size_t i = std::upper_bound(r.end.begin(), r.end.end(), fromNs) - r.end.begin();
           i < r.size() && r.begin[i] < toNs; ++i) {
        if (r.layer[i] != layer || (phase >= 0 && r.phase[i] != phase)) continue;
        if (r.end[i] - r.begin[i] > bestDur) {
          bestDur = r.end[i] - r.begin[i];
          best = {static_cast<int>(l), static_cast<int>(d), static_cast<uint32_t>(i)};
        }
      }
    }
  }
  return best;
}

std::vector<SpanRef> TimelineData::search(const std::string& needle, size_t limit) const {
  std::vector<SpanRef> found;
  if (needle.empty()) return found;
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::string n = lower(needle);
  std::vector<char> matches(strings_.size(), 0);
  bool any = false;
  for (size_t id = 0; id < strings_.size(); ++id)
    if (lower(strings_[id]).find(n) != std::string::npos) matches[id] = 1, any = true;
  if (!any) return found;
  for (size_t l = 0; l < lanes_.size(); ++l)
    for (size_t d = 0; d < lanes_[l].rows.size(); ++d) {
      const LaneRow& r = lanes_[l].rows[d];
      for (size_t i = 0; i < r.size(); ++i)
        if (r.name[i] < matches.size() && matches[r.name[i]])
          found.push_back({static_cast<int>(l), static_cast<int>(d), static_cast<uint32_t>(i)});
    }
  std::stable_sort(found.begin(), found.end(),
                   [&](const SpanRef& a, const SpanRef& b) { return row(a).begin[a.index] < row(b).begin[b.index]; });
  if (found.size() > limit) found.resize(limit);
  return found;
}

}  // namespace tpscope::gui
