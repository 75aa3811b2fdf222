// The live stall lines of a job still running (analysis/live_stall.h on the ranks' frontier, RunPoller::liveState):
// one line when a stall begins or its situation changes (another rank blocks, a missing rank enters), RESUMED when
// the ranks it blocked move again. Kept for the run file as alerts of kind 'stall' (critical while the job stayed
// stalled to the end, info when it resumed). Used by capture's watcher and `tpscope watch`.
//
// Threading: the caller's thread only.
#pragma once

#include <chrono>
#include <map>
#include <set>
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
  // Once a rank has ended abnormally (the job is stopping): the desyncs the ranks' files hold — every member entered
  // (G, s) with different ops, sizes or dtypes — named at once, without waiting for --stall-after: a size mismatch
  // makes Gloo abort the ranks before any of them is blocked that long. Each desync once; call on every poll while
  // the ranks are stopping (a peer's record of the collective arrives with its dump).
  std::vector<std::string> desyncsAfterEnd(RunPoller& poller);
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
  std::set<std::string> endDesyncs_;  // sites named by desyncsAfterEnd
  std::vector<Logged> log_;
};

}  // namespace tpscope::cli::capture
