// The what-if critical path on the timeline overview's lanes (timeline_lod.h): where each stretch lies, cut to the
// window, with its hover text. The timeline section writes it into the overview's JSON and its legend.
#include <algorithm>

#include "html/timeline_lod.h"
#include "tpscope/analysis/units_text.h"

namespace tpscope::report::html {

void addCriticalPath(TimelineOverview& o, const WhatIfReport& whatIf) {
  for (const WhatIfSegment& s : whatIf.criticalPath) {
    const int lane = laneOf(o, s.rank, s.thread);
    const int64_t begin = std::max(s.startNs, o.window.beginNs), end = std::min(s.endNs, o.window.endNs);
    if (lane < 0 || end < begin) continue;
    const bool transfer = s.kind == "transfer";
    std::string text = transfer ? "transfer " + s.what : "compute on rank " + std::to_string(s.rank);
    text += " · " + text::ms(static_cast<double>(s.durNs)) + " ms on the critical path";
    if (s.count > 1) text += " (" + std::to_string(s.count) + " stretches)";
    o.critical.push_back({lane, begin - o.window.beginNs, end - begin, transfer, std::move(text)});
  }
  if (!o.critical.empty()) o.criticalText = criticalPathSummary(whatIf);
}

}  // namespace tpscope::report::html
