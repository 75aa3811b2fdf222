// Which few steps the timeline overview shows (timeline_lod.h).
#include <algorithm>
#include <set>

#include "html/timeline_lod.h"

namespace tpscope::report::html {

TimelineWindow chooseTimelineWindow(const Breakdown& breakdown, const std::vector<Finding>& findings,
                                    const RunInfo& info, int steps) {
  TimelineWindow w;
  std::set<int> all;
  for (const auto& s : breakdown.steps)
    if (s.step >= 0) all.insert(s.step);
  const std::vector<int> sorted(all.begin(), all.end());
  const size_t n = static_cast<size_t>(std::max(1, steps));
  if (sorted.empty()) {
    w.beginNs = info.beginNs;
    w.endNs = info.endNs;
    w.reason = "the whole run";
  } else {
    size_t first = sorted.size() > n ? sorted.size() - n : 0;
    w.reason = sorted.size() > n ? "the last " + std::to_string(n) + " steps" : "every step";
    const auto focus = std::find_if(findings.begin(), findings.end(), [&](const Finding& f) { return all.count(f.step); });
    if (focus != findings.end()) {
      const size_t at = static_cast<size_t>(std::lower_bound(sorted.begin(), sorted.end(), focus->step) - sorted.begin());
      first = std::min(at > (n - 1) / 2 ? at - (n - 1) / 2 : 0, sorted.size() > n ? sorted.size() - n : 0);
      w.reason = "around step " + std::to_string(focus->step) + " of the first finding (" +
                 std::string(findingKindName(focus->kind)) + ")";
    }
    w.steps.assign(sorted.begin() + static_cast<std::ptrdiff_t>(first),
                   sorted.begin() + static_cast<std::ptrdiff_t>(std::min(sorted.size(), first + n)));
    bool any = false;
    for (const auto& s : breakdown.steps) {
      if (!std::binary_search(w.steps.begin(), w.steps.end(), s.step)) continue;
      w.beginNs = any ? std::min(w.beginNs, s.beginNs) : s.beginNs;
      w.endNs = any ? std::max(w.endNs, s.endNs) : s.endNs;
      any = true;
    }
  }
  // A little margin, so the first and last spans do not touch the edges.
  const int64_t pad = std::max<int64_t>(1, (w.endNs - w.beginNs) / 100);
  w.beginNs = std::max(info.beginNs, w.beginNs - pad);
  w.endNs = std::max(w.beginNs + 1, std::min(info.endNs > info.beginNs ? info.endNs : w.endNs + pad, w.endNs + pad));
  return w;
}

}  // namespace tpscope::report::html
