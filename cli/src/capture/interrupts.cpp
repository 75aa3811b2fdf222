#include "capture/interrupts.h"

#include <atomic>

namespace tpscope::cli::capture {

namespace {

std::atomic<int> g_interrupts{0};
void onInterrupt(int) { g_interrupts.fetch_add(1, std::memory_order_relaxed); }

}  // namespace

InterruptGuard::InterruptGuard() {
  g_interrupts.store(0);
  struct sigaction sa {};
  sa.sa_handler = onInterrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &oldInt_);
  sigaction(SIGTERM, &sa, &oldTerm_);
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ign, &oldPipe_);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &oldInt_, nullptr);
  sigaction(SIGTERM, &oldTerm_, nullptr);
  sigaction(SIGPIPE, &oldPipe_, nullptr);
}

int interruptsReceived() { return g_interrupts.load(std::memory_order_relaxed); }

}  // namespace tpscope::cli::capture
