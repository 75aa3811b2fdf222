// Internal: unions of half-open time intervals [begin, end) in ns, and measures of their intersections with windows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace tpscope::analysis::detail {

using Interval = std::pair<int64_t, int64_t>;  // [first, second)

// A sorted union of disjoint intervals with prefix sums of their lengths, for O(log n) window measures.
class IntervalSet {
 public:
  IntervalSet() = default;
  // Takes any intervals (unsorted, overlapping, empty ones are dropped) and builds their union.
  explicit IntervalSet(std::vector<Interval> raw);
  static IntervalSet fromDisjoint(std::vector<Interval> sorted);

  // |this ∩ [a, b)|
  int64_t measure(int64_t a, int64_t b) const { return b > a ? coveredBefore(b) - coveredBefore(a) : 0; }
  int64_t total() const { return prefix_.empty() ? 0 : prefix_.back(); }
  const std::vector<Interval>& intervals() const { return iv_; }
  bool empty() const { return iv_.empty(); }

  IntervalSet intersect(const IntervalSet& o) const;
  IntervalSet subtract(const IntervalSet& o) const;  // this \ o
  IntervalSet unite(const IntervalSet& o) const;

 private:
  int64_t coveredBefore(int64_t t) const;  // |this ∩ (−∞, t)|
  void buildPrefix();
  std::vector<Interval> iv_;
  std::vector<int64_t> prefix_;  // prefix_[i] = Σ lengths of iv_[0..i]
};

}  // namespace tpscope::analysis::detail
