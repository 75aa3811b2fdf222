#include "capture/job_watch.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <fstream>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "capture/launcher.h"
#include "capture/progress_display.h"
#include "capture/run_poller.h"
#include "capture/stall_watch.h"
#include "tpscope/analysis/crash.h"
#include "tpscope/analysis/run_info.h"
#include "tpscope/analysis/stall_journal.h"
#include "tpscope/tracedb/reader.h"

namespace tpscope::cli::capture {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int64_t unixNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// How a rank ended, as capture's exit statuses rank them: a crash is the cause before a failed collective, that
// before a non-finite stop, that before a refused config; a stop from outside and a success say nothing wrong.
enum class End { Running, Ok, Stopped, BadArgs, NonFinite, Hang, Crash };

int priority(End e) {
  switch (e) {
    case End::Crash:
      return 4;
    case End::Hang:
      return 3;
    case End::NonFinite:
      return 2;
    case End::BadArgs:
      return 1;
    default:
      return 0;
  }
}

int exitCodeOf(End e) {
  switch (e) {
    case End::Ok:
      return kExitSuccess;
    case End::BadArgs:
      return kExitBadArgs;
    case End::NonFinite:
      return kExitNonFinite;
    case End::Hang:
      return kExitHang;
    case End::Crash:
      return kExitCrash;
    case End::Stopped:
      return kExitInterrupted;
    case End::Running:
      break;
  }
  return kExitFailure;
}

// A program's exit status, as tpscope-train and tpscope.run use them (docs/capture.md).
End endOfStatus(int status) {
  switch (status) {
    case 0:
      return End::Ok;
    case 2:
      return End::BadArgs;
    case 3:
      return End::Hang;
    case 5:
      return End::NonFinite;
    case 130:
      return End::Stopped;
    default:
      return End::Crash;
  }
}

// The rank's end from its exit reason: the reasons tpscope-train, tpscope.run and the recorder's signal dumps write
// ("ok", "timeout", "collective failed", "config error", "error", "exit status N", "interrupted", "signal SIGxxx").
End endOfReason(const std::string& reason) {
  if (reason == "ok") return End::Ok;
  if (reason == "timeout" || reason == "collective failed") return End::Hang;
  if (reason == "config error") return End::BadArgs;
  if (reason == "interrupted") return End::Stopped;
  // The verdicts tpscope capture writes over a rank's own reason once the rank has ended (a capture folder).
  if (reason.starts_with("stopped by")) return End::Stopped;
  if (reason.starts_with("collective timeout or failure")) return End::Hang;
  if (reason.starts_with("stopped on non-finite values")) return End::NonFinite;
  if (reason.starts_with("bad config or arguments")) return End::BadArgs;
  if (reason.starts_with("exit status ")) {
    try {
      return endOfStatus(std::stoi(reason.substr(12)));
    } catch (const std::exception&) {
      return End::Crash;
    }
  }
  if (analysis::isCrashExitReason(reason)) return End::Crash;
  for (const char* stop : {"SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1"})
    if (reason.find(stop) != std::string::npos) return End::Stopped;
  return End::Crash;  // "error" (a runtime error) or a reason of the program's own
}

// This host's name as the ranks record it (TPSCOPE_HOSTNAME where set, as the recorder does).
std::string localHost() {
  if (const char* h = std::getenv("TPSCOPE_HOSTNAME"); h != nullptr && *h != '\0') return h;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return {};
  return name;
}

// Whether process `pid` of this host is gone (no such process, or a zombie its parent has not reaped yet).
bool processGone(int64_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');  // "pid (comm) state ...": comm may hold spaces and parentheses
  if (close == std::string::npos || close + 2 >= text.size()) return false;
  const char state = text[close + 2];
  return state == 'Z' || state == 'X';
}

struct Layout {
  int firstRank = 0;
  int ranks = 0;
};

// The ranks to follow, from the first rank file of this job in `dir` (its world size; with nproc, its node's ranks).
std::optional<Layout> discoverLayout(const fs::path& dir, int nproc, int64_t notBeforeUnixNs) {
  std::map<int, fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("rank-") || !name.ends_with(".db")) continue;
    try {
      size_t used = 0;
      const std::string digits = name.substr(5, name.size() - 8);
      const int rank = std::stoi(digits, &used);
      if (used == digits.size() && rank >= 0) files[rank] = e.path();
    } catch (const std::exception&) {
    }
  }
  for (const auto& [rank, file] : files) {
    auto reader = tracedb::Reader::open(file);
    if (!reader) continue;  // still being created
    (*reader)->setBusyTimeout(50);
    auto rows = (*reader)->ranks();
    if (!rows) continue;
    int64_t epoch = 0;
    if (auto v = (*reader)->metaValue(tracedb::meta_keys::kEpochUnixNs)) epoch = std::atoll(v->c_str());
    for (const tracedb::RankInfo& row : *rows) {
      if (row.rank != rank || row.worldSize < 1) continue;
      if (row.endNs && epoch + *row.endNs < notBeforeUnixNs) continue;  // an earlier job's
      if (nproc > 0) return Layout{std::max(0, row.rank - row.localRank), nproc};
      return Layout{0, row.worldSize};
    }
  }
  return std::nullopt;
}

