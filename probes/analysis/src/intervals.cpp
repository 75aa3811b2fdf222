#include "intervals.h"

namespace tpscope::analysis::detail {

namespace {

// LSD radix sort by begin (the union only needs intervals ordered by begin): 4 passes of 16 bits over the begin
// relative to the minimum; O(n) for the millions of spans of a rank, where std::sort spent most of its time.
void sortByBegin(std::vector<Interval>& v) {
  if (v.size() < 4096) {
    std::sort(v.begin(), v.end());
    return;
  }
  int64_t lo = v.front().first, hi = lo;
  for (const Interval& i : v) {
    lo = std::min(lo, i.first);
    hi = std::max(hi, i.first);
  }
  const uint64_t range = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
  std::vector<Interval> tmp(v.size());
  std::vector<size_t> count(65536 + 1);
  for (int shift = 0; shift < 64 && (range >> shift) != 0; shift += 16) {
    std::fill(count.begin(), count.end(), 0);
    auto digit = [&](const Interval& i) {
      return static_cast<size_t>(((static_cast<uint64_t>(i.first) - static_cast<uint64_t>(lo)) >> shift) & 0xffff);
    };
    for (const Interval& i : v) ++count[digit(i) + 1];
    for (size_t d = 1; d < count.size(); ++d) count[d] += count[d - 1];
    for (const Interval& i : v) tmp[count[digit(i)]++] = i;
    v.swap(tmp);
  }
}

}  // namespace

IntervalSet::IntervalSet(std::vector<Interval> raw) {
  raw.erase(std::remove_if(raw.begin(), raw.end(), [](const Interval& i) { return i.second <= i.first; }), raw.end());
  if (!std::is_sorted(raw.begin(), raw.end(), [](const Interval& a, const Interval& b) { return a.first < b.first; }))
    sortByBegin(raw);
  for (const Interval& i : raw) {
    if (!iv_.empty() && i.first <= iv_.back().second) {
      iv_.back().second = std::max(iv_.back().second, i.second);
    } else {
      iv_.push_back(i);
    }
  }
  buildPrefix();
}

IntervalSet IntervalSet::fromDisjoint(std::vector<Interval> sorted) {
  IntervalSet s;
  s.iv_ = std::move(sorted);
  s.buildPrefix();
  return s;
}

void IntervalSet::buildPrefix() {
  prefix_.resize(iv_.size());
  int64_t sum = 0;
  for (size_t i = 0; i < iv_.size(); ++i) {
    sum += iv_[i].second - iv_[i].first;
    prefix_[i] = sum;
  }
}

int64_t IntervalSet::coveredBefore(int64_t t) const {
  // First interval whose begin is >= t: everything before it counts, the one before it partially.
  auto it = std::lower_bound(iv_.begin(), iv_.end(), t, [](const Interval& i, int64_t v) { return i.first < v; });
  const size_t k = static_cast<size_t>(it - iv_.begin());
  if (k == 0) return 0;
  const Interval& last = iv_[k - 1];
  const int64_t full = prefix_[k - 1];
  return last.second > t ? full - (last.second - t) : full;
}

IntervalSet IntervalSet::intersect(const IntervalSet& o) const {
  std::vector<Interval> out;
  size_t i = 0, j = 0;
  while (i < iv_.size() && j < o.iv_.size()) {
    const int64_t a = std::max(iv_[i].first, o.iv_[j].first);
    const int64_t b = std::min(iv_[i].second, o.iv_[j].second);
    if (a < b) out.emplace_back(a, b);
    if (iv_[i].second < o.iv_[j].second) ++i;
    else ++j;
  }
  return fromDisjoint(std::move(out));
}

IntervalSet IntervalSet::subtract(const IntervalSet& o) const {
  std::vector<Interval> out;
  size_t j = 0;
  for (const Interval& iv : iv_) {
    int64_t from = iv.first;
    while (j < o.iv_.size() && o.iv_[j].second <= from) ++j;  // o's intervals that end before this piece
    for (size_t k = j; k < o.iv_.size() && o.iv_[k].first < iv.second; ++k) {
      if (o.iv_[k].first > from) out.emplace_back(from, o.iv_[k].first);
      from = std::max(from, o.iv_[k].second);
    }
    if (from < iv.second) out.emplace_back(from, iv.second);
  }
  return fromDisjoint(std::move(out));
}

IntervalSet IntervalSet::unite(const IntervalSet& o) const {
  std::vector<Interval> all;
  all.reserve(iv_.size() + o.iv_.size());
  std::merge(iv_.begin(), iv_.end(), o.iv_.begin(), o.iv_.end(), std::back_inserter(all));
  return IntervalSet(std::move(all));
}

}  // namespace tpscope::analysis::detail
