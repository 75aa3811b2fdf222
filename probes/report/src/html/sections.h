// The HTML report's sections, one renderer per file, each returning a complete <section> element (a chart and the
// few lines of text around it). Inputs are the analyses' plain results; nothing here reads the trace.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tpscope/analysis/breakdown.h"
#include "tpscope/analysis/collectives.h"
#include "tpscope/analysis/desync.h"
#include "tpscope/analysis/diagnose.h"
#include "tpscope/analysis/run_info.h"
#include "tpscope/tracedb/records.h"

namespace tpscope::report::html {

using namespace tpscope::analysis;  // the findings and tables the page draws

struct TimelineOverview;

// <section id="ID"><h2>TITLE</h2> — the caller appends the body and "</section>".
std::string sectionStart(std::string_view id, std::string_view title);

std::string findingsSection(const DiagnoseResult& diagnosis, const RunInfo& info);            // findings_section.cpp
std::string breakdownSection(const Breakdown& breakdown);                                     // breakdown_chart.cpp
std::string gradHealthSection(const std::vector<tracedb::GradStatRow>& rows);                 // grad_heatmap.cpp
std::string communicationSection(const CollectiveAnalysis& collectives, const TimeShares& run);  // comm_chart.cpp
// Groups in the order of the findings that name them.
std::string desyncSection(const DesyncReport& desync, const std::vector<Finding>& findings);  // desync_matrix.cpp
std::string timelineSection(const TimelineOverview& overview);                                // timeline_section.cpp

}  // namespace tpscope::report::html
