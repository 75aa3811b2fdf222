#include "tpscope/gui/opened_run.h"

#include <unistd.h>

#include <atomic>
#include <string>
#include <system_error>

#include "tpscope/analysis/stall_journal.h"
#include "tpscope/tracedb/merge.h"

namespace tpscope::gui {

namespace fs = std::filesystem;

std::vector<fs::path> traceFilesOf(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return {path};
  if (fs::exists(path / "run.db", ec)) return {path / "run.db"};
  return tracedb::rankFiles(path);
}

OpenedRun::~OpenedRun() {
  if (!merged() || file.empty()) return;
  std::error_code ec;
  for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(file.string() + suffix, ec);
}

tracedb::Result<std::shared_ptr<const OpenedRun>> openRun(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return tracedb::Status::error(path.string() + ": no such file or folder");
  auto run = std::make_shared<OpenedRun>();
  run->source = path;
  run->files = traceFilesOf(path);
  run->live = fs::is_directory(path, ec) && !(run->files.size() == 1 && run->files[0].filename() == "run.db");
  if (run->files.empty())
    return tracedb::Status::error(path.string() + ": no run.db and no rank-*.db files in this folder");
  if (!run->merged()) {
    run->file = run->files.front();
    return std::shared_ptr<const OpenedRun>(std::move(run));
  }
  static std::atomic<int> counter{0};
  const fs::path merge = fs::temp_directory_path(ec) /
                         ("tpscope-gui-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".db");
  if (auto merged = tracedb::merge(run->files, merge); !merged)
    return tracedb::Status::error(path.string() + ": cannot merge its rank files: " + merged.error());
  run->file = merge;
  // The live stall lines capture or `tpscope watch` keep in the folder, as the run file's alerts (kind 'stall'). A
  // journal that cannot be read leaves the run without them, not unopened.
  if (run->live) (void)analysis::addStallJournal(path, merge);
  return std::shared_ptr<const OpenedRun>(std::move(run));
}

}  // namespace tpscope::gui
