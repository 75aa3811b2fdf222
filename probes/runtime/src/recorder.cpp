// The Recorder's instance and its Sink (the probe API's calls); its lifecycle and session data are in
// recorder_session.cpp, its flusher in recorder_flusher.cpp.
#include "recorder.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>

namespace tpscope::probes::runtime_detail {

// The probe API (dependency-free) and the trace format number span kinds, phases and collective states the same way;
// the flusher converts by value, so the two enums must stay in step.
static_assert(static_cast<int>(SpanKind::Wait) == static_cast<int>(tracedb::SpanKind::Wait) &&
              static_cast<int>(SpanKind::NcclKernel) == static_cast<int>(tracedb::SpanKind::NcclKernel) &&
              static_cast<int>(SpanKind::Compute) == static_cast<int>(tracedb::SpanKind::Compute) &&
              static_cast<int>(SpanKind::Wait) + 1 == tracedb::kSpanKindCount);
static_assert(static_cast<int>(Phase::Other) == static_cast<int>(tracedb::Phase::Other) &&
              static_cast<int>(Phase::Backward) == static_cast<int>(tracedb::Phase::Backward));
static_assert(static_cast<int>(CollectiveState::Failed) == static_cast<int>(tracedb::CollectiveState::Failed) &&
              static_cast<int>(CollectiveState::TimedOut) == static_cast<int>(tracedb::CollectiveState::TimedOut));

int64_t osTid() { return static_cast<int64_t>(syscall(SYS_gettid)); }

void logLine(const std::string& line) { std::fprintf(stderr, "tpscope recorder: %s\n", line.c_str()); }

namespace {

// Marks the thread's buffer retired when the thread exits; the flusher frees it once drained.
struct ThreadGuard {
  ThreadBuffer* buffer = nullptr;
  ~ThreadGuard();
};
thread_local ThreadGuard t_guard;
thread_local bool t_exited = false;  // trivially destructible: readable after t_guard is gone
thread_local BufferEntry* t_entry = nullptr;

ThreadGuard::~ThreadGuard() {
  t_exited = true;
  if (buffer != nullptr) {
    detail::t_buffer = nullptr;
    t_entry = nullptr;
    buffer->retired.store(true, std::memory_order_release);
  }
}

std::string currentThreadName() {
  char name[64] = {};
  if (pthread_getname_np(pthread_self(), name, sizeof name) != 0) return {};
  return name;
}

}  // namespace

Recorder& Recorder::instance() {
  static Recorder* r = [] {
    auto* rec = new Recorder();  // never destroyed: threads may record during static destruction
    pthread_atfork(nullptr, nullptr, [] { Recorder::instance().onFork(); });
    return rec;
  }();
  return *r;
}

// ------------------------------------------------------------------------------------------------------------------
// Sink

ThreadBuffer* Recorder::acquireThreadBuffer() noexcept {
  if (t_exited || forked_.load(std::memory_order_relaxed)) return nullptr;
  if (detail::t_buffer != nullptr) return detail::t_buffer;
  auto* buffer = new (std::nothrow) ThreadBuffer;
  if (buffer == nullptr) return nullptr;
  auto entry = std::make_unique<BufferEntry>();
  entry->buffer = buffer;
  entry->osTid = osTid();
  entry->name = currentThreadName();
  {
    std::lock_guard lock(registryMutex_);
    entry->threadId = nextThreadId_++;
    buffer->threadId = entry->threadId;
    t_entry = entry.get();
    entries_.push_back(std::move(entry));
  }
  t_guard.buffer = buffer;
  detail::t_buffer = buffer;
  return buffer;
}

BufferEntry* Recorder::entryForThisThread() noexcept {
  if (t_entry == nullptr) acquireThreadBuffer();
  return t_entry;
}

uint64_t Recorder::collectiveEnqueued(const CollectiveDesc& desc, uint64_t enqueueTicks) noexcept {
  if (!started()) return 0;
  const BufferEntry* e = entryForThisThread();
  const int step = desc.step >= 0 ? desc.step : currentStep();
  try {
    return ring_.enqueue(desc, enqueueTicks, e ? static_cast<int>(e->threadId) : 0, step);
  } catch (...) {  // an allocation failed: the collective is lost, and counted
    recordsDroppedFailed_.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
}

void Recorder::collectiveState(uint64_t handle, CollectiveState state, uint64_t ticks) noexcept {
  if (!started()) return;
  ring_.setState(handle, state, ticks);
}

void Recorder::gradStats(int step, std::span<const GradStat> stats) noexcept {
  if (!started()) return;
  size_t handled = 0;  // queued or counted as dropped
  try {
    std::lock_guard lock(recordsMutex_);
    for (const GradStat& g : stats) {
      if (records_.size() >= options_.recordQueue) {
        ++recordsDroppedQueue_;
        ++handled;
        continue;
      }
      records_.grads.push_back(tracedb::GradStatRow{options_.rank.rank, step, std::string(g.param), g.layer, g.l2Norm,
                                                    g.maxAbs, g.nanCount, g.infCount, g.numel});
      ++handled;
    }
  } catch (...) {  // an allocation failed: the rows not queued are lost, and counted
    recordsDroppedFailed_.fetch_add(static_cast<int64_t>(stats.size() - handled), std::memory_order_relaxed);
  }
}

namespace {

// The time this process's threads have spent runnable but waiting for a CPU since the first call, in ns (Linux's
// run_delay, the second field of /proc/self/task/<tid>/schedstat): the training thread and the threads it waits on
// (a collective's communication threads, intra-op workers). Summed as each thread's growth since it was last read,
// so that a thread that exits takes nothing back: the total never decreases. nullopt where the kernel does not give
// it. Called once per step on the training thread: each thread's file stays open between calls and is read again
// from its start (a procfs file is regenerated on each read), so a call costs a directory listing and one read per
// thread instead of an open, a buffered read and a close per thread (85 → 21 µs per call at 10 threads).
std::optional<int64_t> processRunDelayNs() noexcept {
  struct Thread {
    int fd = -1;
    int64_t last = 0;  // run_delay at the previous call
    bool seen = false;
  };
  static std::mutex mutex;
  static std::map<long, Thread> threads;
  static int64_t total = 0;
  std::lock_guard lock(mutex);
  DIR* tasks = ::opendir("/proc/self/task");
  if (tasks == nullptr) return std::nullopt;
  bool any = false;
  try {
    while (const dirent* e = ::readdir(tasks)) {
      if (e->d_name[0] == '.') continue;
      const long tid = std::strtol(e->d_name, nullptr, 10);
      auto [it, added] = threads.try_emplace(tid);
      Thread& t = it->second;
      if (added) {
        char path[64];
        std::snprintf(path, sizeof path, "/proc/self/task/%.20s/schedstat", e->d_name);
        t.fd = ::open(path, O_RDONLY | O_CLOEXEC);
      }
      char text[96];
      const ssize_t n = t.fd >= 0 ? ::pread(t.fd, text, sizeof text - 1, 0) : -1;
      if (n <= 0) continue;  // the thread has exited (closed below) or the file cannot be read
      text[n] = '\0';
      char* end = nullptr;
      std::strtoull(text, &end, 10);  // time on a CPU
      const int64_t delay = static_cast<int64_t>(std::strtoull(end, nullptr, 10));
      total += delay - (!added && t.last <= delay ? t.last : 0);
      t.last = delay;
      t.seen = any = true;
    }
  } catch (...) {  // an allocation failed: this call's sample is partial
  }
  ::closedir(tasks);
  for (auto it = threads.begin(); it != threads.end();) {  // threads that exited
    if (it->second.seen) {
      it->second.seen = false;
      ++it;
      continue;
    }
    if (it->second.fd >= 0) ::close(it->second.fd);
    it = threads.erase(it);
  }
  if (!any) return std::nullopt;
  return total;
}

}  // namespace

void Recorder::stepStat(const StepStat& stat) noexcept {
  if (!started()) return;
  // The rank's wait for a CPU so far (counter_names::kRunDelay, one per step): where another process holds its cores,
  // a rank arrives late at its collectives without being slow itself (analysis/diagnose.cpp).
  const std::optional<int64_t> runDelay = processRunDelayNs();
  const uint64_t at = stat.t1 != 0 ? stat.t1 : rawTicks();  // the step's end
  try {
    std::lock_guard lock(recordsMutex_);
    if (records_.size() >= options_.recordQueue) {
      ++recordsDroppedQueue_;
      return;
    }
    records_.steps.push_back(RawStepStat{stat, options_.rank.rank});
    if (runDelay)
      records_.counters.push_back(
          RawCounter{std::string(tracedb::counter_names::kRunDelay), static_cast<double>(*runDelay), at});
  } catch (...) {  // an allocation failed: the record is lost, and counted
    recordsDroppedFailed_.fetch_add(1, std::memory_order_relaxed);
  }
}

void Recorder::alert(const Alert& a) noexcept {
  if (!started()) return;
  const uint64_t ticks = a.ticks != 0 ? a.ticks : rawTicks();
  try {
    tracedb::AlertRow row;
    row.rank = options_.rank.rank;
    row.step = a.step >= 0 ? a.step : currentStep();
    row.severity.assign(severityName(a.severity));
    row.kind.assign(a.kind);
    row.layer = a.layer;
    row.param.assign(a.param);
    row.message.assign(a.message);
    row.evidence = a.evidence.empty() ? std::string("{}") : std::string(a.evidence);
    std::lock_guard lock(recordsMutex_);
    if (records_.size() >= options_.recordQueue) {
      ++recordsDroppedQueue_;
      return;
    }
    records_.alerts.push_back(RawAlert{std::move(row), ticks});
  } catch (...) {  // an allocation failed: the record is lost, and counted
    recordsDroppedFailed_.fetch_add(1, std::memory_order_relaxed);
  }
}

void Recorder::counter(std::string_view name, double value, uint64_t ticks) noexcept {
  if (!started()) return;
  try {
    std::lock_guard lock(recordsMutex_);
    // counters.value is NOT NULL and SQLite stores NaN as NULL: one NaN would fail the whole flush's transaction.
    // It is dropped and counted instead (±Inf is stored as it is).
    if (records_.size() >= options_.recordQueue || std::isnan(value)) {
      ++recordsDroppedQueue_;
      return;
    }
    records_.counters.push_back(RawCounter{std::string(name), value, ticks});
  } catch (...) {  // an allocation failed: the record is lost, and counted
    recordsDroppedFailed_.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace tpscope::probes::runtime_detail
