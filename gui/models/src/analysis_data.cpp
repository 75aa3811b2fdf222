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
      tracedb::Reader& r = **reader;
      if (auto info = analysis::loadRunInfo(r)) out.info = std::move(*info);
      else out.errors.push_back("run info: " + info.error());
      auto diagnosis = analysis::diagnose(r);
      out.findings = std::move(diagnosis.findings);
      for (auto& e : diagnosis.errors) out.errors.push_back(std::move(e));
      if (auto b = analysis::computeBreakdown(r)) out.breakdown = std::move(*b);
      else out.errors.push_back("breakdown: " + b.error());
      if (auto c = analysis::analyzeCollectives(r, out.info)) out.collectives = std::move(*c);
      else out.errors.push_back("collectives: " + c.error());
      if (auto d = analysis::analyzeDesync(r, out.info)) out.desync = std::move(*d);
      else out.errors.push_back("desync: " + d.error());
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
