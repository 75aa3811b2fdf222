// The analyses the viewer shows, from ONE analysis::diagnose() per loaded run: its findings, their root-cause
// chain, and the reports it drew
// them from (the per-rank/step time breakdown, collective statistics and stragglers, the desync report).
//
// A single trace file is analysed in place. A capture folder of rank files (a capture in progress) is merged into
// a temporary run file first (tracedb::merge), which is removed afterwards.
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

namespace tpscope::gui {

struct AnalysisData {
  analysis::RunInfo info;
  std::vector<analysis::Finding> findings;  // most severe first
  std::vector<analysis::ChainLink> chain;   // the root-cause chain over `findings` (analysis/chain.h)
  analysis::Breakdown breakdown;
  analysis::CollectiveAnalysis collectives;
  analysis::DesyncReport desync;
  analysis::PipelineReport pipeline;  // present only for a pipeline-parallel run
  std::vector<std::string> errors;
};

// `files`: RunData::files (one run file, or the rank files of a capture folder).
AnalysisData loadAnalysis(const std::vector<std::filesystem::path>& files);

}  // namespace tpscope::gui
