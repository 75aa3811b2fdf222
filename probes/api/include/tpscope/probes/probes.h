// tpscope probe API — header-only, no dependencies beyond the standard library.
//
// Design (after Tracy and c10d's flight recorder):
//  * A span site is a `static constexpr Site` (name, category, file, line, kind, phase). The hot path stores a
//    pointer to it plus two raw clock ticks, the current step and a layer index into a bounded per-thread SPSC ring
//    (`ThreadBuffer`). It never formats, allocates, locks or touches SQLite. A full ring drops the span and counts it.
//  * Compiled in but not recording, a span costs one relaxed atomic load (`detail::g_recording`).
//  * With TPSCOPE_PROBES_ENABLED == 0 every TPS_* macro compiles to nothing.
//  * Everything that is not a span (collectives, grad stats, step stats, alerts, counters) is rarer and goes through
//    the `Sink` installed by the runtime (probes/runtime). Without a runtime linked and started, `sink()` is null and
//    every call below is a no-op. Probes never throw.
//  * Ticks are raw (`rawTicks()`: the TSC on x86-64, else steady_clock ns); the runtime converts them to ns when it
//    flushes ("record raw, convert later").
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <span>
#include <string_view>

#include "tpscope/vocabulary/severity.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <x86intrin.h>
#define TPSCOPE_TICKS_ARE_TSC 1
#else
#include <chrono>
#define TPSCOPE_TICKS_ARE_TSC 0
#endif

#ifndef TPSCOPE_PROBES_ENABLED
#define TPSCOPE_PROBES_ENABLED 1
#endif

