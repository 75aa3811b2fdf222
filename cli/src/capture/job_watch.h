// `tpscope watch DIR`: capture's watcher for a job that capture did not start — ranks that torchrun or srun launched
// with TPSCOPE_OUT=DIR (docs/capture.md). It follows DIR/rank-K.db read-only with capture's own RunPoller and
// StallWatch, prints what capture prints while ranks run (progress, live alerts, the live stall lines), and exits
// with capture's status for how the job ended (runWatch). It never signals or stops anything: the scheduler script
// that runs it acts on the status. It writes one file, the stall journal (analysis/stall_journal.h: DIR/stalls.jsonl,
// or stalls-rank<K>.jsonl when it follows one node's ranks from K on), which `tpscope merge DIR` puts into the run
// file's alerts and the viewer shows.
//
// Design: what it knows comes from the files (and, for ranks on this host, /proc): a rank has ended when its recorder
// wrote its end (ranks.end_ns, exit_reason: a final flush, a dump on SIGTERM, the crash handler), or when its
// process is gone from this host without one (SIGKILL, _Exit).
//
// Threading: runs on the calling thread.
#pragma once

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>

namespace tpscope::cli::capture {

struct LiveAlert;

struct WatchOptions {
  std::filesystem::path dir;
  // The ranks watched: every rank of the job (the world size the first file records), or with `nproc` the `nproc`
  // ranks of one node's folder (global ranks rank − local_rank of the first file onwards).
  int nproc = 0;                // ranks in DIR to follow; 0: every rank of the job
  double startTimeoutS = 300;   // how long to wait for the rank files to appear
  double hangTimeoutS = 300;    // watchdog: seconds without progress on any rank
  double startupTimeoutS = 60;  // the watchdog's limit until every rank has finished a step (if larger)
  double stallAfterS = 1.5;     // live stall lines (analysis/live_stall.h); 10 s until every rank finished a step
  int pollMs = 250;
  bool progress = true;  // print the progress line (as capture does); off: only alerts, stall lines, the end
  bool tty = false;      // redraw the progress line in place
  // Ignore rank files that ended before the watch began (off: a finished job's files are read, its end reported):
  // rank files left in DIR by an earlier job are ignored until the new job's ranks replace them.
  bool skipEarlierJobs = true;
  // Where the ranks' live alerts and the stall lines go; unset: printed to `out` as capture prints them.
  std::function<void(const LiveAlert&)> onAlert;
  std::function<void(const std::string&)> onStallLine;
  bool noticesToErr = false;  // "following ranks ...", the end: to `err` (`out` then holds alerts and stall lines only)
  bool journal = true;        // keep the stall journal in `dir` (off: write nothing, as `tpscope alerts --follow`)
};

// Follows the job in `dir` until it ends (or hangs). Lines go to `out`, errors to `err`. Returns capture's status
// for how the job ended:
//   0    every rank finished ("ok")
//   1    the rank files did not all appear within `startTimeoutS`
//   2    bad input (no such folder); a rank refused its config
//   3    hang: no progress on any rank for the watchdog's limit (capture's --hang-timeout rule), or a rank's
//        collective timed out or failed; also ranks stopped from outside (SIGTERM) while a stall was open
//   4    crash: a rank died (a crash signal, a runtime error, gone without recording its end)
//   5    a rank stopped on non-finite values
//   130  the ranks were stopped from outside (SIGTERM, SIGINT) with no stall open
// The first abnormal end decides, once every rank has ended or 1 s after it: a failed collective is most often a
// peer's echo, so the watch waits for a crash to show (as capture does), and a desync the ranks died on (Gloo aborts
// on a size mismatch) is named from their dumps (StallWatch::desyncsAfterEnd).
int runWatch(const WatchOptions& options, std::FILE* out, std::FILE* err);

}  // namespace tpscope::cli::capture
