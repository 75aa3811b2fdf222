#include "recorder.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include "signals.h"

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

namespace {

constexpr uint32_t kLaneBase = 65536;
constexpr int kPollMs = 5;                     // how often the flusher looks at buffer fill levels
constexpr int64_t kHeartbeatNs = 1'000'000'000;  // an idle session still commits a recorder_stats row this often

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

int64_t osTid() { return static_cast<int64_t>(syscall(SYS_gettid)); }

std::string currentThreadName() {
  char name[64] = {};
  if (pthread_getname_np(pthread_self(), name, sizeof name) != 0) return {};
  return name;
}

void logLine(const std::string& line) { std::fprintf(stderr, "tpscope recorder: %s\n", line.c_str()); }

// Offset stored in ranks: the mean of the start and end estimates (a constant offset is all the format holds), with
// an uncertainty that covers both.
void combineClock(const std::optional<ClockOffset>& a, const std::optional<ClockOffset>& b, tracedb::RankInfo* info) {
  const bool okA = a && a->ok(), okB = b && b->ok();
  if (okA && okB) {
    info->clockOffsetNs = a->offsetNs + (b->offsetNs - a->offsetNs) / 2;
    info->clockUncertaintyNs = std::max(a->uncertaintyNs, b->uncertaintyNs) + std::abs(b->offsetNs - a->offsetNs) / 2;
  } else if (okA || okB) {
    const ClockOffset& c = okA ? *a : *b;
    info->clockOffsetNs = c.offsetNs;
    info->clockUncertaintyNs = c.uncertaintyNs;
  }
}

int64_t recorderNowUnix() { return Recorder::instance().nowUnixNs(); }

int64_t threadCpuNow() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// The CPUs this process may run on: its affinity mask, capped by a cgroup v2 CPU quota (cpu.max "quota period"),
// not the machine's count (hardware_concurrency), which a container or `taskset` narrows.
unsigned usableCpus() {
  unsigned n = std::max(1u, std::thread::hardware_concurrency());
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = std::max(1, CPU_COUNT(&set));
  if (FILE* f = std::fopen("/sys/fs/cgroup/cpu.max", "r")) {
    char quota[32] = {0};
    long long period = 0;
    if (std::fscanf(f, "%31s %lld", quota, &period) == 2 && std::strcmp(quota, "max") != 0 && period > 0) {
      const long long q = std::atoll(quota);
      if (q > 0) n = std::min<unsigned>(n, static_cast<unsigned>(std::max(1LL, (q + period - 1) / period)));
    }
    std::fclose(f);
  }
  return n;
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

// ------------------------------------------------------------------------------------------------------------------
// Lifecycle

int64_t Recorder::perSpanCostPs() {
  // What SpanScope costs while recording: two raw clock reads and a push into the thread's ring.
  static constexpr Site kSite{"tpscope.calibration", "", __FILE__, __LINE__, SpanKind::Other, Phase::None};
  std::unique_ptr<ThreadBuffer> scratch(new (std::nothrow) ThreadBuffer);
  if (!scratch) return 0;
  constexpr int kSpans = 4096;  // short rounds, best of many: a preempted round does not count
  int64_t best = INT64_MAX;
  for (int round = 0; round < 16; ++round) {
    const int64_t t0 = monotonicNow();
    for (int i = 0; i < kSpans; ++i) {
      const uint64_t a = rawTicks();
      scratch->push(SpanEvent{&kSite, a, rawTicks(), i, -1, 0});
    }
    best = std::min(best, monotonicNow() - t0);
    scratch->tail.store(scratch->head.load(std::memory_order_relaxed));
  }
  return best * 1000 / kSpans;
}

tracedb::Status Recorder::start(const RuntimeOptions& options) {
  std::lock_guard lifecycle(lifecycleMutex_);
  if (forked_) return tracedb::Status::error("tpscope recorder: cannot start in a forked child");
  if (started()) return tracedb::Status::error("tpscope recorder: already recording to " + path_.string());
  if (flusher_.joinable()) flusher_.join();  // a session that ended by a fatal signal's dump
  if (options.outDir.empty()) return tracedb::Status::error("tpscope recorder: no output folder");

  options_ = options;
  if (options_.collectiveRing == 0) options_.collectiveRing = 1;
  if (options_.flushInterval.count() <= 0) options_.flushInterval = std::chrono::milliseconds(250);
  tracedb::RankInfo& rank = options_.rank;
  if (rank.host.empty()) {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    rank.host = host;
  }
  if (rank.pid == 0) rank.pid = getpid();

  clock_.init(options_.epochUnixNs.value_or(-1), options_.testClockOffsetNs);
  clockReady_.store(true, std::memory_order_release);
  if (options_.runId.empty()) {
    options_.runId = rank.host + "-" + std::to_string(rank.pid) + "-" + std::to_string(clock_.epochUnixNs());
  }

  if (tracedb::Status s = openRankFile(); !s) return s;
  resetSession();
  if (tracedb::Status s = startFlusher(); !s) return s;
  if (clockStore_ && rank.worldSize > 1) startClockThread();
  return tracedb::Status::ok();
}

// The rank file, created with its first transaction: what a reader needs even if the process dies before the first
// flush (meta, the ranks row). Leaves no file behind when that transaction fails. Under lifecycleMutex_.
tracedb::Status Recorder::openRankFile() {
  tracedb::RankInfo& rank = options_.rank;
  path_ = options_.outDir / ("rank-" + std::to_string(rank.rank) + ".db");
  tracedb::CreateOptions create;
  create.overwrite = options_.overwrite;
  create.runId = options_.runId;
  create.epochUnixNs = clock_.epochUnixNs();
  create.source = "capture";
  auto writer = tracedb::Writer::create(path_, create);
  if (!writer) return writer.status();
  writer_ = std::move(writer.value());

  perSpanCostPs_ = perSpanCostPs();
  rank.startNs = clock_.nowFile();
  rank.endNs.reset();
  rank.exitReason.clear();
  rank.clockOffsetNs = 0;
  rank.clockUncertaintyNs = 0;

  namespace keys = tracedb::meta_keys;
  const std::vector<std::pair<std::string, std::string>> meta = {
      {std::string(keys::kRunId), options_.runId},
      {std::string(keys::kEpochUnixNs), std::to_string(clock_.epochUnixNs())},
      {std::string(keys::kTool), options_.tool},
      {std::string(keys::kSource), "capture"},
      {"recorder.tick_source", clock_.source()},
      {"recorder.ticks_per_ns", std::to_string(clock_.ticksPerNs())},
      {"recorder.span_cost_ps", std::to_string(perSpanCostPs_)},
      {"recorder.flush_interval_ms", std::to_string(options_.flushInterval.count())},
      // How many ranks share a host's cores decides what a lagging rank means (analysis: stragglers).
      {std::string(keys::kHostCpusPrefix) + rank.host, std::to_string(usableCpus())},
      {"built_with", std::string(tpscope::kBuiltWith)},  // the PyTorch, CUDA, NCCL, CUPTI tpscope was built with
  };
  tracedb::Status s = writer_->begin();
  for (const auto& [k, v] : meta) {
    if (s) s = writer_->setMeta(k, v);
  }
  if (s) s = writer_->putRank(rank);
  if (s) s = writer_->commit();
  if (!s) {
    // A file without its first transaction (no ranks row) is not a trace of this rank: leave none behind.
    writer_.reset();
    std::error_code ec;
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path_.string() + suffix, ec);
  }
  return s;
}

// Every piece of session state back to empty for the new file; events left in a buffer from before this session
// are not this file's. Under lifecycleMutex_, before the flusher starts.
void Recorder::resetSession() {
  {
    std::lock_guard lock(stateMutex_);
    rankInfo_ = options_.rank;
    rankDirty_ = false;
    pendingMeta_.clear();
    pendingGroups_.clear();
    clockStart_.reset();
    clockEnd_.reset();
    clockCounters_.clear();
    clockStore_ = options_.clockStore;
  }
  {
    std::lock_guard lock(recordsMutex_);
    records_.clear();
    recordsDroppedQueue_ = 0;
  }
  recordsDroppedFailed_.store(0, std::memory_order_relaxed);
  {
    std::lock_guard lock(controlMutex_);
    flushRequested_ = flushDone_ = 0;
    stopRequested_ = false;
    stopReason_.clear();
    flusherExited_ = false;
  }
  {
    std::lock_guard lock(statsMutex_);
    stats_ = RecorderStats{};
    stats_.perSpanCostPs = perSpanCostPs_;
  }
  ring_.reset(options_.collectiveRing);
  siteNames_.clear();
  lastCommitMono_ = monotonicNow();
  recordsDroppedCum_ = 0;
  failedFlushes_ = 0;
  lastFlushError_.clear();
  ++session_;
  std::lock_guard lock(registryMutex_);
  for (auto& e : entries_) {
    e->buffer->tail.store(e->buffer->head.load(std::memory_order_acquire), std::memory_order_release);
    e->droppedSeen = e->buffer->dropped.load(std::memory_order_relaxed);
  }
}

// The flusher thread (with the dump signals blocked), the signal handlers and the exit hook; then recording is on.
tracedb::Status Recorder::startFlusher() {
  wakeFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  signalState().finalRequested.store(false);
  signalState().done.store(signalState().requested.load());
  try {
    DumpSignalsBlocked blocked;  // inherited by the flusher from its first instruction
    flusher_ = std::thread([this] { flusherMain(); });
  } catch (const std::exception& e) {
    close(wakeFd_);
    wakeFd_ = -1;
    writer_.reset();
    return tracedb::Status::error(std::string("tpscope recorder: cannot start the flusher thread: ") + e.what());
  }
  signalState().wakeFd.store(wakeFd_);
  if (options_.installSignalHandlers) installSignalHandlers();
  if (options_.flushAtExit) {
    static std::once_flag once;
    std::call_once(once, [] { std::atexit([] { Recorder::instance().stop("ok"); }); });
  }

  detail::g_sink.store(this, std::memory_order_release);
  started_.store(true, std::memory_order_release);
  detail::g_recording.store(true, std::memory_order_release);
  return tracedb::Status::ok();
}

void Recorder::stop(std::string_view exitReason) {
  std::lock_guard lifecycle(lifecycleMutex_);
  if (!started() || forked_) return;
  joinClockThread();
  std::shared_ptr<KvStore> store;
  {
    std::lock_guard lock(stateMutex_);
    store = clockStore_;
  }
  bool flusherAlive;
  {
    std::lock_guard lock(controlMutex_);
    flusherAlive = !flusherExited_;
  }
  if (store && flusherAlive && options_.rank.worldSize > 1) {
    runClockAlignment(options_.runId + "/end", options_.clockEndTimeout, false);
  }
  detail::g_recording.store(false, std::memory_order_release);
  {
    std::lock_guard lock(controlMutex_);
    stopRequested_ = true;
    stopReason_.assign(exitReason);
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wakeFd_, &one, sizeof one);
  if (flusher_.joinable()) flusher_.join();
  signalState().wakeFd.store(-1);
  close(wakeFd_);
  wakeFd_ = -1;
  writer_.reset();
  {
    std::lock_guard lock(stateMutex_);
    clockStore_.reset();
  }
  started_.store(false, std::memory_order_release);
}

void Recorder::onFork() {
  forked_.store(true);
  detail::g_recording.store(false);
  started_.store(false);
}

void Recorder::flushNow() {
  if (!started()) return;
  if (std::this_thread::get_id() == flusher_.get_id()) return;
  std::unique_lock lock(controlMutex_);
  if (flusherExited_) return;
  const uint64_t ticket = ++flushRequested_;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wakeFd_, &one, sizeof one);
  controlCv_.wait_for(lock, std::chrono::seconds(5), [&] { return flushDone_ >= ticket || flusherExited_; });
}

