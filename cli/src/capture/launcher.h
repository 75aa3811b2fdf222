// `tpscope capture`: launches N ranks of a training program with torchrun's environment, watches them, and turns
// whatever happens — success, a hang, a crash, a stop on non-finite values, Ctrl-C — into one merged, diagnosed
// run file and an exit status that says which. docs/capture.md is the user's page.
//
// Design: runCapture runs the steps of one CaptureSession (capture_session.h, where each step is described):
// validate everything before starting anything → prepare DIR, the clock store and MASTER_PORT → spawn the ranks →
// watch them (progress, live alerts, hang watchdog, the stop sequence) → mark each rank's end, merge, diagnose.
// Several nodes: node 0 serves the control channel (node_link.h); a stop on any node stops every node with the same
// exit status; each node merges its own ranks.
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
  std::string onNonfinite;            // "", warn, skip-step, stop, trace-ops
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
