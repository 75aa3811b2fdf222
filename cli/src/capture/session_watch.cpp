#include <signal.h>

#include <algorithm>
#include <thread>

#include "capture/capture_session.h"
#include "tpscope/analysis/stall_journal.h"

namespace tpscope::cli::capture {

// ---- 4. watch -------------------------------------------------------------------------------------------------------
// Until every rank has ended: reap, react to Ctrl-C, poll progress and alerts (the hang watchdog), run the stop
// sequence.
void CaptureSession::watch() {
  poller_.emplace(dir_, o_.nproc, firstRank_);
  display_.emplace(out_, tty_);
  stalls_.emplace(o_.stallAfterS);
  stalls_->journalTo(analysis::stallJournalPath(dir_));
  lastProgress_ = Clock::now();
  lastPoll_ = lastProgress_ - std::chrono::hours(1);
  signaled_.assign(static_cast<size_t>(o_.nproc), false);
  echoed_.assign(static_cast<size_t>(o_.nproc), false);
  diedAtShutdown_.assign(static_cast<size_t>(o_.nproc), false);
  while (reapRanks()) {
    handleInterrupts();
    if (Clock::now() - lastPoll_ >= std::chrono::milliseconds(o_.pollMs)) {
      pollProgress();
      pollNodes();
    }
    advanceStop();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  showNewAlerts();  // one last look for alerts written at the very end
  for (const std::string& l : stalls_->desyncsAfterEnd(*poller_)) display_->message(l);  // ranks that died on one
  if (std::string error = stalls_->writeJournal(); !error.empty())  // the final blocked times, for the merge
    display_->message("warning: the stall lines are not kept in a journal: " + error);
  display_->finish();
  poller_->close();
}

void CaptureSession::beginStop(Outcome why, const std::string& whyText, const std::string& message) {
  if (stop_ != Stop::None) {
    if (!outcome_) outcome_ = why;
    return;
  }
  stopWhy_ = whyText;
  std::string shown = message;
  // Several nodes: the job's first abnormal event is the first stop claimed on the control channel, whichever node
  // saw it. When another node's claim came first, its cause is the job's (ours is likely its echo).
  if (link_ && !remoteStop_) {
    const auto first = link_->claimStop(exitCodeOf(why), fmt::format("node {}: {}", o_.nodeRank, whyText));
    if (first && first->node != o_.nodeRank) {
      remoteStop_ = true;
      why = outcomeOfStatus(first->exitStatus);
      stopWhy_ = first->why;
      shown += fmt::format("\n  node {} stopped the job first ({}): that is the cause", first->node, first->why);
    }
  }
  if (!outcome_) outcome_ = why;
  display_->message(shown);
  stop_ = Stop::Dumping;
  stopAt_ = Clock::now();
  for (auto& p : ranks_) {
    if (!p.running()) continue;
    p.signal(SIGUSR1);
    signaled_[slot(p.rank())] = true;
  }
}

// Reaps the ranks that ended. When several are found ended in one look, the likeliest first cause goes first: a rank
// killed by a signal, then one failing on its own with an error status (often a peer lost outside a collective: a
// store read, a group being built), then one whose collective failed because a peer was gone.
bool CaptureSession::reapRanks() {
  std::vector<RankProcess*> ended;
  for (auto& p : ranks_)
    if (p.poll()) ended.push_back(&p);
  // A collective that failed (exit 3) is most often a peer's echo: a rank leaving on an error closes its Gloo
  // connections while it unwinds, before its own exit is seen. Give the cause a moment to end too.
  auto collectiveFailure = [this](const RankProcess* p) {
    return !signaled_[slot(p->rank())] && outcomeOfRankExit(*p->status()) == Outcome::Hang;
  };
  if (stop_ == Stop::None && !ended.empty() && std::all_of(ended.begin(), ended.end(), collectiveFailure)) {
    for (const auto until = Clock::now() + std::chrono::milliseconds(1000); Clock::now() < until;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      bool other = false;
      for (auto& p : ranks_)
        if (p.poll()) {  // true only for a rank that ended in this call
          ended.push_back(&p);
          other |= !collectiveFailure(&p);
        }
      if (other) break;
    }
  }
  auto causeRank = [](const RankProcess* p) {
    if (p->status()->signaled) return 0;
    switch (outcomeOfRankExit(*p->status())) {
      case Outcome::Crash: return 1;
      case Outcome::NonFinite: return 2;
      case Outcome::BadArgs: return 3;
      default: return 4;
    }
  };
  std::stable_sort(ended.begin(), ended.end(),
                   [&](const RankProcess* a, const RankProcess* b) { return causeRank(a) < causeRank(b); });
  for (const RankProcess* p : ended) reportEndedRank(*p);
  return std::any_of(ranks_.begin(), ranks_.end(), [](const RankProcess& p) { return p.running(); });
}

// A rank that failed on its own (not stopped by us): say so with its log's last lines and stop the others.
void CaptureSession::reportEndedRank(const RankProcess& p) {
  const ExitStatus& s = *p.status();
  if (s.ok()) return;
  // Its program returned and its recorder ended the recording "ok" (written by the rank itself), and only then did a
  // signal end the process: its runtime's shutdown, not its training. PyTorch's Gloo worker threads, releasing a
  // finished collective's tensors while Python finalizes, abort the process now and then ("terminate called without
  // an active exception"). The run is complete: a warning, no stop, the rank's "ok" kept.
  if (s.signaled && !signaled_[slot(p.rank())] && stop_ == Stop::None &&
      poller_->exitReasonNow(static_cast<int>(slot(p.rank()))) == "ok") {
    diedAtShutdown_[slot(p.rank())] = true;
    std::string msg = fmt::format(
        "warning: rank {} (pid {}) finished its program and its recording, then was killed by {} while shutting down "
        "(after training: its records are complete)",
        p.rank(), p.pid(), signalName(s.signal));
    if (const std::string line = lastErrorLine(logOf(p.rank())); !line.empty())
      msg += fmt::format("\n  {} ends with: {}", logOf(p.rank()).string(), line);
    display_->message(msg);
    return;
  }
  const Outcome oc = outcomeOfRankExit(s);
  // The job is already stopping on an earlier rank's end and this one dies too (an error status, Gloo taking the
  // process down): it went down with the first cause, its peer gone — also when our dump request reached it first
  // (a rank still in its rendezvous loses the store with rank 0 and exits 1). A status of its own (3, 5) keeps its
  // reason.
  if (stop_ != Stop::None && oc == Outcome::Crash) echoed_[slot(p.rank())] = true;
  if (signaled_[slot(p.rank())]) return;
  // Several nodes: a rank that fails is often the echo of a peer lost on another node (its collective fails, or
  // Gloo takes the process down). The node that saw the cause gets a moment to claim the stop first; every node
  // waits the same, so the first to see a failure is the first to claim.
  for (const auto until = Clock::now() + std::chrono::milliseconds(1500);
       link_ && stop_ == Stop::None && Clock::now() < until;) {
    pollNodes();
    if (stop_ == Stop::None) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::string msg = fmt::format("rank {} (pid {}) ended: {}", p.rank(), p.pid(), s.describe());
  if (oc == Outcome::Hang) msg += " (collective timeout or failure)";
  if (oc == Outcome::NonFinite) msg += " (stopped on non-finite values)";
  if (oc == Outcome::BadArgs) msg += " (refused its arguments or config)";
  const std::string tail = tailOfFile(logOf(p.rank()), 8);
  if (!tail.empty()) {
    msg += fmt::format("\n  last lines of {}:", logOf(p.rank()).string());
    std::string_view t = tail;
    while (!t.empty()) {
      const size_t nl = t.find('\n');
      msg += "\n    " + std::string(t.substr(0, nl));
      if (nl == std::string_view::npos) break;
      t.remove_prefix(nl + 1);
    }
  }
  bool others = false;
  for (auto& q : ranks_) others |= q.running();
  if (others && stop_ == Stop::None) msg += "\n  dumping and stopping the other ranks";
  const std::string how = s.signaled ? "by " + signalName(s.signal) : s.describe();
  beginStop(oc, fmt::format("after rank {} ended: {}", p.rank(), how), msg);
}

// Ctrl-C / SIGTERM to capture: the first one dumps and stops the ranks, a second one kills them at once.
void CaptureSession::handleInterrupts() {
  const int interruptsNow = interruptsReceived();
  if (interruptsNow <= interruptsSeen_) return;
  if (stop_ == Stop::None) {
    beginStop(Outcome::Interrupted, "interrupted", "interrupted — dumping all ranks (again to kill them now)");
    outcome_ = Outcome::Interrupted;
  } else if (interruptsSeen_ > 0 || stop_ != Stop::Dumping) {
    for (auto& p : ranks_) p.signal(SIGKILL);
    stop_ = Stop::Killing;
  }
  interruptsSeen_ = interruptsNow;
}

void CaptureSession::showNewAlerts() {
  std::vector<LiveAlert> alerts;
  if (poller_->poll(&alerts)) lastProgress_ = lastPoll_;
  for (const auto& a : alerts) display_->message(liveAlertText(a));
}

// Several nodes: another node's stop (its watchdog, a failed rank, Ctrl-C there) or the loss of node 0 stops this
// node's ranks too, with the same exit status.
void CaptureSession::pollNodes() {
  if (!link_ || stop_ != Stop::None) return;
  bool lost = false;
  const std::optional<RemoteStop> stop = link_->pollStop(&lost);
  if (stop) {
    remoteStop_ = true;
    beginStop(outcomeOfStatus(stop->exitStatus), stop->why, fmt::format("node {} stopped the job ({}) — dumping and stopping this node's ranks",
                                          stop->node, stop->why));
  } else if (lost) {
    remoteStop_ = true;
    beginStop(Outcome::Crash, "lost the control channel to node 0",
              "lost the control channel to node 0 (its capture or machine is gone) — dumping and stopping this "
              "node's ranks");
  }
}

// Progress, alerts, watchdog.
void CaptureSession::pollProgress() {
  lastPoll_ = Clock::now();
  showNewAlerts();
  ProgressLine line;
  line.step = poller_->completedStep();
  line.totalSteps = totalSteps_.value_or(0);
  const RankProgress& r0 = poller_->rank(0);
  if (r0.lastStep > 0) {
    line.loss = r0.lastLoss;
    line.haveLoss = true;
    if (r0.meanStepNs > 0) {
      line.tokensPerS = static_cast<double>(r0.tokens) * dp_ / (r0.meanStepNs * 1e-9);
      if (line.totalSteps > 0) line.etaS = (line.totalSteps - line.step) * r0.meanStepNs * 1e-9;
    }
  }
  if (line.step > 0) display_->update(line);
  if (stop_ == Stop::None) {
    std::vector<bool> exited;
    for (const auto& p : ranks_) exited.push_back(!p.running());
    for (const std::string& l : stalls_->update(*poller_, exited, poller_->completedStep() < 1)) display_->message(l);
  } else {
    for (const std::string& l : stalls_->desyncsAfterEnd(*poller_)) display_->message(l);  // e.g. Gloo aborted on it
  }
  // Until every rank has finished a step (rendezvous, model build, first step), allow at least the startup time.
  const double limit = poller_->watchdogLimitS(o_.hangTimeoutS, o_.startupTimeoutS);
  if (stop_ == Stop::None && secondsSince(lastProgress_) > limit)
    beginStop(Outcome::Hang, fmt::format("hang watchdog: no progress for {:g} s", limit),
              fmt::format("no progress for {:g} s — dumping all ranks", limit));
}

// The stop sequence: SIGUSR1 (dump) → dumpWaitS → SIGTERM → termGraceS → SIGKILL.
void CaptureSession::advanceStop() {
  if (stop_ == Stop::Dumping && secondsSince(stopAt_) >= o_.dumpWaitS) {
    for (auto& p : ranks_) p.signal(SIGTERM);
    stop_ = Stop::Terminating;
    stopAt_ = Clock::now();
  } else if (stop_ == Stop::Terminating && secondsSince(stopAt_) >= o_.termGraceS) {
    for (auto& p : ranks_) {
      if (p.running()) display_->message(fmt::format("rank {} did not exit after SIGTERM — SIGKILL", p.rank()));
      p.signal(SIGKILL);
    }
    stop_ = Stop::Killing;
    stopAt_ = Clock::now();
  }
}

}  // namespace tpscope::cli::capture