// ------------------------------------------------------------------------------------------------------------------
// Session data

void Recorder::setRankInfo(const tracedb::RankInfo& info) {
  std::lock_guard lock(stateMutex_);
  tracedb::RankInfo merged = info;
  merged.rank = rankInfo_.rank;
  merged.worldSize = rankInfo_.worldSize;
  merged.localRank = rankInfo_.localRank;
  merged.pid = rankInfo_.pid;
  if (merged.host.empty()) merged.host = rankInfo_.host;
  merged.startNs = rankInfo_.startNs;
  merged.endNs = rankInfo_.endNs;
  merged.exitReason = rankInfo_.exitReason;
  merged.clockOffsetNs = rankInfo_.clockOffsetNs;
  merged.clockUncertaintyNs = rankInfo_.clockUncertaintyNs;
  rankInfo_ = std::move(merged);
  rankDirty_ = true;
}

void Recorder::setMeta(std::string_view key, std::string_view value) {
  std::lock_guard lock(stateMutex_);
  pendingMeta_.emplace_back(std::string(key), std::string(value));
}

void Recorder::putGroup(const tracedb::GroupInfo& group) {
  std::lock_guard lock(stateMutex_);
  pendingGroups_.push_back(group);
}

void Recorder::setThreadName(std::string_view name) {
  BufferEntry* e = entryForThisThread();
  if (e == nullptr) return;
  std::lock_guard lock(registryMutex_);
  e->name.assign(name);
  e->threadRowSession = 0;
}

