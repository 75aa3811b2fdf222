// `tpscope capture`: launches N ranks of a training program with torchrun's environment, watches them, and turns
// whatever happens — success, a hang, a crash, a stop on non-finite values, Ctrl-C — into one merged, diagnosed
// run file and an exit status that says which. docs/capture.md is the user's page.
//
// Lifecycle (runCapture: the steps of a CaptureSession in launcher.cpp, one function each — validate, prepare, spawn,
// watch, finish):
//  1. Validates everything it can before starting anything (sizes, config, --inject, --health, program).
//  2. Prepares DIR: removes the previous capture's rank-*.db, run.db and logs (nothing else), runs a TcpKvServer on
//     loopback with a fresh token (clock alignment, TPSCOPE_CLOCK_STORE and TPSCOPE_TOKEN; other local users are
//     not let in) and picks a free MASTER_PORT. With several nodes, node 0 serves that store at
//     --master-addr:--master-port + 1 instead (node_link.h: the control channel, with the job's token), the nodes
//     wait for each other (at most --rendezvous-timeout), and they share one run id and time origin; each removes
//     only its own ranks' files. The store admits the job's ranks and node captures (storeLimits()) and drops a
//     stranger that does not log in within seconds (tcp_store.h).
//  3. Spawns the ranks (posix_spawn, each in its own process group, output to DIR/logs/rank-K.log) with
//     MASTER_ADDR=127.0.0.1 MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE TPSCOPE_OUT TPSCOPE_RUN_ID
//     TPSCOPE_EPOCH_NS TPSCOPE_CLOCK_STORE TPSCOPE_TOKEN TPSCOPE_TP TPSCOPE_DP [TPSCOPE_INJECT TPSCOPE_HEALTH],
//     OMP_NUM_THREADS=1 unless set. A Python interpreter running a script is run through tpscope.run
//     (python_program.h).
//  4. Polls the rank files read-only every `pollMs` (progress, live alerts) and reaps the ranks.
//     Watchdog: no new span, collective or step on any rank for `hangTimeoutS` (at least `startupTimeoutS` until
//     every rank has finished a step) → stop (hang). A rank that fails
//     (non-zero exit or signal) → stop the others. SIGINT/SIGTERM to the launcher → stop (interrupted); a second one
//     kills at once. Stop = SIGUSR1 (dump, the recorder flushes and continues), `dumpWaitS` later SIGTERM (dump and
//     exit), `termGraceS` later SIGKILL. Live stall lines (analysis/live_stall.h): once a rank has been silent for
//     `stallAfterS`, each poll reads the ranks' frontier and says which collective who is blocked in and who has not
//     entered it; the line changes with the situation, RESUMED when it ends; run.db keeps them (alerts, kind stall).
//  5. Writes the launcher's view of each rank's end into the rank file (ranks.exit_reason, only where the launcher
//     knows more than the rank: it crashed, was stopped, or never said) — so a later `tpscope merge` keeps it —
//     merges DIR/rank-*.db into DIR/run.db, adds meta capture_* keys, runs the diagnosis and prints it; with `html`
//     it also writes the HTML report of run.db (report/html_report.h); failing that makes a successful capture
//     exit 1.
//  Several nodes: a stop on any node (watchdog, a failed rank, Ctrl-C) is posted on the control channel and every
//  node stops its ranks with the same exit status; node 0 keeps the channel up until every node's ranks have ended.
//  Each node merges its own ranks into DIR/run.db; `tpscope merge DIR0 DIR1 ...` joins the nodes' folders.
//
// Threading: runCapture runs on the calling thread and installs SIGINT/SIGTERM handlers for its duration.
#pragma once

#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace tpscope::cli::capture {

// Exit statuses of `tpscope capture` (documented in --help and docs/capture.md).
inline constexpr int kExitSuccess = 0;       // every rank finished
inline constexpr int kExitFailure = 1;       // capture itself failed (e.g. no rank wrote a trace, merge failed)
inline constexpr int kExitBadArgs = 2;       // bad arguments, config or --inject spec (also a rank refusing its config)
inline constexpr int kExitHang = 3;          // watchdog: no progress; or a rank's collective timed out / failed
inline constexpr int kExitCrash = 4;         // a rank crashed (signal, abort, runtime error)
inline constexpr int kExitNonFinite = 5;     // the ranks stopped on non-finite values (--on-nonfinite stop, ...)
inline constexpr int kExitInterrupted = 130; // Ctrl-C / SIGTERM to capture

struct CaptureOptions {
  int nproc = 0;
  int tp = 0, dp = 0;                 // 0: derived (tp = nproc / (dp·pp), dp = 1)
  int pp = 1;                         // pipeline stages (tpscope-train --pp)
  std::string schedule;               // --schedule (empty: the config's)
  std::optional<int> microbatches;    // --microbatches
  std::optional<int> virtualStages;   // --virtual-stages
  std::filesystem::path config;       // the default program needs it
  std::optional<int> steps;
  std::filesystem::path out;
  std::vector<std::string> inject;    // fault specs (fault_spec.h)
  double hangTimeoutS = 300;
  double startupTimeoutS = 60;        // the watchdog's limit until every rank has finished a step (if larger)
  double stallAfterS = 1.5;           // live stall lines (analysis/live_stall.h): blocked this long; 10 s at startup
  std::string onNonfinite;            // "", warn, skip-step, stop
  std::string health;                 // health-rule options (health_rules.h)
  std::vector<std::string> program;   // after `--`; empty: tpscope-train
  std::filesystem::path self;         // this executable (to find tpscope-train beside it)
  double dumpWaitS = 2.0;             // SIGUSR1 → SIGTERM
  double termGraceS = 5.0;            // SIGTERM → SIGKILL
  int pollMs = 250;
  int maxFindings = 12;               // printed; `tpscope diagnose` shows all
  std::filesystem::path html;         // non-empty: the HTML report of the merged run is written here
  // Many nodes (torchrun's names; node_link.h): `nproc` ranks on THIS node, global ranks nodeRank × nproc + local
  // rank, nnodes × nproc in the job. Node 0 serves the control channel at masterAddr:masterPort + 1.
  int nnodes = 1;
  int nodeRank = 0;
  std::string masterAddr;             // "": 127.0.0.1 (required with nnodes > 1)
  int masterPort = 0;                 // 0: a free loopback port (required with nnodes > 1)
  std::string token;                  // the store's token (--token, TPSCOPE_TOKEN); capture makes one if "" (node 0
                                      // prints it; one node keeps it to itself and its ranks)
  double rendezvousTimeoutS = 900;    // how long the nodes wait for each other at the start (torchrun's default)
};

// Runs a capture; returns the exit status above. Messages go to `out` (progress, alerts, diagnosis) and `err`
// (errors); `tty` selects the redrawn progress bar.
int runCapture(const CaptureOptions& options, std::FILE* out, std::FILE* err, bool tty);

// Where the default program is: beside `self`, in ../core/ (the build tree), then on PATH. Empty if not found.
std::filesystem::path findTrainProgram(const std::filesystem::path& self);
// `name` as is when it contains '/', else the first executable match on PATH. Empty if not found.
std::filesystem::path resolveProgram(const std::string& name);

}  // namespace tpscope::cli::capture
