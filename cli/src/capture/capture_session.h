// The capture session: one `tpscope capture` (launcher.h) as an object, its steps in the order runCapture runs them.
// Internal to the capture command; its steps live in launcher.cpp (validate), session_prepare.cpp (prepare, spawn),
// session_watch.cpp (watch and the stop sequence) and session_finish.cpp (mark, merge, diagnose).
#pragma once

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "capture/interrupts.h"
#include "capture/launcher.h"
#include "capture/node_link.h"
#include "capture/progress_display.h"
#include "capture/rank_outcome.h"
#include "capture/rank_process.h"
#include "capture/run_poller.h"
#include "capture/stall_watch.h"
#include "tpscope/probes/tcp_store.h"
#include "tpscope/rules/fault_spec.h"

namespace tpscope::cli::capture {

using Clock = std::chrono::steady_clock;

// One capture in the order runCapture runs it (launcher.h): validate → prepare → spawn → watch →
// finish. A step that ends the capture early returns its exit status; std::nullopt means "go on".
class CaptureSession {
 public:
  CaptureSession(const CaptureOptions& o, std::FILE* out, std::FILE* err, bool tty)
      : o_(o), out_(out), err_(err), tty_(tty) {}

  // 1. Validates everything it can before starting anything (sizes, config, --inject, --health, program).
  std::optional<int> validate();
  // 2. Prepares DIR: removes the previous capture's rank-*.db, run.db and logs (nothing else), runs a TcpKvServer on
  //    loopback with a fresh token (clock alignment, TPSCOPE_CLOCK_STORE and TPSCOPE_TOKEN; other local users are
  //    not let in) and picks a free MASTER_PORT. With several nodes, node 0 serves that store at
  //    --master-addr:--master-port + 1 instead (node_link.h: the control channel, with the job's token), the nodes
  //    wait for each other (at most --rendezvous-timeout), and they share one run id and time origin; each removes
  //    only its own ranks' files. The store admits the job's ranks and node captures (storeLimits()) and drops a
  //    stranger that does not log in within seconds (tcp_store.h).
  std::optional<int> prepare();
  // 3. Spawns the ranks (posix_spawn, each in its own process group, output to DIR/logs/rank-K.log) with
  //    MASTER_ADDR=127.0.0.1 MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE TPSCOPE_OUT TPSCOPE_RUN_ID
  //    TPSCOPE_EPOCH_NS TPSCOPE_CLOCK_STORE TPSCOPE_TOKEN TPSCOPE_TP TPSCOPE_DP [TPSCOPE_INJECT TPSCOPE_HEALTH],
  //    OMP_NUM_THREADS=1 unless set. A Python interpreter running a script is run through tpscope.run
  //    (python_program.h).
  std::optional<int> spawn();
  // 4. Polls the rank files read-only every `pollMs` (progress, live alerts) and reaps the ranks.
  //    Watchdog: no new span, collective or step on any rank for `hangTimeoutS` (at least `startupTimeoutS` until
  //    every rank has finished a step) → stop (hang). A rank that fails (non-zero exit or signal) → stop the others.
  //    SIGINT/SIGTERM to the launcher → stop (interrupted); a second one kills at once. Stop = SIGUSR1 (dump, the
  //    recorder flushes and continues), `dumpWaitS` later SIGTERM (dump and exit), `termGraceS` later SIGKILL. Live
  //    stall lines (analysis/live_stall.h): once a rank has been silent for `stallAfterS`, each poll reads the
  //    ranks' frontier and says which collective who is blocked in and who has not entered it; the line changes
  //    with the situation, RESUMED when it ends; run.db keeps them (alerts, kind stall). Several nodes: a stop on
  //    any node is posted on the control channel and every node stops its ranks with the same exit status.
  void watch();
  // 5. Writes the launcher's view of each rank's end into the rank file (ranks.exit_reason, only where the launcher
  //    knows more than the rank: it crashed, was stopped, or never said) — so a later `tpscope merge` keeps it —
  //    merges DIR/rank-*.db into DIR/run.db, adds meta capture_* keys, runs the diagnosis and prints it; with `html`
  //    it also writes the HTML report of run.db (report/html_report.h); failing that makes a successful capture
  //    exit 1. Several nodes: node 0 keeps the channel up until every node's ranks have ended; each node merges its
  //    own ranks into DIR/run.db (`tpscope merge DIR0 DIR1 ...` joins the nodes' folders).
  int finish();