void Recorder::setClockStore(std::shared_ptr<KvStore> store) {
  std::lock_guard lifecycle(lifecycleMutex_);
  {
    std::lock_guard lock(stateMutex_);
    clockStore_ = std::move(store);
  }
  if (!started() || !clockStore_ || options_.rank.worldSize <= 1) return;
  joinClockThread();
  startClockThread();
}

void Recorder::startClockThread() {
  try {
    DumpSignalsBlocked blocked;
    clockThread_ = std::thread([this, tag = options_.runId + "/start", t = options_.clock.timeout] {
      runClockAlignment(tag, t, true);
    });
  } catch (const std::exception& e) {
    logLine(std::string("clock alignment skipped: ") + e.what());
  }
}

void Recorder::joinClockThread() {
  if (clockThread_.joinable()) {
    clockThread_.join();
  }
}

void Recorder::runClockAlignment(const std::string& tag, std::chrono::milliseconds timeout, bool atStart) {
  std::shared_ptr<KvStore> store;
  {
    std::lock_guard lock(stateMutex_);
    store = clockStore_;
  }
  if (!store) return;
  ClockAlignOptions o = options_.clock;
  o.timeout = timeout;
  const ClockOffset c = alignClock(*store, options_.rank.rank, options_.rank.worldSize, tag, o, &recorderNowUnix);
  const uint64_t ticks = rawTicks();
  std::lock_guard lock(stateMutex_);
  (atStart ? clockStart_ : clockEnd_) = c;
  if (c.ok()) {
    clockCounters_.push_back(RawCounter{"tpscope.clock_offset_ns", static_cast<double>(c.offsetNs), ticks});
    clockCounters_.push_back(RawCounter{"tpscope.clock_uncertainty_ns", static_cast<double>(c.uncertaintyNs), ticks});
  } else if (options_.rank.rank != 0) {
    logLine("clock alignment (" + tag + ") failed: no answer from rank 0; offset left as measured before");
  }
  combineClock(clockStart_, clockEnd_, &rankInfo_);
  rankDirty_ = true;
}

