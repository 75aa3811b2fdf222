// Live view of a capture in progress: polls the ranks' files (DIR/rank-K.db) read-only, a few times a second, for
// progress (new spans, collectives, steps) and new alerts. The recorder writes them in WAL mode, so a reader sees
// every committed flush without blocking the writer. A file that does not exist yet (the rank is still starting)
// or cannot be read at the moment is simply retried at the next poll.
//
// Threading: the launcher's thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

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
  int64_t lastAlertId = 0;
  int64_t epochUnixNs = 0;     // wall-clock ns of the file's time 0 (its meta)
  std::chrono::steady_clock::time_point lastGrowth{};  // when its spans or collectives last grew (or it was opened)
};

struct LiveAlert {
  int rank = 0;
  std::string host;
  int step = -1;
  int layer = -1;
  std::string severity, kind, param, message, evidence;
};

class RunPoller {
 public:
  // Ranks firstRank .. firstRank + ranks - 1 (one node's share of a multi-node job); rank(i) is the i-th of them.
  RunPoller(std::filesystem::path dir, int ranks, int firstRank = 0);
  ~RunPoller();

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
  // Now in the files' clock (wall clock minus the epoch of the first file read).
  int64_t nowFileNs() const;
  // Closes the files (before the merge, so nothing holds them open).
  void close();

  const RankProgress& rank(int r) const { return progress_[static_cast<size_t>(r)]; }
  int ranks() const { return static_cast<int>(progress_.size()); }
  // The step every rank has finished (min over ranks of their last step; 0 before any).
  int completedStep() const;

 private:
  bool pollRank(int r, std::vector<LiveAlert>* alerts);

  std::filesystem::path dir_;
  int firstRank_ = 0;
  std::vector<RankProgress> progress_;
  std::vector<std::unique_ptr<tracedb::Reader>> readers_;
};

}  // namespace tpscope::cli::capture
