// Signal-driven dumps. The handlers are async-signal-safe: they bump an atomic ticket, write to the flusher's eventfd
// and wait (bounded: 2 s, nanosleep) until the flusher reports the ticket done. SIGUSR1: dump and continue.
// SIGTERM/SIGINT: dump (final: the file is closed) and then the previous disposition: a previous handler is called,
// SIG_IGN stays ignored, SIG_DFL is re-raised. The flusher thread blocks these signals, so a process-directed
// signal never lands on the thread that has to answer it.
// Crashes — SIGABRT (std::terminate, an uncaught exception such as Gloo's enforce failures, assert), SIGSEGV, SIGBUS,
// SIGFPE, SIGILL — get the same final dump before the default action, like a flight recorder: what the rank recorded
// since its last periodic flush is not lost. Bounded by the same 2 s (a crash that holds the recorder's lock or
// corrupted its heap only delays death); a crash on the flusher thread itself does not wait.
#pragma once

#include <signal.h>

#include <atomic>
#include <cstdint>

namespace tpscope::probes::runtime_detail {

struct SignalState {
  std::atomic<uint64_t> requested{0};     // tickets handed out by handlers
  std::atomic<uint64_t> done{0};          // tickets the flusher has completed
  std::atomic<int> lastSignal{0};
  std::atomic<bool> finalRequested{false};  // a dump before the process dies: close the file
  std::atomic<int> wakeFd{-1};            // the flusher's eventfd (-1: no flusher)
};
SignalState& signalState();

// Installs the handlers once per process (later calls do nothing).
void installSignalHandlers();
// Called by the flusher thread when it starts.
void markFlusherThread();
// Blocks the dump and crash signals in the calling thread while it lives: a thread created meanwhile inherits the
// mask, so the flusher never runs a handler, not even before its first instruction.
class DumpSignalsBlocked {
 public:
  DumpSignalsBlocked();
  ~DumpSignalsBlocked();
  DumpSignalsBlocked(const DumpSignalsBlocked&) = delete;
  DumpSignalsBlocked& operator=(const DumpSignalsBlocked&) = delete;

 private:
  sigset_t old_;
};
const char* signalName(int sig);

}  // namespace tpscope::probes::runtime_detail
