#include "intervals.h"

namespace tpscope::analysis::detail {

IntervalSet::IntervalSet(std::vector<Interval> raw) {
  raw.erase(std::remove_if(raw.begin(), raw.end(), [](const Interval& i) { return i.second <= i.first; }), raw.end());
  if (!std::is_sorted(raw.begin(), raw.end())) std::sort(raw.begin(), raw.end());
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

IntervalSet IntervalSet::unite(const IntervalSet& o) const {
  std::vector<Interval> all;
  all.reserve(iv_.size() + o.iv_.size());
  std::merge(iv_.begin(), iv_.end(), o.iv_.begin(), o.iv_.end(), std::back_inserter(all));
  return IntervalSet(std::move(all));
}

}  // namespace tpscope::analysis::detail
