// The analyses the viewer shows, from ONE analysis::diagnose() per loaded run: its findings, their root-cause
// chain, and the reports it drew
// them from (the per-rank/step time breakdown, collective statistics and stragglers, the desync report); and the
// what-if report (analysis::analyzeWhatIf), whose critical path the timeline overlays.
//
// It reads the opened run's one file (opened_run.h), the file the views read: a capture folder's rank files are
// merged once, for both.
//
// Threading: loadAnalysis() blocks; call it on a worker thread. It opens its own Reader. A failing analysis does not
// stop the others: its error is kept in `errors` (text naming the analysis and the file).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "tpscope/analysis/breakdown.h"
#include "tpscope/analysis/chain.h"
#include "tpscope/analysis/collectives.h"
#include "tpscope/analysis/desync.h"
#include "tpscope/analysis/finding.h"
#include "tpscope/analysis/pipeline.h"
#include "tpscope/analysis/run_info.h"
#include "tpscope/analysis/whatif.h"
#include "tpscope/gui/opened_run.h"

namespace tpscope::gui {

struct AnalysisData {
  analysis::RunInfo info;
  std::vector<analysis::Finding> findings;  // most severe first
  std::vector<analysis::ChainLink> chain;   // the root-cause chain over `findings` (analysis/chain.h)
  analysis::Breakdown breakdown;
  analysis::CollectiveAnalysis collectives;
  analysis::DesyncReport desync;
  analysis::PipelineReport pipeline;  // present only for a pipeline-parallel run
  analysis::WhatIfReport whatIf;      // criticalPath empty: none (no step windows, or the analysis failed: errors)
  std::vector<std::string> errors;
};

AnalysisData loadAnalysis(const OpenedRun& run);

}  // namespace tpscope::gui
