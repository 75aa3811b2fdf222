#include "signals.h"

#include <errno.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <mutex>

namespace tpscope::probes::runtime_detail {

namespace {
SignalState g_state;
// The dump signals, then the crash signals. The flusher blocks all of them, so one sent with kill() lands on a
// thread that can wait for the flusher. A real fault in the flusher still ends the process: Linux delivers a
// synchronous SIGSEGV/SIGBUS/SIGFPE/SIGILL even when blocked (default action), and abort() unblocks SIGABRT — then
// the handler runs on the flusher and must not wait for itself (t_isFlusher).
constexpr int kAllSignals[8] = {SIGTERM, SIGINT, SIGUSR1, SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL};
struct sigaction g_old[8];
thread_local bool t_isFlusher = false;  // a crash in the flusher itself must not wait for the flusher

int slot(int sig) {
  for (int i = 0; i < 8; ++i)
    if (kAllSignals[i] == sig) return i;
  return 0;
}

bool isCustom(const struct sigaction& a) {
  if (a.sa_flags & SA_SIGINFO) return a.sa_sigaction != nullptr;
  return a.sa_handler != SIG_DFL && a.sa_handler != SIG_IGN;
}

void callOld(const struct sigaction& a, int sig, siginfo_t* info, void* context) {
  if (a.sa_flags & SA_SIGINFO) {
    a.sa_sigaction(sig, info, context);
  } else {
    a.sa_handler(sig);
  }
}

void onSignal(int sig, siginfo_t* info, void* context) {
  const int savedErrno = errno;
  const struct sigaction& old = g_old[slot(sig)];
  const bool custom = isCustom(old);
  const bool ignored = !custom && old.sa_handler == SIG_IGN && !(old.sa_flags & SA_SIGINFO);
  const bool dies = sig != SIGUSR1 && !custom && !ignored;

  const int fd = g_state.wakeFd.load();
  if (fd >= 0 && !t_isFlusher) {
    g_state.lastSignal.store(sig);
    if (dies) g_state.finalRequested.store(true);
    const uint64_t ticket = g_state.requested.fetch_add(1) + 1;
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(fd, &one, sizeof one);
    for (int i = 0; i < 2000 && g_state.done.load() < ticket; ++i) {
      timespec ts{0, 1'000'000};
      nanosleep(&ts, nullptr);
    }
  }
  if (custom) {
    callOld(old, sig, info, context);
  } else if (dies) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    raise(sig);  // blocked while we run; delivered (default action) as soon as the handler returns
  }
  errno = savedErrno;
}
}  // namespace

SignalState& signalState() { return g_state; }

void markFlusherThread() {
  t_isFlusher = true;
}

void installSignalHandlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int sig : kAllSignals) {
      struct sigaction sa {};
      sa.sa_sigaction = &onSignal;
      sa.sa_flags = SA_SIGINFO | SA_RESTART;
      sigemptyset(&sa.sa_mask);
      sigaction(sig, &sa, &g_old[slot(sig)]);
    }
  });
}

DumpSignalsBlocked::DumpSignalsBlocked() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kAllSignals) sigaddset(&set, sig);
  pthread_sigmask(SIG_BLOCK, &set, &old_);
}

DumpSignalsBlocked::~DumpSignalsBlocked() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

const char* signalName(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    case SIGABRT:
      return "SIGABRT";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    default: return "signal";
  }
}

}  // namespace tpscope::probes::runtime_detail
