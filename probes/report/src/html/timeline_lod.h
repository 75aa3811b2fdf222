// The timeline overview's data: which time window to show, and each lane's spans in it reduced, per zoom level, to
// at most a fixed number of rectangles.
//
// Window: the steps (of every rank's step windows, breakdown.h) around the first finding that names a step — the
// root cause, findings being sorted most severe first — else the last `steps` steps; a run without steps: its
// whole extent.
//
// Level of detail, per lane (rank, thread) and nesting row (depth by a stack over spans sorted by begin, longer
// first, so within a row spans do not overlap), in the manner of the viewer's: level k divides the window into
// T = baseTicks · 2^k ticks; a span at least m ticks wide (m = 2 to start) is a rectangle of its own, narrower
// neighbours less than m ticks apart merge into one block at most 3m ticks wide that carries their count and its
// majority colour. When a lane's level holds more than its budget, m doubles until it fits, so a lane and level never
// exceed the budget and a dense lane shows coarser blocks rather than a bigger file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tpscope/analysis/breakdown.h"
#include "tpscope/analysis/desync.h"
#include "tpscope/analysis/finding.h"
#include "tpscope/report/html_report.h"
#include "tpscope/analysis/run_info.h"
#include "tpscope/analysis/whatif.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::report::html {

using namespace tpscope::analysis;  // the findings and tables the page draws

struct TimelineWindow {
  int64_t beginNs = 0, endNs = 0;
  std::vector<int> steps;  // empty: the whole run
  std::string reason;      // "around the first finding's step 5", "the last 3 steps", "the whole run"
};

TimelineWindow chooseTimelineWindow(const Breakdown& breakdown, const std::vector<Finding>& findings,
                                    const RunInfo& info, int steps);

// One lane's rectangles at one level, flattened: x, w (ticks of that level), row, colour (palette::colour index),
// name (≥ 0: index into TimelineOverview::names; < 0: −(number of spans merged), −1 also for a span whose name was
// not kept).
inline constexpr int kRectFields = 5;

struct TimelineLane {
  int rank = 0, thread = 0;
  std::string label;  // "rank 3 · main", "rank 3 · stream 7"
  int rows = 1;
  int64_t spans = 0;       // spans of this lane in the window
  int64_t hiddenDeep = 0;  // deeper than TimelineOptions::maxRows
  std::vector<std::vector<int32_t>> levels;
};

struct TimelineMark {
  int lane = 0;
  int64_t ns = 0;  // from the window's begin
  std::string text;
};

// One stretch of the what-if critical path (analysis::WhatIfSegment) on a lane of the overview, cut to the window.
struct TimelineCriticalSegment {
  int lane = 0;
  int64_t ns = 0, lenNs = 0;  // from the window's begin; its extent (merged pieces: first start to last end)
  bool transfer = false;      // a collective's transfer, else a lane's work
  std::string text;           // hover text: "compute on rank 1 · 40.000 ms", "transfer tp-0 all_reduce · 2.000 ms"
};

struct TimelineOverview {
  TimelineWindow window;
  int64_t runBeginNs = 0;
  TimelineOptions options;
  int rectCap = 0;  // per lane and level
  std::vector<TimelineLane> lanes;
  std::vector<std::string> names;
  std::vector<std::pair<int, int64_t>> stepMarks;  // (step, ns from the window's begin), first rank's windows
  std::vector<TimelineMark> stuck;                 // stuck collectives and ranks that never entered them
  std::vector<TimelineCriticalSegment> critical;   // the critical path's stretches in the window (addCriticalPath)
  std::string criticalText;                        // analysis::criticalPathSummary; "": no critical path drawn
  int64_t spans = 0, rects = 0;
  int lanesOmitted = 0;
};

// The overview's lane of (rank, thread): that lane, else the rank's first (thread −1: the rank's first); −1: none drawn.
int laneOf(const TimelineOverview& o, int rank, int thread = -1);

// Puts the what-if critical path (critical_path_overlay.cpp) on the overview's lanes: each segment on its lane, cut
// to the window; none when the report lists no path or none of it lies in the window.
void addCriticalPath(TimelineOverview& o, const WhatIfReport& whatIf);

tracedb::Result<TimelineOverview> buildTimelineOverview(tracedb::Reader& reader, const TimelineWindow& window,
                                                        const RunInfo& info, const Breakdown& breakdown,
                                                        const DesyncReport& desync, const TimelineOptions& options);

}  // namespace tpscope::report::html
