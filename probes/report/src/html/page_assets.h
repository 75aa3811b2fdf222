// The HTML report's inline style sheet and script. Both are the page's own: no external resource is referenced, and
// the page's Content-Security-Policy (html_report.cpp) forbids loading any.
#pragma once

#include <string_view>

namespace tpscope::report::html {

extern const std::string_view kStyle;
// Draws the timeline overview from #tl-data into #tl-svg (format in timeline_section.cpp) and handles zoom, pan and
// hover. Reports its state for tests and automation: body[data-report-state] = "ready" | "error",
// body[data-timeline-rects] = rectangles drawn; an uncaught error is also written into #js-errors.
extern const std::string_view kScript;

}  // namespace tpscope::report::html
