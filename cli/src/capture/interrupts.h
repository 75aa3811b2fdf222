// SIGINT/SIGTERM to the launcher, counted (capture's stop sequence reads the count: the first one dumps and stops
// the ranks, a second one kills them at once).
#pragma once

#include <signal.h>

namespace tpscope::cli::capture {

// While alive: SIGINT and SIGTERM increment a counter (reset to 0 by the constructor) instead of ending the
// process, and SIGPIPE is ignored; the previous handlers come back with its destruction. One at a time.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

 private:
  struct sigaction oldInt_ {}, oldTerm_ {}, oldPipe_ {};
};

// SIGINT/SIGTERM received since the current InterruptGuard was made.
int interruptsReceived();

}  // namespace tpscope::cli::capture