namespace tpscope::probes {

// An alert's grade: the one severity scale, defined with the other shared names (tpscope/vocabulary/).
using vocabulary::Severity;

// Stored as integers in the trace (spans.kind); names in docs/schema.md and the `span_kinds` table.
enum class SpanKind : uint8_t {
  Compute = 0,     // host-side compute of a layer or phase
  Comm = 1,        // a collective as seen by the host (enqueue → completion)
  Data = 2,        // data loading
  Optimizer = 3,   // optimizer step, clipping
  Step = 4,        // one whole training step
  Checkpoint = 5,  // checkpoint save/load
  Kernel = 6,      // GPU kernel (CUPTI)
  Memcpy = 7,      // GPU memcpy (CUPTI)
  Memset = 8,      // GPU memset (CUPTI)
  NcclKernel = 9,  // GPU NCCL kernel (CUPTI)
  Other = 10,
  Wait = 11,       // host blocked waiting (sync, store, barrier outside the communicator)
};

// Stored as integers (spans.phase, collectives.phase); names in the `phases` table, which are phaseName's.
enum class Phase : uint8_t { None = 0, Forward = 1, Backward = 2, Optimizer = 3, Data = 4, Checkpoint = 5, Other = 6 };
inline constexpr std::array<std::string_view, 7> kPhaseNames = {"none", "fwd",        "bwd",  "optimizer",
                                                                "data", "checkpoint", "other"};
// "none", "fwd", "bwd", "optimizer", "data", "checkpoint", "other"; "unknown" for a value out of range.
constexpr std::string_view phaseName(Phase phase) {
  const auto i = static_cast<size_t>(phase);
  return i < kPhaseNames.size() ? kPhaseNames[i] : std::string_view("unknown");
}

// Flight-recorder states of a collective (collectives.state).
enum class CollectiveState : uint8_t { Scheduled = 0, Started = 1, Completed = 2, TimedOut = 3, Failed = 4 };

// A static description of a span site. Must outlive the process's recording (use `static constexpr`).
struct Site {
  const char* name;
  const char* category;
  const char* file;
  uint32_t line;
  SpanKind kind;
  Phase phase;
};

// Raw timestamp. Any thread; ~11 ns on x86-64 (rdtsc), ~27 ns elsewhere.
inline uint64_t rawTicks() noexcept {
#if TPSCOPE_TICKS_ARE_TSC
  return __rdtsc();
#else
  return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

// One recorded span, 32 bytes. `site` is never null.
struct SpanEvent {
  const Site* site;
  uint64_t t0;  // raw ticks
  uint64_t t1;  // raw ticks
  int32_t step;
  int16_t layer;  // -1: not a layer span
  uint16_t reserved;
};
static_assert(sizeof(SpanEvent) == 32);

namespace detail {
inline void bufferFilling() noexcept;  // below: wakes the flusher
}  // namespace detail

// Bounded single-producer (the owning thread) / single-consumer (the runtime's flusher) ring.
struct ThreadBuffer {
  static constexpr uint64_t kCapacity = uint64_t{1} << 16;  // 2 MiB of events per thread
  static constexpr uint32_t kOpenDepth = 8;                 // open spans kept per thread (deeper ones: counted only)

  // The spans open on the owning thread now (SpanScope), outermost first, for a watcher that asks where a rank is
  // stuck (the flusher publishes them: recorder.h). Written by the owner only; `openGen` changes on every open and
  // close, so a reader that sees it move while it copies the slots reads again later.
  struct OpenSlot {
    std::atomic<const Site*> site{nullptr};
    std::atomic<uint64_t> t0{0};
    std::atomic<int32_t> layer{-1};
  };
  alignas(64) std::atomic<uint32_t> openDepth{0};
  std::atomic<uint32_t> openGen{0};
  OpenSlot open[kOpenDepth];

  alignas(64) std::atomic<uint64_t> head{0};  // next slot to write; producer stores (release)
  uint64_t cachedTail = 0;                    // producer-private copy of `tail`
  uint64_t checkAt = kDrainAt - 1;            // producer-private: the head at which push() next looks at `tail`
  std::atomic<uint64_t> dropped{0};           // producer increments (relaxed); consumer reads
  alignas(64) std::atomic<uint64_t> tail{0};  // next slot to read; consumer stores (release)
  uint32_t threadId = 0;                      // set by the runtime: small dense id (spans.thread)
  std::atomic<bool> retired{false};           // set when the owning thread exits; the runtime frees after draining
  SpanEvent events[kCapacity];

  // A ring this full wants draining before the next flush is due (the flusher's test, and push()'s wake).
  static constexpr uint64_t kDrainAt = kCapacity / 2;

  // Owning thread only. Never blocks; a full ring counts a drop. One compare a push, as a plain bounded ring has: the
  // producer looks at the consumer's `tail` only when its head reaches `checkAt`, the first push that could fill the
  // ring to kDrainAt events (or find it full) for all the producer knows. That push takes the slow path: it wakes the
  // flusher if it fills the ring to kDrainAt (one eventfd write), or moves `checkAt` on. The flusher sleeps until its
  // next flush otherwise, so a busy rank is never preempted to look at fill levels.
  bool push(const SpanEvent& e) noexcept {
    const uint64_t h = head.load(std::memory_order_relaxed);
    if (h >= checkAt) [[unlikely]]
      return pushLooking(e, h);
    events[h & (kCapacity - 1)] = e;
    head.store(h + 1, std::memory_order_release);
    return true;
  }

 private:
  // push()'s slow path, about once per kDrainAt / 8 pushes while the ring is this full and once per kDrainAt pushes
  // otherwise: false when the ring is full (a drop counted). The event is published before the wake: a flusher woken
  // earlier would find the ring one event short of kDrainAt and go back to sleep until its next flush.
  [[gnu::cold, gnu::noinline]] bool pushLooking(const SpanEvent& e, uint64_t h) noexcept {
    cachedTail = tail.load(std::memory_order_acquire);
    if (h - cachedTail >= kCapacity) {
      dropped.store(dropped.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      return false;  // checkAt stays: the next push looks again
    }
    events[h & (kCapacity - 1)] = e;
    head.store(h + 1, std::memory_order_release);
    if (h + 1 - cachedTail >= kDrainAt) {
      const uint64_t again = h + kDrainAt / 8;  // still this full at the next look: wakes again
      checkAt = again < cachedTail + kCapacity ? again : cachedTail + kCapacity;
      detail::bufferFilling();
    } else {
      checkAt = cachedTail + kDrainAt - 1;
    }
    return true;
  }
};

// Describes one collective when it is enqueued. Strings and spans are copied by the sink before it returns.
struct CollectiveDesc {
  std::string_view group;          // process-group name, e.g. "tp-0", "dp-1", "world"
  std::span<const int> groupRanks; // global ranks of the group's members, in group-rank order
  uint64_t seq = 0;                // per-group sequence number, 1-based, identical on every member
  std::string_view op;             // "all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", ...
  std::string_view dtype;          // "float32", "bfloat16", ...
  std::span<const int64_t> shape;  // input tensor shape
  int64_t numel = 0;
  int64_t bytes = 0;               // bytes of the input tensor
  std::string_view callsite;       // TP terms: "layer 3 attention output RowParallel forward all-reduce"
  int layer = -1;
  Phase phase = Phase::None;
  int step = -1;                   // -1: the current step (setStep)
};

// Per-parameter gradient health for one step, taken before any reduction.
struct GradStat {
  std::string_view param;  // "layers.3.mlp.fc2.weight"
  int layer = -1;
  double l2Norm = 0;
  double maxAbs = 0;
  int64_t nanCount = 0;
  int64_t infCount = 0;
  int64_t numel = 0;
};

struct StepStat {
  int step = 0;
  double loss = 0;
  double lr = 0;
  double gradNorm = 0;    // global, after reduction
  double lossScale = 1;
  int64_t tokens = 0;     // tokens processed by this rank in the step
  uint64_t t0 = 0, t1 = 0;  // raw ticks of the step
  bool skipped = false;   // the update was dropped (non-finite policy)
};

struct Alert {
  Severity severity = Severity::Warning;  // severity.h: the one scale
  std::string_view kind;      // one of alert_kinds (alert_kinds.h)
  int step = -1;
  int layer = -1;
  std::string_view param;     // parameter or phase where it shows
  std::string_view message;   // one human sentence
  std::string_view evidence;  // JSON object with the numbers
  uint64_t ticks = 0;         // when it happened (rawTicks()); 0: when the sink receives it
};

// Installed by the runtime. All methods: any thread, never throw; they may lock (not the span hot path).
class Sink {
 public:
  virtual ~Sink() = default;
  virtual ThreadBuffer* acquireThreadBuffer() noexcept = 0;
  // Returns a handle for the state updates below; the enqueue time is taken by the caller (`enqueueTicks`).
  virtual uint64_t collectiveEnqueued(const CollectiveDesc& desc, uint64_t enqueueTicks) noexcept = 0;
  virtual void collectiveState(uint64_t handle, CollectiveState state, uint64_t ticks) noexcept = 0;
  virtual void gradStats(int step, std::span<const GradStat> stats) noexcept = 0;
  virtual void stepStat(const StepStat& stat) noexcept = 0;
  virtual void alert(const Alert& alert) noexcept = 0;
  virtual void counter(std::string_view name, double value, uint64_t ticks) noexcept = 0;
  // Writes everything buffered so far to disk before returning (the "dump").
  virtual void flush() noexcept = 0;
  // A thread's ring holds ThreadBuffer::kDrainAt events or more (ThreadBuffer::push): drain it soon. Span hot path:
  // no lock.
  virtual void bufferFilling() noexcept {}
};

namespace detail {
inline std::atomic<bool> g_recording{false};
inline std::atomic<Sink*> g_sink{nullptr};
inline std::atomic<int32_t> g_step{-1};
// Range hooks around every SpanScope while recording: the NVTX mirror (probes/nvtx, when CUDA is present and a tool
// listens) or the replay's op check (core/op_check.h, which chains to the one it found). Null otherwise.
inline std::atomic<void (*)(const Site*, int16_t layer)> g_rangePush{nullptr};
inline std::atomic<void (*)()> g_rangePop{nullptr};
inline thread_local ThreadBuffer* t_buffer = nullptr;

inline void bufferFilling() noexcept {
  if (Sink* s = g_sink.load(std::memory_order_acquire)) s->bufferFilling();
}

// The calling thread's ring, acquired from the sink at its first span; null without a sink (or memory).
inline ThreadBuffer* threadBuffer() noexcept {
  ThreadBuffer* b = t_buffer;
  if (b == nullptr) [[unlikely]] {
    Sink* s = g_sink.load(std::memory_order_acquire);
    if (s == nullptr) return nullptr;
    b = t_buffer = s->acquireThreadBuffer();
  }
  return b;
}

inline void emitSpan(const Site* site, uint64_t t0, uint64_t t1, int16_t layer) noexcept {
  ThreadBuffer* b = threadBuffer();
  if (b == nullptr) [[unlikely]] return;
  b->push(SpanEvent{site, t0, t1, g_step.load(std::memory_order_relaxed), layer, 0});
}

// SpanScope's open and close: the thread's open-span stack (ThreadBuffer::open). A few relaxed stores.
inline void openSpan(const Site* site, uint64_t t0, int16_t layer) noexcept {
  ThreadBuffer* b = threadBuffer();
  if (b == nullptr) [[unlikely]] return;
  const uint32_t d = b->openDepth.load(std::memory_order_relaxed);
  if (d < ThreadBuffer::kOpenDepth) {
    ThreadBuffer::OpenSlot& slot = b->open[d];
    slot.site.store(site, std::memory_order_relaxed);
    slot.t0.store(t0, std::memory_order_relaxed);
    slot.layer.store(layer, std::memory_order_relaxed);
  }
  b->openDepth.store(d + 1, std::memory_order_relaxed);
  b->openGen.store(b->openGen.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}
inline void closeSpan() noexcept {
  ThreadBuffer* b = t_buffer;
  if (b == nullptr) return;
  const uint32_t d = b->openDepth.load(std::memory_order_relaxed);
  if (d == 0) return;
  b->openDepth.store(d - 1, std::memory_order_relaxed);
  b->openGen.store(b->openGen.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}
}  // namespace detail

// True while a runtime is recording. One relaxed load.
inline bool recording() noexcept { return detail::g_recording.load(std::memory_order_relaxed); }
// The installed sink while recording, else null.
inline Sink* sink() noexcept { return recording() ? detail::g_sink.load(std::memory_order_acquire) : nullptr; }

// The training step that spans and records are attributed to. Any thread.
inline void setStep(int step) noexcept { detail::g_step.store(step, std::memory_order_relaxed); }
inline int currentStep() noexcept { return detail::g_step.load(std::memory_order_relaxed); }

// RAII span. Compiled in but off: one relaxed load in the constructor.
class SpanScope {
 public:
  explicit SpanScope(const Site* site, int layer = -1) noexcept
      : site_(site), layer_(static_cast<int16_t>(layer)), active_(recording()) {
    if (active_) [[unlikely]] {
      if (auto push = detail::g_rangePush.load(std::memory_order_relaxed)) push(site_, layer_);
      t0_ = rawTicks();
      detail::openSpan(site_, t0_, layer_);
    }
  }
  ~SpanScope() {
    if (active_) [[unlikely]] {
      detail::closeSpan();
      detail::emitSpan(site_, t0_, rawTicks(), layer_);
      if (auto pop = detail::g_rangePop.load(std::memory_order_relaxed)) pop();
    }
  }
  SpanScope(const SpanScope&) = delete;
  SpanScope& operator=(const SpanScope&) = delete;

 private:
  const Site* site_;
  uint64_t t0_ = 0;
  int16_t layer_;
  bool active_;
};

// Records a span whose times were taken elsewhere (raw ticks).
inline void emitSpan(const Site* site, uint64_t t0, uint64_t t1, int layer = -1) noexcept {
  if (recording()) detail::emitSpan(site, t0, t1, static_cast<int16_t>(layer));
}

inline void counter(std::string_view name, double value) noexcept {
  if (Sink* s = sink()) s->counter(name, value, rawTicks());
}

}  // namespace tpscope::probes

#define TPS_CONCAT_INNER(a, b) a##b
#define TPS_CONCAT(a, b) TPS_CONCAT_INNER(a, b)

#if TPSCOPE_PROBES_ENABLED
// TPS_SPAN(name, kind, phase): a span over the rest of the enclosing scope. name: string literal.
#define TPS_SPAN(name, kind, phase)                                                                        \
  static constexpr ::tpscope::probes::Site TPS_CONCAT(tps_site_, __LINE__){                               \
      name, "", __FILE__, __LINE__, ::tpscope::probes::SpanKind::kind, ::tpscope::probes::Phase::phase};  \
  ::tpscope::probes::SpanScope TPS_CONCAT(tps_scope_, __LINE__)(&TPS_CONCAT(tps_site_, __LINE__))
// TPS_SPAN_LAYER(name, kind, phase, layer): the same, attributed to a layer index (int, evaluated only when on).
#define TPS_SPAN_LAYER(name, kind, phase, layer)                                                           \
  static constexpr ::tpscope::probes::Site TPS_CONCAT(tps_site_, __LINE__){                               \
      name, "", __FILE__, __LINE__, ::tpscope::probes::SpanKind::kind, ::tpscope::probes::Phase::phase};  \
  ::tpscope::probes::SpanScope TPS_CONCAT(tps_scope_, __LINE__)(&TPS_CONCAT(tps_site_, __LINE__), (layer))
#define TPS_STEP(step) ::tpscope::probes::setStep(step)
#define TPS_COUNTER(name, value) ::tpscope::probes::counter(name, value)
#else
#define TPS_SPAN(name, kind, phase) static_cast<void>(0)
#define TPS_SPAN_LAYER(name, kind, phase, layer) static_cast<void>(0)
#define TPS_STEP(step) static_cast<void>(0)
#define TPS_COUNTER(name, value) static_cast<void>(0)
#endif
