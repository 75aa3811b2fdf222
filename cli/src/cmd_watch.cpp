// `tpscope watch DIR`: command-line front of capture/job_watch.h — capture's live view and exit status for ranks that
// torchrun or srun started with TPSCOPE_OUT=DIR (docs/capture.md).
#include <unistd.h>

#include <cstdio>
#include <memory>

#include "capture/job_watch.h"
#include "command.h"

namespace tpscope::cli {

namespace {

constexpr const char* kWatchFooter = R"(
Follows the rank files (DIR/rank-K.db) of a job that tpscope capture did not start — ranks launched by torchrun or
srun with TPSCOPE_OUT=DIR — from any machine that sees DIR (a shared file system), or on each node for its own ranks
(--nproc). It prints what capture prints while the ranks run: progress, the ranks' live alerts, and the live stall
lines, seconds after the ranks block:
  WAITING  tp-0 seq 53 (embedding VocabParallel forward all-reduce, step 5): rank 0 blocked 1.7 s;
    rank 1 has not entered it (last: seq 52 ..., step 4; span "data loading" step 5, silent 1.3 s)
  DESYNC / STUCK / RESUMED  (docs/capture.md, "Live stall lines")
It reads DIR only: it never stops, signals or writes anything. Start it with the job (or before: it waits up to
--start-timeout for the files); rank files an earlier job left in DIR are ignored until this job's replace them.

Exit status (capture's, so a scheduler script can act on it):
  0    the job ended: every rank finished
  1    the rank files did not appear within --start-timeout
  2    bad arguments: DIR does not exist or is not a folder; a rank refused its config
  3    hang: no progress on any rank for --hang-timeout (the ranks are left running), or a rank's collective timed
       out or failed
  4    crash: a rank died (a crash signal, a runtime error, or its process left this host without recording its end)
  5    a rank stopped on non-finite values
  130  the ranks were stopped from outside (SIGTERM, e.g. scancel) — 3 when a stall line was open then

Example (Slurm; a shared folder):
  srun ... ./build/core/tpscope-train --config samples/configs/small.json --tp 4 --dp 2 &   # TPSCOPE_OUT=runs/job
  tpscope watch runs/job --hang-timeout 120 || scancel "$SLURM_JOB_ID"
)";

void addWatch(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<capture::WatchOptions>();
  CLI::App* sub =
      app.add_subcommand("watch",
                         "follow a job that torchrun or srun started with TPSCOPE_OUT=DIR: live "
                         "stall lines (kept in DIR/stalls.jsonl) and alerts, capture's exit status when it ends");
  sub->add_option("dir", opts->dir, "the job's TPSCOPE_OUT folder (its rank-K.db files)")->required();
  sub->add_option("--nproc,--nproc-per-node,-n", opts->nproc,
                  "follow only this many ranks: one node's folder (default: every rank of the job)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--start-timeout", opts->startTimeoutS, "seconds to wait for the ranks' files to appear")
      ->default_val(300)
      ->check(CLI::PositiveNumber);
  sub->add_option("--hang-timeout", opts->hangTimeoutS,
                  "seconds without progress on any rank before watch exits 3 (at least 60 until every rank has "
                  "finished a step)")
      ->default_val(300)
      ->check(CLI::PositiveNumber);
  sub->add_option("--startup-timeout", opts->startupTimeoutS,
                  "the hang limit until every rank has finished its first step (rendezvous, model build), if larger")
      ->default_val(60)
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--stall-after", opts->stallAfterS,
                  "seconds a rank is blocked in a collective before the live stall line names who it waits for")
      ->default_val(1.5)
      ->check(CLI::PositiveNumber);
  sub->footer(kWatchFooter);
  sub->callback([&ctx, opts] {
    opts->tty = ::isatty(STDOUT_FILENO) == 1;
    ctx.exitCode = capture::runWatch(*opts, stdout, stderr);
  });
}

}  // namespace

TPS_REGISTER_COMMAND(6, addWatch);

}  // namespace tpscope::cli
