#include "import_output.h"

#include <unistd.h>

#include <string>

namespace tpscope::formats::detail {

namespace fs = std::filesystem;

namespace {
void removeWithSidecars(const fs::path& path) {
  std::error_code ec;
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) fs::remove(path.string() + suffix, ec);
}
}  // namespace

ImportOutput::ImportOutput(const fs::path& output, const fs::path& dir)
    : output_(output), temp_(dir / ("." + output.filename().string() + ".tmp-" + std::to_string(::getpid()))) {
  removeWithSidecars(temp_);  // a previous import's leftover under the same pid
}

ImportOutput::~ImportOutput() {
  if (!moved_) removeWithSidecars(temp_);
}

tracedb::Status ImportOutput::moveIntoPlace() {
  std::error_code ec;
  fs::rename(temp_, output_, ec);
  if (ec)
    return tracedb::Status::error(output_.string() + ": cannot move the finished import into place: " + ec.message());
  moved_ = true;
  removeWithSidecars(temp_);  // stray sidecars only; the file itself was renamed
  return tracedb::Status::ok();
}

}  // namespace tpscope::formats::detail
