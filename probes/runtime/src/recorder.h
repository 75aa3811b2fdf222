// The process-wide recorder: the Sink behind the probe API, its flusher thread and its session state.
// Internal to probes/runtime; the public surface is runtime.h and runtime_hooks.h.
//
// Lifetime: one Recorder per process, created on first use and never destroyed (threads may still hold buffers
// when static destructors run). Buffers outlive sessions: a thread keeps its ThreadBuffer (and dense thread id)
// across stop()/start(); a buffer is freed only after its thread has exited and the flusher has drained it.
//
// Locks (never held while calling out, except participantsMutex_ around FlushParticipant::onFlush):
//   lifecycleMutex_  start/stop/setClockStore            registryMutex_  buffers and lanes
//   stateMutex_      rank info, meta, groups, clock      recordsMutex_   queued non-span records
//   controlMutex_    flush requests / completion          statsMutex_     the published RecorderStats
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "collective_ring.h"
#include "tick_clock.h"
#include "tpscope/probes/probes.h"
#include "tpscope/probes/runtime.h"
#include "tpscope/probes/runtime_hooks.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::probes::runtime_detail {

struct BufferEntry {
  ThreadBuffer* buffer = nullptr;
  uint32_t threadId = 0;
  int64_t osTid = 0;
  std::string name;
  uint64_t droppedSeen = 0;       // buffer->dropped already counted
  uint64_t threadRowSession = 0;  // session whose file has this thread's row
};

struct Lane {
  uint32_t threadId = 0;
  std::string kind, name;
  uint64_t threadRowSession = 0;
};

struct RawStepStat {
  StepStat stat;
  int rank = 0;
};
struct RawAlert {
  tracedb::AlertRow row;
  uint64_t ticks = 0;
};
struct RawCounter {
  std::string name;
  double value = 0;
  uint64_t ticks = 0;
};

struct PendingRecords {
  std::vector<tracedb::GradStatRow> grads;
  std::vector<RawStepStat> steps;
  std::vector<RawAlert> alerts;
  std::vector<RawCounter> counters;
  size_t size() const { return grads.size() + steps.size() + alerts.size() + counters.size(); }
  void clear() {
    grads.clear();
    steps.clear();
    alerts.clear();
    counters.clear();
  }
};

// What one flush wrote and dropped, and its first error (flusher thread only).
struct FlushTally {
  int64_t spansWritten = 0, spansDropped = 0, recordsWritten = 0, recordsDropped = 0;
  bool wroteSomething = false;
  std::string firstError;
  void check(const tracedb::Status& s);  // keeps the first error
  void count(const tracedb::Status& s);  // check, and one record written or dropped
};

class Recorder final : public Sink {
 public:
  static Recorder& instance();

  // Sink (any thread, never throw).
  ThreadBuffer* acquireThreadBuffer() noexcept override;
  uint64_t collectiveEnqueued(const CollectiveDesc& desc, uint64_t enqueueTicks) noexcept override;
  void collectiveState(uint64_t handle, CollectiveState state, uint64_t ticks) noexcept override;
  void gradStats(int step, std::span<const GradStat> stats) noexcept override;
  void stepStat(const StepStat& stat) noexcept override;
  void alert(const Alert& alert) noexcept override;
  void counter(std::string_view name, double value, uint64_t ticks) noexcept override;
  void flush() noexcept override { flushNow(); }
  void bufferFilling() noexcept override;

  // runtime.h
  tracedb::Status start(const RuntimeOptions& options);
  void stop(std::string_view exitReason);
  bool started() const { return started_.load(std::memory_order_acquire); }
  void flushNow();
  void setRankInfo(const tracedb::RankInfo& info);
  void setMeta(std::string_view key, std::string_view value);
  void putGroup(const tracedb::GroupInfo& group);
  void setThreadName(std::string_view name);
  void publishOpenSpans(bool on) noexcept { publishOpenSpans_.store(on, std::memory_order_relaxed); }
  void setClockStore(std::shared_ptr<KvStore> store);
  RecorderStats stats() const;
  std::filesystem::path outputPath() const;

  // runtime_hooks.h
  void addParticipant(FlushParticipant* p);
  void removeParticipant(FlushParticipant* p);
  std::optional<uint32_t> threadIdForOsTid(int64_t tid);
  std::optional<int64_t> osTidForThreadId(uint32_t thread);
  uint32_t registerLane(std::string_view kind, std::string_view name);
  int64_t fileNsFromMonotonicNs(int64_t mono) const;
  int64_t fileNsFromTicks(uint64_t ticks) const;
  int64_t nowUnixNs() const;

  void onFork();  // in the child: recording off, nothing of the parent's session is touched again

