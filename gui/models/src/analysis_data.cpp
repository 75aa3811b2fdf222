#include "tpscope/gui/analysis_data.h"

#include <unistd.h>

#include <atomic>

#include "tpscope/analysis/diagnose.h"
#include "tpscope/tracedb/merge.h"
#include "tpscope/tracedb/reader.h"

namespace tpscope::gui {

namespace fs = std::filesystem;

AnalysisData loadAnalysis(const std::vector<fs::path>& files) {
  AnalysisData out;
  if (files.empty()) return out;
  fs::path file = files.front();
  fs::path temporary;
  if (files.size() > 1) {
    static std::atomic<int> counter{0};
    std::error_code ec;
    temporary = fs::temp_directory_path(ec) /
                ("tpscope-gui-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".db");
    auto merged = tracedb::merge(files, temporary);
    if (!merged) {
      out.errors.push_back("merge: " + merged.error());
      return out;
    }
    file = temporary;
  }
  {
    auto reader = tracedb::Reader::open(file);
    if (!reader) {
      out.errors.push_back("open: " + reader.error());
    } else {
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
    }
  }
  if (!temporary.empty()) {
    std::error_code ec;
    fs::remove(temporary, ec);
    fs::remove(temporary.string() + "-wal", ec);
    fs::remove(temporary.string() + "-shm", ec);
  }
  return out;
}

}  // namespace tpscope::gui
