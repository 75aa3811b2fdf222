// A self-contained HTML report of one run: what the viewer's first screen shows, as pictures, in one file that opens
// from disk in any current browser with no network access (no external scripts, styles, fonts or images; a
// Content-Security-Policy that forbids fetching anything).
//
// Sections: the diagnosis (analysis::diagnose, most severe first, severity colours); time per rank (stacked bars of
// compute / exposed communication / other / idle from the breakdown); gradient health (rank × layer by step from
// grad_stats, non-finite cells marked); communication per group (busbw against the best measured); desync and hangs
// (the member × last-seq matrix of every unhealthy group); a zoomable timeline overview of a few steps per lane, with
// the what-if critical path (analysis/whatif.h) of one of its steps outlined over the lanes it runs through.
//
// Charts are SVG written here, in C++; the timeline's zoom is a small inline script over embedded JSON whose level
// of detail is precomputed here: per lane and zoom level at most a fixed number of rectangles (narrow neighbouring
// spans merged into blocks that carry their count), so the file's size depends on lanes × levels, not on the spans
// in the run. Every name from the trace is HTML-escaped, or JSON-escaped with < > & as \u escapes inside scripts.
//
// Cost: diagnose + buildReport + analyzeWhatIf + one read of the window's spans (per rank, through the (rank,
// begin_ns) index when the file has it). Threading: uses `reader` from the calling thread only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::report {

struct TimelineOptions {
  int steps = 3;                  // steps in the overview: the first finding's step and its neighbours, else the last
  int levels = 6;                 // zoom levels 1×, 2×, … 2^(levels−1)× of the window
  int baseTicks = 1000;           // level 0's resolution across the window (level k: baseTicks · 2^k)
  int64_t rectBudget = 120'000;   // rectangles over all lanes and levels; per lane and level budget / (lanes·levels)
  int minRectsPerLaneLevel = 200; // ... but never fewer than this
  int maxLanes = 32;              // (rank, thread) lanes drawn; further lanes are counted, not drawn
  int maxRows = 8;                // nesting depth drawn per lane; deeper spans are counted, not drawn
  int maxNames = 4000;            // distinct span names kept for hover text
};

struct HtmlReportOptions {
  std::string title;      // shown in the heading; default: the run file's name
  std::string generator;  // "tpscope <version>" (tpscope::kToolName), shown in the footer
  TimelineOptions timeline;
};

// What the overview holds, for the caller's summary line and the tests.
struct HtmlReportStats {
  int64_t bytes = 0;
  int64_t windowSpans = 0;  // spans in the timeline window
  int64_t rects = 0;        // rectangles over all lanes and levels
  int lanes = 0;
  int lanesOmitted = 0;
};

struct HtmlReport {
  std::string html;
  HtmlReportStats stats;
};

// Errors (a damaged table) name the file. A failing finding analysis is not an error: diagnose reports it in the page.
tracedb::Result<HtmlReport> renderHtmlReport(tracedb::Reader& reader, const HtmlReportOptions& options = {});

// Writes `html` to a temporary file beside `output`, then renames it onto `output`: the file is complete or absent.
// Errors name `output` and say what failed.
tracedb::Status writeHtmlFile(const std::filesystem::path& output, const std::string& html);

}  // namespace tpscope::report
