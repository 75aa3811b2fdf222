// The Recorder's lifecycle (start, stop, the rank file, the flusher thread), its session data (rank info, meta,
// groups, clock alignment) and the hooks other recorders use (flush participants, lanes, time conversion).
#include "recorder.h"

#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>

#include "signals.h"

namespace tpscope::probes::runtime_detail {

namespace {

constexpr uint32_t kLaneBase = 65536;

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
  if (wakeFd_.load() < 0) {
    wakeFd_.store(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  } else {
    uint64_t stale = 0;  // wakes left from the last session
    [[maybe_unused]] ssize_t n = read(wakeFd_.load(), &stale, sizeof stale);
  }
  signalState().finalRequested.store(false);
  signalState().done.store(signalState().requested.load());
  try {
    DumpSignalsBlocked blocked;  // inherited by the flusher from its first instruction
    flusher_ = std::thread([this] { flusherMain(); });
  } catch (const std::exception& e) {
    writer_.reset();
    return tracedb::Status::error(std::string("tpscope recorder: cannot start the flusher thread: ") + e.what());
  }
  signalState().wakeFd.store(wakeFd_.load());
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
  wakeFlusher();
  if (flusher_.joinable()) flusher_.join();
  signalState().wakeFd.store(-1);
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

void Recorder::wakeFlusher() noexcept {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wakeFd_.load(std::memory_order_relaxed), &one, sizeof one);
}

void Recorder::bufferFilling() noexcept {
  if (started() && !forked_.load(std::memory_order_relaxed)) wakeFlusher();
}

void Recorder::flushNow() {
  if (!started()) return;
  if (std::this_thread::get_id() == flusher_.get_id()) return;
  std::unique_lock lock(controlMutex_);
  if (flusherExited_) return;
  const uint64_t ticket = ++flushRequested_;
  wakeFlusher();
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

}  // namespace tpscope::probes::runtime_detail