RecorderStats Recorder::stats() const {
  std::lock_guard lock(statsMutex_);
  return stats_;
}

std::filesystem::path Recorder::outputPath() const { return path_; }

// ------------------------------------------------------------------------------------------------------------------
// Hooks

void Recorder::addParticipant(FlushParticipant* p) {
  std::lock_guard lock(participantsMutex_);
  if (std::find(participants_.begin(), participants_.end(), p) == participants_.end()) participants_.push_back(p);
}

void Recorder::removeParticipant(FlushParticipant* p) {
  std::lock_guard lock(participantsMutex_);
  participants_.erase(std::remove(participants_.begin(), participants_.end(), p), participants_.end());
}

std::optional<uint32_t> Recorder::threadIdForOsTid(int64_t tid) {
  std::lock_guard lock(registryMutex_);
  for (const auto& e : entries_) {
    if (e->osTid == tid) return e->threadId;
  }
  return std::nullopt;
}

std::optional<int64_t> Recorder::osTidForThreadId(uint32_t thread) {
  std::lock_guard lock(registryMutex_);
  for (const auto& e : entries_) {
    if (e->threadId == thread) return e->osTid;
  }
  return std::nullopt;
}

uint32_t Recorder::registerLane(std::string_view kind, std::string_view name) {
  std::lock_guard lock(registryMutex_);
  for (const Lane& l : lanes_) {
    if (l.kind == kind && l.name == name) return l.threadId;
  }
  Lane lane;
  lane.threadId = kLaneBase + static_cast<uint32_t>(lanes_.size());
  lane.kind.assign(kind);
  lane.name.assign(name);
  lanes_.push_back(std::move(lane));
  return lanes_.back().threadId;
}

int64_t Recorder::fileNsFromMonotonicNs(int64_t mono) const {
  return clockReady_.load(std::memory_order_acquire) ? clock_.monoToFile(mono) : 0;
}

int64_t Recorder::fileNsFromTicks(uint64_t ticks) const {
  return clockReady_.load(std::memory_order_acquire) ? clock_.ticksToFileLocked(ticks) : 0;
}