class WatchSession {
 public:
  WatchSession(const WatchOptions& o, std::FILE* out, std::FILE* err)
      : o_(o), out_(out), err_(err), host_(localHost()), display_(out, o.tty), stalls_(o.stallAfterS) {}

  int run();

 private:
  std::optional<int> waitForLayout();
  std::optional<int> pollOnce();
  void showAlerts(std::vector<LiveAlert>& alerts);
  void showProgress();
  void showStallLine(const std::string& line);
  std::vector<bool> processesGone() const;
  std::optional<int> judgeEnds(const std::vector<bool>& gone);
  int finish(int code, const std::string& text);
  std::FILE* noticeOut() const { return o_.noticesToErr ? err_ : out_; }

  const WatchOptions& o_;
  std::FILE* out_;
  std::FILE* err_;
  std::string host_;
  ProgressDisplay display_;
  StallWatch stalls_;
  std::optional<RunPoller> poller_;
  Clock::time_point started_ = Clock::now();
  int64_t startedUnixNs_ = unixNowNs();
  Clock::time_point lastProgress_ = Clock::now();
  std::optional<Clock::time_point> firstAbnormal_;
  bool earlierSaid_ = false;
};

int WatchSession::run() {
  std::error_code ec;
  if (!fs::exists(o_.dir, ec)) {
    fmt::print(err_, "tpscope watch: {}: no such folder\n", o_.dir.string());
    return kExitBadArgs;
  }
  if (!fs::is_directory(o_.dir, ec)) {
    fmt::print(err_, "tpscope watch: {}: not a folder (watch follows the folder a job's ranks write: TPSCOPE_OUT)\n",
               o_.dir.string());
    return kExitBadArgs;
  }
  if (auto code = waitForLayout()) return *code;
  while (true) {
    if (auto code = pollOnce()) return *code;
    std::this_thread::sleep_for(std::chrono::milliseconds(o_.pollMs));
  }
}

// Until the first rank file of this job appears (at most startTimeoutS).
std::optional<int> WatchSession::waitForLayout() {
  while (true) {
    const int64_t notBefore = o_.skipEarlierJobs ? startedUnixNs_ : 0;
    if (auto layout = discoverLayout(o_.dir, o_.nproc, notBefore)) {
      poller_.emplace(o_.dir, layout->ranks, layout->firstRank);
      poller_->setNotBefore(notBefore);
      if (o_.journal) stalls_.journalTo(analysis::stallJournalPath(o_.dir, o_.nproc > 0 ? layout->firstRank : -1));
      fmt::print(noticeOut(), "tpscope watch: following ranks {}..{} in {}\n", layout->firstRank,
                 layout->firstRank + layout->ranks - 1, o_.dir.string());
      std::fflush(noticeOut());
      lastProgress_ = Clock::now();
      return std::nullopt;
    }
    if (secondsSince(started_) > o_.startTimeoutS)
      return finish(kExitFailure, fmt::format("no rank file of a running job appeared in {} within {:g} s",
                                              o_.dir.string(), o_.startTimeoutS));
    std::this_thread::sleep_for(std::chrono::milliseconds(o_.pollMs));
  }
}

// One look at the files: alerts, progress, stall lines, the ranks' ends, the watchdog. A status when the watch ends.
std::optional<int> WatchSession::pollOnce() {
  const std::vector<bool> gone = processesGone();  // before the files: a rank gone now has written all it will
  std::vector<LiveAlert> alerts;
  if (poller_->poll(&alerts)) lastProgress_ = Clock::now();
  showAlerts(alerts);
  if (o_.progress) showProgress();

  std::vector<int> missing;
  for (int i = 0; i < poller_->ranks(); ++i) {
    const RankProgress& p = poller_->rank(i);
    if (p.earlier && !earlierSaid_) {
      fmt::print(noticeOut(),
                 "tpscope watch: {} is an earlier job's (it ended before the watch began): waiting for "
                 "this job's\n",
                 (o_.dir / fmt::format("rank-{}.db", poller_->globalRank(i))).string());
      earlierSaid_ = true;
    }
    if (!p.seen) missing.push_back(poller_->globalRank(i));
  }
  std::vector<bool> ended(gone.size());
  for (size_t i = 0; i < gone.size(); ++i) ended[i] = gone[i] || poller_->rank(static_cast<int>(i)).ended;
  for (const std::string& l : stalls_.update(*poller_, ended, poller_->completedStep() < 1)) showStallLine(l);
  std::fflush(out_);

  if (auto code = judgeEnds(gone)) return code;
  if (!missing.empty() && secondsSince(started_) > o_.startTimeoutS)
    return finish(kExitFailure, fmt::format("{} wrote no file in {} within {:g} s", analysis::rankList(missing),
                                            o_.dir.string(), o_.startTimeoutS));
  const double limit = poller_->watchdogLimitS(o_.hangTimeoutS, o_.startupTimeoutS);
  if (secondsSince(lastProgress_) > limit)
    return finish(kExitHang, fmt::format("hang: no progress on any rank for {:g} s (the ranks are left running: watch "
                                         "stops nothing)",
                                         limit));
  return std::nullopt;
}

