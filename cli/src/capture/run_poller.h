// Live view of a capture in progress: polls the ranks' files (DIR/rank-K.db) read-only, a few times a second, for
// progress (new spans, collectives, steps) and new alerts. The recorder writes them in WAL mode, so a reader sees
// every committed flush without blocking the writer. A file that does not exist yet (the rank is still starting)
// or cannot be read at the moment is simply retried at the next poll. A file replaced by a new one (a new job writing
// into the same folder: the recorder removes and recreates it) is reopened. Used by `tpscope capture`'s watcher and
// by `tpscope watch` (capture/job_watch.h), which learns the ranks' ends from the files alone.
//
// Threading: the caller's thread only.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tpscope/tracedb/records.h"

namespace tpscope::tracedb {
class Reader;
}
namespace tpscope::analysis {
struct LiveGroup;
struct LiveRankState;
}

namespace tpscope::cli::capture {

struct RankProgress {
  bool seen = false;           // the file has been opened at least once
  std::string host;
  int64_t maxSpanId = 0;       // progress signature: grows with every flushed span ...
  int64_t maxCollectiveId = 0; // ... collective ...
  int lastStep = 0;            // ... and step (step_stats)
  double lastLoss = 0;
  int64_t tokens = 0;          // tokens of the rank's last step
  int64_t lastStepEndNs = 0;   // file ns
  double meanStepNs = 0;       // over the last (up to 8) steps
  int64_t medianStepNs = 0;    // median duration of the last (up to 9) steps
  int64_t lastAlertId = 0;
  int64_t epochUnixNs = 0;     // wall-clock ns of the file's time 0 (its meta)
  std::chrono::steady_clock::time_point lastGrowth{};  // when its spans or collectives last grew (or it was opened)
  // The rank's own account of itself (its ranks row, read every poll).
  int64_t pid = 0;
  int worldSize = 0;           // 0 until the row is written
  int localRank = 0;
  bool ended = false;          // the recorder wrote the rank's end (ranks.end_ns): a final flush, a dump on a signal
  std::string exitReason;      // ranks.exit_reason: "ok", "timeout", "signal SIGABRT", ...
  int64_t endUnixNs = 0;       // wall-clock ns of that end
  bool earlier = false;        // the file is an earlier job's (ended before notBefore): ignored until replaced
};

// A rank's alert as its file holds it (the rank's global number in row.rank), with the rank's host.
struct LiveAlert {
  tracedb::AlertRow row;
  std::string host;
};

class RunPoller {
 public:
  // Ranks firstRank .. firstRank + ranks - 1 (one node's share of a multi-node job); rank(i) is the i-th of them.
  RunPoller(std::filesystem::path dir, int ranks, int firstRank = 0);
  ~RunPoller();

  // A rank file whose rank ended before this wall-clock time (ns) is an earlier job's left in the folder: it is not
  // read (the rank counts as not started) until a new file replaces it. 0 (the default): every file is read.
  void setNotBefore(int64_t unixNs) { notBeforeUnixNs_ = unixNs; }

  // Reads every rank file once. Returns true when some rank recorded a new span, collective or step since the
  // previous poll. New alerts are appended to `alerts`, ordered by step, then rank.
  bool poll(std::vector<LiveAlert>* alerts);
  // How long the quietest rank's records have not grown (0 before any file was read).
  std::chrono::nanoseconds longestQuiet() const;
  // The ranks' frontier for the live stall diagnosis (analysis/live_stall.h): each watched rank's newest collective
  // per group, its last span, how long it has been silent; and the groups the files know. `exited(i)`: whether the
  // i-th rank's process has ended. Reads a few rows per group per rank file.
  void liveState(const std::vector<bool>& exited, std::vector<analysis::LiveGroup>* groups,
                 std::vector<analysis::LiveRankState>* ranks);
  // The files' clock: the Unix epoch of the first file read (0 before any); now on that clock.
  int64_t epochUnixNs() const;
  int64_t nowFileNs() const;
  // Closes the files (before the merge, so nothing holds them open).
  void close();

  const RankProgress& rank(int r) const { return progress_[static_cast<size_t>(r)]; }
  // The i-th rank's exit reason as its file says now (its own "ok" once its program returned; "" before its end or
  // when its file cannot be read): read again, not the last poll's.
  std::string exitReasonNow(int r);
  int ranks() const { return static_cast<int>(progress_.size()); }
  int globalRank(int r) const { return firstRank_ + r; }
  // The step every rank has finished (min over ranks of their last step; 0 before any).
  int completedStep() const;
  // The hang watchdog's limit in seconds: `hangTimeoutS`, but at least `startupTimeoutS` until every rank has
  // finished a step (rendezvous, model build).
  double watchdogLimitS(double hangTimeoutS, double startupTimeoutS) const;

 private:
  bool pollRank(int r, std::vector<LiveAlert>* alerts);
  // Opens rank slot r's file when it exists (again when a new file replaced it); false while there is none to read.
  bool openRank(int r);
  void readRankRow(int r);

  struct FileId {
    dev_t dev = 0;
    ino_t ino = 0;
    bool operator==(const FileId&) const = default;
  };

  std::filesystem::path dir_;
  int firstRank_ = 0;
  int64_t notBeforeUnixNs_ = 0;
  std::vector<FileId> fileIds_;  // of the file each reader has open (or of an earlier job's file, ignored)
  std::vector<RankProgress> progress_;
  std::vector<std::unique_ptr<tracedb::Reader>> readers_;
};

// One live alert as capture and watch print it (report/findings_text.h's layout).
std::string liveAlertText(const LiveAlert& a);

}  // namespace tpscope::cli::capture