int64_t Recorder::nowUnixNs() const {
  return clockReady_.load(std::memory_order_acquire) ? clock_.nowUnix() : realtimeNow();
}

// ------------------------------------------------------------------------------------------------------------------
// Flusher

bool Recorder::anyBufferHalfFull() {
  std::lock_guard lock(registryMutex_);
  for (const auto& e : entries_) {
    const ThreadBuffer& b = *e->buffer;
    if (b.head.load(std::memory_order_relaxed) - b.tail.load(std::memory_order_relaxed) >= ThreadBuffer::kCapacity / 2)
      return true;
  }
  return false;
}

void Recorder::flusherMain() {
  pthread_setname_np(pthread_self(), "tpscope-flush");
  markFlusherThread();
  SignalState& sig = signalState();
  const int64_t interval = std::chrono::duration_cast<std::chrono::nanoseconds>(options_.flushInterval).count();
  int64_t nextFlush = monotonicNow() + interval;
  for (;;) {
    const int64_t now = monotonicNow();
    const int waitMs = static_cast<int>(std::clamp<int64_t>((nextFlush - now + 999'999) / 1'000'000, 0, kPollMs));
    pollfd pfd{wakeFd_, POLLIN, 0};
    if (poll(&pfd, 1, waitMs) > 0) {
      uint64_t drained = 0;
      [[maybe_unused]] ssize_t n = read(wakeFd_, &drained, sizeof drained);
    }
    const uint64_t sigTicket = sig.requested.load();
    const bool sigPending = sigTicket > sig.done.load();
    uint64_t requested;
    bool stopping;
    std::string reason;
    {
      std::lock_guard lock(controlMutex_);
      requested = flushRequested_;
      stopping = stopRequested_;
      reason = stopReason_;
    }
    const bool sigFinal = sigPending && sig.finalRequested.load();
    const bool due = monotonicNow() >= nextFlush || anyBufferHalfFull();
    if (!sigPending && !stopping && requested <= flushDone_ && !due) continue;

    const bool final = stopping || sigFinal;
    if (sigFinal) {
      detail::g_recording.store(false, std::memory_order_release);
      reason = std::string("signal ") + signalName(sig.lastSignal.load());
    }
    flushOnce(final, reason);
    nextFlush = monotonicNow() + interval;
    if (final) {
      tracedb::Status s = writer_->close();
      if (!s) logLine("closing " + path_.string() + ": " + s.message());
      if (failedFlushes_ > 0)
        logLine(std::to_string(failedFlushes_) + " flush" + (failedFlushes_ == 1 ? "" : "es") + " to " +
                path_.string() + " failed: the records they held are not in the file");
    }
    {
      std::lock_guard lock(controlMutex_);
      flushDone_ = requested;
      if (final) flusherExited_ = true;
    }
    controlCv_.notify_all();
    if (sigPending) sig.done.store(sigTicket);
    if (final) return;
  }
}

void FlushTally::check(const tracedb::Status& s) {
  if (!s && firstError.empty()) firstError = s.message();
}

void FlushTally::count(const tracedb::Status& s) {
  check(s);
  (s ? recordsWritten : recordsDropped)++;
}

// One flush: one transaction with everything recorded since the last one, then the participants' rows, then the
// recorder_stats row. Flusher thread only. The clock's lock is held while this thread converts ticks (released
// before the participants, which may convert).
void Recorder::flushOnce(bool final, std::string_view finalReason) {
  const int64_t t0 = monotonicNow();
  const int64_t cpu0 = threadCpuNow();
  std::unique_lock clockLock(clock_.lock());
  clock_.recalibrate();
  FlushTally tally;
  std::vector<tracedb::ThreadInfo> threadRows;
  const std::vector<BufferEntry*> entries = snapshotBuffers(threadRows);
  tally.check(writer_->begin());
  for (const auto& t : threadRows) tally.check(writer_->putThread(t));
  std::vector<BufferEntry*> retired;
  drainSpans(entries, tally, retired);
  std::vector<RawCounter> clockCounters;
  writeSessionState(final, finalReason, tally, clockCounters);
  writeCollectives(tally);
  writeQueuedRecords(clockCounters, tally);
  clockLock.unlock();
  runParticipants(final, tally);
  RecorderStats s = commitWithStats(t0, final, tally);
  s.flushCpuNsTotal += threadCpuNow() - cpu0;
  if (!tally.firstError.empty()) {
    // Logged once per distinct reason: a full disk fails every flush, four times a second. `tpscope capture` reads
    // these lines from the rank's log to say that the trace is incomplete.
    if (tally.firstError != lastFlushError_) logLine("flush to " + path_.string() + " failed: " + tally.firstError);
    lastFlushError_ = tally.firstError;
    ++failedFlushes_;
  }
  freeRetired(retired);
  publishStats(s);
}

// 1. Buffers and lanes whose threads rows this file lacks.
std::vector<BufferEntry*> Recorder::snapshotBuffers(std::vector<tracedb::ThreadInfo>& threadRows) {
  const int rank = options_.rank.rank;
  std::vector<BufferEntry*> entries;
  std::lock_guard lock(registryMutex_);
  entries.reserve(entries_.size());
  for (auto& e : entries_) {
    entries.push_back(e.get());
    if (e->threadRowSession != session_) {
      e->threadRowSession = session_;
      threadRows.push_back(tracedb::ThreadInfo{rank, static_cast<int>(e->threadId), "cpu", e->name});
    }
  }
  for (Lane& l : lanes_) {
    if (l.threadRowSession != session_) {
      l.threadRowSession = session_;
      threadRows.push_back(tracedb::ThreadInfo{rank, static_cast<int>(l.threadId), l.kind, l.name});
    }
  }
  return entries;
}

// 2. Spans, one buffer at a time (a drained chunk is at most one ring: 64 Ki rows). Buffers of exited threads go
// to `retired` once drained.
void Recorder::drainSpans(const std::vector<BufferEntry*>& entries, FlushTally& tally,
                          std::vector<BufferEntry*>& retired) {
  bool wantRefs;
  {
    std::lock_guard lock(participantsMutex_);
    wantRefs = !participants_.empty();
  }
  hostRefs_.clear();
  for (BufferEntry* e : entries) {
    ThreadBuffer& b = *e->buffer;
    const bool isRetired = b.retired.load(std::memory_order_acquire);
    drainBuffer(*e, wantRefs, tally);
    const uint64_t d = b.dropped.load(std::memory_order_relaxed);
    tally.spansDropped += static_cast<int64_t>(d - e->droppedSeen);
    e->droppedSeen = d;
    if (isRetired) retired.push_back(e);
  }
}

// The spans of one buffer as rows (names interned once per site), written; their row ids kept for participants.
void Recorder::drainBuffer(BufferEntry& e, bool wantRefs, FlushTally& tally) {
  tracedb::Writer& w = *writer_;
  const int rank = options_.rank.rank;
  ThreadBuffer& b = *e.buffer;
  const uint64_t head = b.head.load(std::memory_order_acquire);
  const uint64_t tail = b.tail.load(std::memory_order_relaxed);
  const size_t n = static_cast<size_t>(head - tail);
  if (n == 0) return;
  rows_.resize(n);
  const Site* lastSite = nullptr;
  uint32_t lastName = 0;
  for (size_t i = 0; i < n; ++i) {
    const SpanEvent& ev = b.events[(tail + i) & (ThreadBuffer::kCapacity - 1)];
    if (ev.site != lastSite) {
      auto it = siteNames_.find(ev.site);
      if (it == siteNames_.end()) {
        auto id = w.intern(ev.site->name != nullptr ? ev.site->name : "");
        tally.check(id.status());
        it = siteNames_.emplace(ev.site, id ? *id : 0).first;
      }
      lastSite = ev.site;
      lastName = it->second;
    }
    tracedb::SpanRow& r = rows_[i];
    r.rank = rank;
    r.thread = static_cast<int>(e.threadId);
    r.kind = static_cast<tracedb::SpanKind>(ev.site->kind);
    r.name = lastName;
    r.beginNs = clock_.ticksToFile(ev.t0);
    r.durNs = std::max<int64_t>(0, clock_.ticksToFile(ev.t1) - r.beginNs);
    r.step = ev.step;
    r.layer = ev.layer;
    r.phase = static_cast<tracedb::Phase>(ev.site->phase);
    r.correlation.reset();
  }
  b.tail.store(head, std::memory_order_release);
  const tracedb::Status s = w.addSpans(std::span<const tracedb::SpanRow>(rows_.data(), n));
  tally.check(s);
  tally.wroteSomething = true;
  if (!s) {
    tally.spansDropped += static_cast<int64_t>(n);
    return;
  }
  tally.spansWritten += static_cast<int64_t>(n);
  if (!wantRefs) return;
  const int64_t last = w.lastRowId();
  const int64_t first = last - static_cast<int64_t>(n) + 1;
  for (size_t i = 0; i < n; ++i) {
    const tracedb::SpanRow& r = rows_[i];
    hostRefs_.push_back(HostSpanRef{first + static_cast<int64_t>(i), e.threadId, static_cast<SpanKind>(r.kind),
                                    r.beginNs, r.endNs(), r.step, static_cast<int16_t>(r.layer),
                                    static_cast<Phase>(r.phase)});
  }
}

// 3. Rank, meta, groups; hands back the clock counters queued since the last flush.
void Recorder::writeSessionState(bool final, std::string_view finalReason, FlushTally& tally,
                                 std::vector<RawCounter>& clockCounters) {
  tracedb::Writer& w = *writer_;
  tracedb::RankInfo rankInfo;
  bool rankDirty;
  std::vector<std::pair<std::string, std::string>> meta;
  std::vector<tracedb::GroupInfo> groups;
  {
    std::lock_guard lock(stateMutex_);
    if (final) {
      rankInfo_.endNs = clock_.nowFile();
      rankInfo_.exitReason = finalReason.empty() ? "ok" : std::string(finalReason);
      rankDirty_ = true;
    }
    rankDirty = rankDirty_;
    rankDirty_ = false;
    rankInfo = rankInfo_;
    meta.swap(pendingMeta_);
    groups.swap(pendingGroups_);
    clockCounters.swap(clockCounters_);
  }
  if (rankDirty) tally.check(w.putRank(rankInfo));
  for (const auto& [k, v] : meta) tally.check(w.setMeta(k, v));
  std::vector<tracedb::GroupInfo> ringGroups;
  ring_.takeDirty(&collectives_, &ringGroups);
  for (const auto& g : ringGroups) tally.check(w.putGroup(g));
  for (const auto& g : groups) tally.check(w.putGroup(g));  // explicit ones (with a backend) win
  tally.wroteSomething |= rankDirty || !meta.empty() || !groups.empty() || !ringGroups.empty();
}

// 4. Collectives whose state changed (taken from the ring by writeSessionState).
void Recorder::writeCollectives(FlushTally& tally) {
  for (CollectiveSnapshot& c : collectives_) {
    c.row.rank = options_.rank.rank;
    c.row.enqueueNs = clock_.ticksToFile(c.enqueueTicks);
    c.row.startNs = c.startTicks ? std::optional<int64_t>(clock_.ticksToFile(c.startTicks)) : std::nullopt;
    c.row.endNs = c.endTicks ? std::optional<int64_t>(clock_.ticksToFile(c.endTicks)) : std::nullopt;
    tally.count(writer_->upsertCollective(c.row));
  }
  tally.wroteSomething |= !collectives_.empty();
}

// 5. Queued records: gradient stats, step stats, alerts, counters; the records the Sink dropped (queue full, or
// an allocation that failed) are counted here.
void Recorder::writeQueuedRecords(const std::vector<RawCounter>& clockCounters, FlushTally& tally) {
  tracedb::Writer& w = *writer_;
  const int rank = options_.rank.rank;
  recordsLocal_.clear();
  int64_t queueDrops;
  {
    std::lock_guard lock(recordsMutex_);
    std::swap(records_, recordsLocal_);
    queueDrops = recordsDroppedQueue_;
    recordsDroppedQueue_ = 0;
  }
  const int64_t sinkFailures = recordsDroppedFailed_.exchange(0, std::memory_order_relaxed);
  tally.recordsDropped += queueDrops + sinkFailures;
  for (const auto& g : recordsLocal_.grads) tally.count(w.addGradStat(g));
  for (const auto& st : recordsLocal_.steps) {
    tracedb::StepStatRow row;
    row.rank = st.rank;
    row.step = st.stat.step;
    row.loss = st.stat.loss;
    row.lr = st.stat.lr;
    row.gradNorm = st.stat.gradNorm;
    row.lossScale = st.stat.lossScale;
    row.tokens = st.stat.tokens;
    if (st.stat.t0 != 0) row.beginNs = clock_.ticksToFile(st.stat.t0);
    if (st.stat.t1 != 0) row.endNs = clock_.ticksToFile(st.stat.t1);
    row.skipped = st.stat.skipped;
    tally.count(w.putStepStat(row));
  }
  for (auto& a : recordsLocal_.alerts) {
    a.row.tsNs = clock_.ticksToFile(a.ticks);
    tally.count(w.addAlert(a.row));
  }
  for (const auto& c : recordsLocal_.counters) {
    tally.count(w.addCounter(tracedb::CounterRow{rank, c.name, clock_.ticksToFile(c.ticks), c.value}));
  }
  for (const auto& c : clockCounters) {
    tally.check(w.addCounter(tracedb::CounterRow{rank, c.name, clock_.ticksToFile(c.ticks), c.value}));
  }
  tally.wroteSomething |= recordsLocal_.size() > 0 || queueDrops > 0 || sinkFailures > 0 || !clockCounters.empty();
}

// 6. Sources that add rows (CUPTI).
void Recorder::runParticipants(bool final, FlushTally& tally) {
  std::lock_guard lock(participantsMutex_);
  if (participants_.empty()) return;
  int64_t pRecW = 0, pRecD = 0, pSpanW = 0, pSpanD = 0;
  FlushContext ctx{*writer_, options_.rank.rank, final, hostRefs_, &pRecW, &pRecD, &pSpanW, &pSpanD};
  for (FlushParticipant* p : participants_) p->onFlush(ctx);
  tally.recordsWritten += pRecW;
  tally.recordsDropped += pRecD;
  tally.spansWritten += pSpanW;
  tally.spansDropped += pSpanD;
  tally.wroteSomething |= (pRecW + pRecD + pSpanW + pSpanD) > 0;
}

// 7. The session's counters with this flush added, a recorder_stats row when anything happened (or a heartbeat is
// due), and the commit. Returns the counters to publish.
RecorderStats Recorder::commitWithStats(int64_t t0, bool final, FlushTally& tally) {
  const int64_t nowMono = monotonicNow();
  const bool heartbeat = nowMono - lastCommitMono_ >= kHeartbeatNs;
  const bool commitStats = tally.wroteSomething || heartbeat || final || tally.spansDropped > 0;
  RecorderStats s;
  {
    std::lock_guard lock(statsMutex_);
    s = stats_;
  }
  s.spansWritten += tally.spansWritten;
  s.spansDropped += tally.spansDropped;
  s.recordsWritten += tally.recordsWritten;
  recordsDroppedCum_ += tally.recordsDropped;
  s.recordsDropped = recordsDroppedCum_ + ring_.dropped();
  if (commitStats) {
    ++s.flushes;
    const int64_t flushNs = monotonicNow() - t0;  // the stats row's own insert is not counted
    s.flushNsTotal += flushNs;
    s.flushNsMax = std::max(s.flushNsMax, flushNs);
    tracedb::RecorderStatsRow row;
    row.rank = options_.rank.rank;
    row.tsNs = clock_.nowFile();
    row.spansWritten = s.spansWritten;
    row.spansDropped = s.spansDropped;
    row.recordsWritten = s.recordsWritten;
    row.recordsDropped = s.recordsDropped;
    row.flushes = s.flushes;
    row.flushNsMax = s.flushNsMax;
    row.flushNsTotal = s.flushNsTotal;
    row.probeOverheadNs = (s.spansWritten + s.spansDropped) * perSpanCostPs_ / 1000;
    tally.check(writer_->addRecorderStats(row));
    lastCommitMono_ = nowMono;
  }
  tally.check(writer_->commit());
  return s;
}

// 8. Buffers of exited threads, now drained.
void Recorder::freeRetired(const std::vector<BufferEntry*>& retired) {
  if (retired.empty()) return;
  std::lock_guard lock(registryMutex_);
  for (BufferEntry* e : retired) {
    delete e->buffer;
    entries_.erase(std::remove_if(entries_.begin(), entries_.end(), [&](const auto& p) { return p.get() == e; }),
                   entries_.end());
  }
}

void Recorder::publishStats(const RecorderStats& s) {
  std::lock_guard lock(statsMutex_);
  stats_.spansWritten = s.spansWritten;
  stats_.spansDropped = s.spansDropped;
  stats_.recordsWritten = s.recordsWritten;
  stats_.recordsDropped = s.recordsDropped;
  stats_.flushes = s.flushes;
  stats_.flushNsMax = s.flushNsMax;
  stats_.flushNsTotal = s.flushNsTotal;
  stats_.flushCpuNsTotal = s.flushCpuNsTotal;
  {
    std::lock_guard state(stateMutex_);
    stats_.clockStart = clockStart_;
    stats_.clockEnd = clockEnd_;
  }
}

}  // namespace tpscope::probes::runtime_detail
