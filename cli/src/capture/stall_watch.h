// The live stall lines of a job still running (analysis/live_stall.h on the ranks' frontier, RunPoller::liveState):
// one line when a stall begins or its situation changes (another rank blocks, a missing rank enters), RESUMED when
// the ranks it blocked move again. Kept for the run file as alerts of kind 'stall' (critical while the job stayed
// stalled to the end, info when it resumed). Used by capture's watcher and `tpscope watch`. With a journal
// (journalTo), the alerts are written to it as they change (analysis/stall_journal.h: DIR/stalls.jsonl), for merge
// and the viewer, and so that a watcher killed mid-run leaves the lines it printed.
//
// Threading: the caller's thread only.
#pragma once

#include <chrono>
#include <filesystem>
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
  // Keeps the journal `file` current from now on: rewritten whenever a line is printed or a stall resumes, and once
  // a second while a stall is open (its blocked time). A file already there is an earlier job's: removed. A failed
  // write returns one warning line (then it retries).
  void journalTo(std::filesystem::path file);
  // Writes the journal now (the job has ended); an error message, or "" (also without a journal).
  std::string writeJournal();
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
  // Writes the journal when the log changed or an open stall's time is a second stale; a warning line on failure.
  void keepJournal(bool changed, int64_t nowNs, std::vector<std::string>& lines);

  double afterS_, startupAfterS_;
  std::filesystem::path journal_;
  int64_t epochUnixNs_ = 0;        // the files' clock (RunPoller::epochUnixNs) at the last update
  int64_t journalWrittenNs_ = -1;  // when the journal was last written, in the files' clock
  bool journalWarned_ = false;
  std::map<std::string, Open> open_;  // by (group, seq) site
  std::set<std::string> endDesyncs_;  // sites named by desyncsAfterEnd
  std::vector<Logged> log_;
};

}  // namespace tpscope::cli::capture
