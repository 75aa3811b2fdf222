// The Recorder's flusher: the thread that drains the per-thread buffers and queued records into the rank file.
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <limits>
#include <mutex>
#include <optional>

#include "recorder.h"
#include "signals.h"

namespace tpscope::probes::runtime_detail {

namespace {
// A site name as a JSON string (names are C literals; quotes, backslashes and control characters escaped).
std::string jsonQuoted(const char* name) {
  std::string out = "\"";
  for (const char* c = name != nullptr ? name : ""; *c != '\0'; ++c) {
    const auto u = static_cast<unsigned char>(*c);
    if (*c == '"' || *c == '\\') out += '\\';
    if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    } else {
      out += *c;
    }
  }
  return out + "\"";
}

// Without its eventfd (eventfd failed), nothing can wake the flusher early: it then looks at fill levels this often.
constexpr int kPollMsWithoutWakes = 5;
constexpr int64_t kHeartbeatNs = 1'000'000'000;  // an idle session still commits a recorder_stats row this often

int64_t threadCpuNow() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace

// ------------------------------------------------------------------------------------------------------------------
// Flusher

bool Recorder::anyBufferFilling() {
  std::lock_guard lock(registryMutex_);
  for (const auto& e : entries_) {
    const ThreadBuffer& b = *e->buffer;
    if (b.head.load(std::memory_order_relaxed) - b.tail.load(std::memory_order_relaxed) >= ThreadBuffer::kDrainAt)
      return true;
  }
  return false;
}

void Recorder::flusherMain() {
  pthread_setname_np(pthread_self(), "tpscope-flush");
  markFlusherThread();
  SignalState& sig = signalState();
  const int64_t interval = std::chrono::duration_cast<std::chrono::nanoseconds>(options_.flushInterval).count();
  const int wakeFd = wakeFd_.load();
  // Asleep until the next flush unless woken: by stop, flushNow, a dump signal or a filling ring (ThreadBuffer::push).
  // It used to look at the rings every 5 ms, and on a host whose cores all train, each look preempted a rank.
  const int64_t maxWaitMs = wakeFd >= 0 ? std::numeric_limits<int>::max() : kPollMsWithoutWakes;
  int64_t nextFlush = monotonicNow() + interval;
  for (;;) {
    const int64_t now = monotonicNow();
    const int waitMs = static_cast<int>(std::clamp<int64_t>((nextFlush - now + 999'999) / 1'000'000, 0, maxWaitMs));
    pollfd pfd{wakeFd, POLLIN, 0};
    if (poll(&pfd, 1, waitMs) > 0) {
      uint64_t drained = 0;
      [[maybe_unused]] ssize_t n = read(wakeFd, &drained, sizeof drained);
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
    const bool due = monotonicNow() >= nextFlush || anyBufferFilling();
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
  writeOpenSpans(entries, tally);
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

// 2b. Where each thread is now: its open spans (the owner may open or close one while they are copied; a stack that
// changed meanwhile is left out this time: a thread that is stuck does not change).
void Recorder::writeOpenSpans(const std::vector<BufferEntry*>& entries, FlushTally& tally) {
  if (!publishOpenSpans_.load(std::memory_order_relaxed)) return;
  std::string json;
  for (const BufferEntry* e : entries) {
    const ThreadBuffer& b = *e->buffer;
    if (b.retired.load(std::memory_order_acquire)) continue;
    const uint32_t gen = b.openGen.load(std::memory_order_acquire);
    const uint32_t depth = std::min(b.openDepth.load(std::memory_order_relaxed), ThreadBuffer::kOpenDepth);
    std::string stack;
    for (uint32_t i = 0; i < depth; ++i) {
      const ThreadBuffer::OpenSlot& slot = b.open[i];
      const Site* site = slot.site.load(std::memory_order_relaxed);
      if (site == nullptr) continue;
      stack += stack.empty() ? "" : ",";
      stack += "{\"thread\":" + std::to_string(e->threadId) + ",\"name\":" + jsonQuoted(site->name) +
               ",\"kind\":" + std::to_string(static_cast<int>(site->kind)) +
               ",\"layer\":" + std::to_string(slot.layer.load(std::memory_order_relaxed)) +
               ",\"begin_ns\":" + std::to_string(clock_.ticksToFile(slot.t0.load(std::memory_order_relaxed))) + "}";
    }
    if (stack.empty() || b.openGen.load(std::memory_order_acquire) != gen) continue;
    json += (json.empty() ? "" : ",") + stack;
  }
  json = "[" + json + "]";
  if (json == lastOpenSpans_) return;
  tally.check(writer_->setMeta(tracedb::meta_keys::kOpenSpans, json));
  lastOpenSpans_ = std::move(json);
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
