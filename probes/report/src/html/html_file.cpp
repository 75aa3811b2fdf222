// writeHtmlFile: a temporary file beside the output, renamed onto it when complete (html_report.h).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>

#include "tpscope/report/html_report.h"

namespace tpscope::report {

tracedb::Status writeHtmlFile(const std::filesystem::path& output, const std::string& html) {
  namespace fs = std::filesystem;
  const fs::path dir = output.has_parent_path() ? output.parent_path() : fs::path(".");
  const fs::path temp = dir / ("." + output.filename().string() + ".tmp-" + std::to_string(::getpid()));
  auto fail = [&](const std::string& what, int err) {
    std::error_code ec;
    fs::remove(temp, ec);
    return tracedb::Status::error(output.string() + ": " + what + ": " + std::strerror(err));
  };
  if (output.filename().empty()) return tracedb::Status::error(output.string() + ": not a file name");
  std::FILE* f = std::fopen(temp.c_str(), "wb");
  if (!f) return fail("cannot create the report", errno);
  const bool written = std::fwrite(html.data(), 1, html.size(), f) == html.size();
  const int writeErr = errno;
  if (std::fclose(f) != 0 || !written) return fail("cannot write the report", written ? errno : writeErr);
  std::error_code ec;
  fs::rename(temp, output, ec);
  if (ec) return fail("cannot move the report into place", ec.value());
  return tracedb::Status::ok();
}

}  // namespace tpscope::report