void WatchSession::showAlerts(std::vector<LiveAlert>& alerts) {
  for (const LiveAlert& a : alerts) {
    if (o_.onAlert)
      o_.onAlert(a);
    else
      display_.message(liveAlertText(a));
  }
}

void WatchSession::showStallLine(const std::string& line) {
  if (o_.onStallLine)
    o_.onStallLine(line);
  else
    display_.message(line);
}

void WatchSession::showProgress() {
  ProgressLine line;
  line.step = poller_->completedStep();
  const RankProgress& first = poller_->rank(0);
  if (first.lastStep > 0) {
    line.loss = first.lastLoss;
    line.haveLoss = true;
  }
  if (line.step > 0) display_.update(line);
}

// For each rank on this host whose process id its file names: whether that process is gone.
std::vector<bool> WatchSession::processesGone() const {
  std::vector<bool> gone(static_cast<size_t>(poller_->ranks()), false);
  for (int i = 0; i < poller_->ranks(); ++i) {
    const RankProgress& p = poller_->rank(i);
    gone[static_cast<size_t>(i)] = p.seen && !p.ended && p.pid > 0 && p.host == host_ && processGone(p.pid);
  }
  return gone;
}

// The job's end from the ranks' ends: the first abnormal one decides — once every rank has ended, or 1 s after it
// (a failed collective is most often a crash's echo; a desync shows once the peers' dumps are in); every rank ended
// well: 0.
std::optional<int> WatchSession::judgeEnds(const std::vector<bool>& gone) {
  End worst = End::Running;
  int worstRank = -1;
  std::string worstWhy;
  bool allEnded = true, anyStopped = false;
  for (int i = 0; i < poller_->ranks(); ++i) {
    const RankProgress& p = poller_->rank(i);
    End e = End::Running;
    std::string why;
    if (p.seen && p.ended) {
      e = endOfReason(p.exitReason);
      why = p.exitReason.empty() ? "no exit reason" : p.exitReason;
    } else if (gone[static_cast<size_t>(i)]) {
      e = End::Crash;
      why = fmt::format(
          "process {} is gone without recording its end (SIGKILL, or an exit that skipped the "
          "recorder)",
          p.pid);
    }
    allEnded &= e != End::Running;
    anyStopped |= e == End::Stopped;
    if (priority(e) > priority(worst)) {
      worst = e;
      worstRank = poller_->globalRank(i);
      worstWhy = why;
    }
  }
  if (priority(worst) > 0) {
    if (!firstAbnormal_) firstAbnormal_ = Clock::now();
    for (const std::string& l : stalls_.desyncsAfterEnd(*poller_)) showStallLine(l);  // e.g. Gloo aborted on it
    if (allEnded || secondsSince(*firstAbnormal_) >= 1.0) {
      const char* what = worst == End::Crash       ? "crash"
                         : worst == End::Hang      ? "hang"
                         : worst == End::NonFinite ? "stopped on non-finite values"
                                                   : "bad config or arguments";
      return finish(exitCodeOf(worst), fmt::format("{}: rank {} ended: {}", what, worstRank, worstWhy));
    }
    return std::nullopt;
  }
  if (!allEnded) return std::nullopt;
  if (!anyStopped) return finish(kExitSuccess, fmt::format("every rank finished ({} ranks)", poller_->ranks()));
  if (stalls_.stalled())
    return finish(kExitHang, "hang: the ranks were stopped from outside (SIGTERM) while the stall above was open");
  return finish(kExitInterrupted, "the ranks were stopped from outside (SIGTERM or SIGINT)");
}

int WatchSession::finish(int code, const std::string& text) {
  if (std::string error = stalls_.writeJournal(); !error.empty())  // the final blocked times
    display_.message("warning: the stall lines are not kept in a journal: " + error);
  display_.finish();
  fmt::print(noticeOut(), "tpscope watch: {} — exit status {}\n", text, code);
  std::fflush(noticeOut());
  if (poller_) poller_->close();
  return code;
}

}  // namespace

int runWatch(const WatchOptions& options, std::FILE* out, std::FILE* err) {
  WatchSession session(options, out, err);
  return session.run();
}

}  // namespace tpscope::cli::capture
