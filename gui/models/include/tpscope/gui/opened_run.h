// One opened run: the one file the viewer's views (loadRun, run_data.h) and its analysis (loadAnalysis,
// analysis_data.h) both read, so that every number the viewer shows comes from one source. A run file or a single
// rank file is read in place; the rank files of a capture folder are merged once (tracedb::merge, the merge
// `tpscope merge` and capture's end write with) into a temporary run file, removed with the last reference to it.
//
// Threading: openRun() blocks (the merge) and may run on any thread; an OpenedRun is immutable and shared.
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "tpscope/tracedb/status.h"

namespace tpscope::gui {

struct OpenedRun {
  std::filesystem::path source;              // what was opened
  std::vector<std::filesystem::path> files;  // its trace files: a run file, or the rank files of a capture folder
  std::filesystem::path file;                // the one file read: files[0], or the temporary merge of `files`
  bool live = false;                         // a capture folder of rank files (a capture in progress)
  bool merged() const { return files.size() > 1; }

  OpenedRun() = default;
  OpenedRun(const OpenedRun&) = delete;
  OpenedRun& operator=(const OpenedRun&) = delete;
  ~OpenedRun();  // removes the temporary merge
};

// What loadRun would read for `path`: the run file, or the rank files of a folder. Empty if nothing readable is there.
std::vector<std::filesystem::path> traceFilesOf(const std::filesystem::path& path);

// Opens `path` (a run file, a rank file, or a capture folder: DIR/run.db when it exists, else DIR/rank-*.db). Errors
// name the path: nothing there, no trace files in the folder, or the merge's refusal (files of different runs, a rank
// twice).
tracedb::Result<std::shared_ptr<const OpenedRun>> openRun(const std::filesystem::path& path);

}  // namespace tpscope::gui
