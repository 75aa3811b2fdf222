#include "tpscope/gui/analysis_data.h"

#include "tpscope/analysis/diagnose.h"
#include "tpscope/tracedb/reader.h"

namespace tpscope::gui {

AnalysisData loadAnalysis(const OpenedRun& run) {
  AnalysisData out;
  auto reader = tracedb::Reader::open(run.file);
  if (!reader) {
    out.errors.push_back("open: " + reader.error());
    return out;
  }
  // One diagnosis: its findings and the reports it drew them from (analysis/diagnose.h).
  auto diagnosis = analysis::diagnose(**reader);
  out.findings = std::move(diagnosis.findings);
  out.chain = std::move(diagnosis.chain);
  out.errors = std::move(diagnosis.errors);
  analysis::DiagnoseReports& reports = diagnosis.reports;
  if (reports.info) out.info = std::move(*reports.info);
  if (reports.breakdown) out.breakdown = std::move(*reports.breakdown);
  if (reports.collectives) out.collectives = std::move(*reports.collectives);
  if (reports.desync) out.desync = std::move(*reports.desync);
  if (reports.pipeline) out.pipeline = std::move(*reports.pipeline);  // the pipeline view's measured bubble
  // The what-if replay, for the critical path the timeline can overlay (its median step, as `tpscope whatif`).
  if (auto whatIf = analysis::analyzeWhatIf(**reader)) out.whatIf = std::move(*whatIf);
  else out.errors.push_back("whatif: " + whatIf.error());
  return out;
}

}  // namespace tpscope::gui
