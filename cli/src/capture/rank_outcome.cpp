#include "capture/rank_outcome.h"

#include <algorithm>
#include <fstream>
#include <string_view>

#include <fmt/format.h>

#include "capture/launcher.h"

namespace tpscope::cli::capture {

namespace fs = std::filesystem;

int exitCodeOf(Outcome o) {
  switch (o) {
    case Outcome::Success: return kExitSuccess;
    case Outcome::BadArgs: return kExitBadArgs;
    case Outcome::Hang: return kExitHang;
    case Outcome::Crash: return kExitCrash;
    case Outcome::NonFinite: return kExitNonFinite;
    case Outcome::Interrupted: return kExitInterrupted;
  }
  return kExitFailure;
}

Outcome outcomeOfStatus(int status) {
  for (Outcome o : {Outcome::Success, Outcome::BadArgs, Outcome::Hang, Outcome::Crash, Outcome::NonFinite,
                    Outcome::Interrupted})
    if (exitCodeOf(o) == status) return o;
  return Outcome::Crash;
}

const char* outcomeName(Outcome o) {
  switch (o) {
    case Outcome::Success: return "success";
    case Outcome::BadArgs: return "bad arguments";
    case Outcome::Hang: return "hang";
    case Outcome::Crash: return "crash";
    case Outcome::NonFinite: return "stopped on non-finite values";
    case Outcome::Interrupted: return "interrupted";
  }
  return "?";
}

Outcome outcomeOfRankExit(const ExitStatus& s) {
  if (s.signaled) return Outcome::Crash;
  switch (s.code) {
    case 0: return Outcome::Success;
    case 2: return Outcome::BadArgs;
    case 3: return Outcome::Hang;
    case 5: return Outcome::NonFinite;
    default: return Outcome::Crash;
  }
}

bool endedByOurSignal(const ExitStatus& s, bool stoppedByCapture) {
  return stoppedByCapture && (s.signaled || s.code >= 128);
}

std::string lastErrorLine(const fs::path& log) {
  std::ifstream in(log, std::ios::binary);
  if (!in) return {};
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 64 * 1024);
  in.seekg(from);
  std::string line, lastError, lastLine;
  if (from > 0) std::getline(in, line);  // a partial first line
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty()) continue;
    lastLine = line;
    if (line.find("rror") != std::string::npos || line.find("xception") != std::string::npos ||
        line.find("terminate called") != std::string::npos || line.find("FATAL") != std::string::npos)
      lastError = line;
  }
  std::string out = lastError.empty() ? lastLine : lastError;
  if (out.size() > 300) out = out.substr(0, 297) + "...";
  return out;
}

std::string rankExitReason(const ExitStatus& s, bool stoppedByCapture, const std::string& stopWhy) {
  if (endedByOurSignal(s, stoppedByCapture)) return fmt::format("stopped by capture ({})", stopWhy);
  if (s.ok()) return "ok";
  switch (outcomeOfRankExit(s)) {
    case Outcome::BadArgs: return fmt::format("bad config or arguments: {}", s.describe());
    case Outcome::Hang: return fmt::format("collective timeout or failure: {}", s.describe());
    case Outcome::NonFinite: return fmt::format("stopped on non-finite values: {}", s.describe());
    default: return fmt::format("crash: {}", s.describe());
  }
}

std::string recorderWriteFailure(const fs::path& log) {
  constexpr std::string_view kPrefix = "tpscope recorder: ";
  std::ifstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with(kPrefix)) continue;
    const std::string_view rest = std::string_view(line).substr(kPrefix.size());
    if (rest.starts_with("cannot start: ") || (rest.starts_with("flush to ") && rest.find(" failed: ") != rest.npos))
      return std::string(rest);
  }
  return {};
}

}  // namespace tpscope::cli::capture
