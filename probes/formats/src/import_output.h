// The run file an import writes: into a temporary file beside the output (".NAME.tmp-PID" in `dir`), moved into place
// only when complete; on every other way out the temporary and SQLite's sidecars are removed, so a failed import
// leaves nothing half-written and an existing output untouched. Used by every importer in this folder.
#pragma once

#include <filesystem>

#include "tpscope/tracedb/status.h"

namespace tpscope::formats::detail {

class ImportOutput {
 public:
  ImportOutput(const std::filesystem::path& output, const std::filesystem::path& dir);
  ~ImportOutput();
  ImportOutput(const ImportOutput&) = delete;
  ImportOutput& operator=(const ImportOutput&) = delete;

  const std::filesystem::path& temp() const { return temp_; }
  // After the writer closed: renames the temporary onto the output (then removes stray sidecars).
  tracedb::Status moveIntoPlace();

 private:
  std::filesystem::path output_, temp_;
  bool moved_ = false;
};

}  // namespace tpscope::formats::detail