 private:
  Recorder() = default;
  BufferEntry* entryForThisThread() noexcept;
  void flusherMain();
  // The steps of start(), in its order (under lifecycleMutex_).
  tracedb::Status openRankFile();
  void resetSession();
  tracedb::Status startFlusher();
  void flushOnce(bool final, std::string_view finalReason);
  // The steps of flushOnce, in its order (flusher thread; the clock's lock held up to runParticipants).
  std::vector<BufferEntry*> snapshotBuffers(std::vector<tracedb::ThreadInfo>& threadRows);
  void drainSpans(const std::vector<BufferEntry*>& entries, FlushTally& tally, std::vector<BufferEntry*>& retired);
  void drainBuffer(BufferEntry& e, bool wantRefs, FlushTally& tally);
  // The spans open on the threads now (ThreadBuffer::open) into meta open_spans, when they changed (and published).
  void writeOpenSpans(const std::vector<BufferEntry*>& entries, FlushTally& tally);
  void writeSessionState(bool final, std::string_view finalReason, FlushTally& tally,
                         std::vector<RawCounter>& clockCounters);
  void writeCollectives(FlushTally& tally);
  void writeQueuedRecords(const std::vector<RawCounter>& clockCounters, FlushTally& tally);
  void runParticipants(bool final, FlushTally& tally);
  RecorderStats commitWithStats(int64_t t0, bool final, FlushTally& tally);
  void freeRetired(const std::vector<BufferEntry*>& retired);
  void publishStats(const RecorderStats& s);
  bool anyBufferFilling();
  void wakeFlusher() noexcept;  // one write to wakeFd_ (the flusher reads them all at its next wake)
  void runClockAlignment(const std::string& tag, std::chrono::milliseconds timeout, bool atStart);
  void joinClockThread();
  void startClockThread();
  static int64_t perSpanCostPs();

  // Process-wide.
  std::mutex registryMutex_;
  std::vector<std::unique_ptr<BufferEntry>> entries_;
  std::vector<Lane> lanes_;
  uint32_t nextThreadId_ = 0;
  std::mutex participantsMutex_;
  std::vector<FlushParticipant*> participants_;
  std::atomic<bool> forked_{false};

  // Session.
  std::mutex lifecycleMutex_;
  std::atomic<bool> started_{false};
  uint64_t session_ = 0;
  RuntimeOptions options_;
  std::filesystem::path path_;
  mutable TickClock clock_;  // conversions mutate its fixed points (under its lock)
  std::atomic<bool> clockReady_{false};
  std::unique_ptr<tracedb::Writer> writer_;  // flusher thread only while the session runs
  std::thread flusher_;
  // The flusher's eventfd: stop, flushNow, the dump signals and a filling ring write to it. Made at the first start
  // and kept for the process's life, so a producer that read it just before a stop never writes to a closed (or
  // reused) descriptor.
  std::atomic<int> wakeFd_{-1};
  CollectiveRing ring_;
  int64_t perSpanCostPs_ = 0;

  std::mutex stateMutex_;
  tracedb::RankInfo rankInfo_;
  bool rankDirty_ = false;
  std::vector<std::pair<std::string, std::string>> pendingMeta_;
  std::vector<tracedb::GroupInfo> pendingGroups_;
  std::optional<ClockOffset> clockStart_, clockEnd_;
  std::vector<RawCounter> clockCounters_;
  std::shared_ptr<KvStore> clockStore_;
  std::thread clockThread_;

  std::mutex recordsMutex_;
  PendingRecords records_;
  int64_t recordsDroppedQueue_ = 0;
  std::atomic<int64_t> recordsDroppedFailed_{0};  // records a Sink call lost to an exception (bad_alloc), any thread

  std::mutex controlMutex_;
  std::condition_variable controlCv_;
  uint64_t flushRequested_ = 0, flushDone_ = 0;
  bool stopRequested_ = false;
  std::string stopReason_;
  bool flusherExited_ = false;

  // Flusher-private.
  std::unordered_map<const Site*, uint32_t> siteNames_;
  std::vector<tracedb::SpanRow> rows_;
  std::vector<HostSpanRef> hostRefs_;
  std::vector<CollectiveSnapshot> collectives_;
  PendingRecords recordsLocal_;
  int64_t lastCommitMono_ = 0;
  int64_t recordsDroppedCum_ = 0;  // records dropped outside the collective ring, this session
  int64_t failedFlushes_ = 0;      // flushes whose transaction failed (full disk, ...), this session; flusher only
  std::string lastFlushError_;     // the last one's reason (a repeat is counted, not logged again)
  std::string lastOpenSpans_;      // meta open_spans as last written
  std::atomic<bool> publishOpenSpans_{true};

  mutable std::mutex statsMutex_;
  RecorderStats stats_;
};

// Shared by the recorder's files: this thread's kernel thread id (gettid), and one line on stderr prefixed
// "tpscope recorder: " (capture reads that prefix in the ranks' logs: cli/src/capture/rank_outcome.h).
int64_t osTid();
void logLine(const std::string& line);

}  // namespace tpscope::probes::runtime_detail
