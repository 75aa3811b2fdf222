// The live stall lines of a job still running (analysis/live_stall.h on the ranks' frontier, RunPoller::liveState):
// one line when a stall begins or its situation changes (another rank blocks, a missing rank enters), RESUMED when
// the ranks it blocked move again. Kept for the run file as alerts of kind 'stall' (critical while the job stayed
// stalled to the end, info when it resumed). Used by capture's watcher and `tpscope watch`.
//
// Threading: the caller's thread only.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "tpscope/analysis/live_stall.h"
#include "tpscope/tracedb/records.h"

namespace tpscope::cli::capture {

class RunPoller;

class StallWatch {
 public:
  explicit StallWatch(double afterS, double startupAfterS = 10.0) : afterS_(afterS), startupAfterS_(startupAfterS) {}

  // Reads the frontier when some rank has been silent long enough; returns the lines to print now. `startup`: not
  // every rank has finished a step yet (rendezvous, model build: the longer limit). `exited(i)`: the i-th rank's
  // process ended.
  std::vector<std::string> update(RunPoller& poller, const std::vector<bool>& exited, bool startup);
  // The stalls seen, as alerts for the run file (ts: when each was first named, in the files' clock).
  std::vector<tracedb::AlertRow> alerts() const;
  int stallsNamed() const { return static_cast<int>(log_.size()); }
  // Some stall named is still open (not resumed).
  bool stalled() const { return !open_.empty(); }

 private:
  struct Open {
    analysis::LiveStall stall;
    size_t logIndex = 0;
  };
  struct Logged {
    analysis::LiveStall stall;
    int64_t firstNs = 0;
    bool resumed = false;
    double resumedAfterS = 0;
  };
  double afterS_, startupAfterS_;
  std::map<std::string, Open> open_;  // by (group, seq) site
  std::vector<Logged> log_;
};

}  // namespace tpscope::cli::capture