 private:
  enum class Stop { None, Dumping, Terminating, Killing };

  int bad(const std::string& why) const {
    fmt::print(err_, "tpscope capture: error: {}\n", why);
    return kExitBadArgs;
  }
  // validate
  std::optional<int> validateNodes();
  std::optional<int> resolveLayout();
  std::optional<int> resolveCommand();
  std::optional<int> parseFaultsAndHealth();
  // prepare
  std::optional<int> prepareFolder();
  std::optional<int> startStoreAndAnnounce();
  std::optional<int> connectNodes();
  void raiseOpenFileLimit(const probes::TcpKvLimits& limits);
  bool ownsRankFile(const std::string& name) const;
  // watch
  bool reapRanks();  // false once no rank runs
  void reportEndedRank(const RankProcess& p);
  void handleInterrupts();
  void pollProgress();
  void advanceStop();
  void beginStop(Outcome why, const std::string& whyText, const std::string& message);
  void showNewAlerts();
  void pollNodes();
  static double secondsSince(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  }
  // finish
  void checkRecorderWrites();
  std::vector<std::pair<std::string, std::string>> recordRankExits();
  std::optional<int> mergeRankFiles(const std::vector<std::pair<std::string, std::string>>& meta);
  void diagnose();
  void finishNodes();
  void reportStrangers();
  std::filesystem::path logOf(int rank) const { return logs_ / fmt::format("rank-{}.log", rank); }
  size_t slot(int rank) const { return static_cast<size_t>(rank - firstRank_); }  // this node's index of a rank

  const CaptureOptions& o_;
  std::FILE* out_;
  std::FILE* err_;
  bool tty_;
  // validate
  int world_ = 0, firstRank_ = 0;  // ranks in the job; this node's first global rank
  int tp_ = 0, dp_ = 0;
  bool defaultProgram_ = false;
  std::vector<std::string> argv_;
  std::optional<int> layers_, totalSteps_;
  std::vector<rules::FaultSpec> faults_;
  std::string healthText_;
  std::map<std::string, std::string> programEnv_;  // a Python program: PYTHONPATH with the tpscope package
  std::string pythonNote_;
  // prepare
  std::filesystem::path dir_, logs_, runFile_;
  std::unique_ptr<probes::TcpKvServer> store_;
  std::unique_ptr<NodeLink> link_;          // several nodes: the control channel (node_link.h)
  std::string masterAddr_ = "127.0.0.1", storeAddr_, token_;
  int masterPort_ = 0;
  int64_t epochNs_ = 0;
  std::string runId_, command_;
  // spawn, watch
  std::optional<InterruptGuard> interrupts_;
  std::vector<RankProcess> ranks_;
  std::optional<RunPoller> poller_;
  std::optional<ProgressDisplay> display_;
  std::optional<StallWatch> stalls_;
  Clock::time_point lastProgress_{}, lastPoll_{}, stopAt_{};
  std::optional<Outcome> outcome_;  // first abnormal event decides
  std::string stopWhy_;             // for the stopped ranks' exit reason
  bool remoteStop_ = false;         // another node stopped the job (not posted again)
  Stop stop_ = Stop::None;
  std::vector<bool> signaled_;
  std::vector<bool> echoed_;  // ended on its own after the stop began: an echo of the first cause, not a cause
  std::vector<bool> diedAtShutdown_;  // killed by a signal after its program returned and its recording ended "ok"
  int interruptsSeen_ = 0;
  // finish
  int code_ = kExitSuccess;
  std::string outcomeText_;
  bool traceIncomplete_ = false;
  std::vector<int> missingRanks_;  // ranks that left no rank file
};

}  // namespace tpscope::cli::capture
