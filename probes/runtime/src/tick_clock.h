// Raw ticks → ns. The hot path stores rawTicks() (the TSC on x86-64, else steady-clock ns); the flusher converts.
//
// Calibration. Anchors (tick, CLOCK_MONOTONIC ns) are measured at start and at each flush (at most one per ms),
// each from the tightest of a few bracketing monotonic reads. The mapping is piecewise linear through a list of
// FIXED points, and extrapolates past the last one with the long-baseline slope (first anchor → latest anchor, whose
// error shrinks as 1/run length). Before a new anchor is added, the largest tick converted so far is fixed at the value
// it was given, so a tick converts to the same ns in every flush, and the mapping never goes backwards: spans of one
// thread keep their order and nesting across flushes. Error against the monotonic clock: about one anchor's sampling
// error (tens of ns) for ticks before the flush's anchor, which are nearly all of them. 64 Ki points at most (the
// older half is thinned beyond that). Monotonic ns map to unix ns with the CLOCK_REALTIME − CLOCK_MONOTONIC difference measured once
// at start (a realtime step during the run does not tear the trace), and to file ns by subtracting the epoch.
//
// Threading: convert*() and recalibrate() need the caller to hold lock() (the flusher holds it for a whole batch).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace tpscope::probes::runtime_detail {

int64_t monotonicNow() noexcept;  // CLOCK_MONOTONIC ns
int64_t realtimeNow() noexcept;   // CLOCK_REALTIME ns

// True when rawTicks() is the TSC and cpuid says it is invariant (constant rate, runs in deep C-states).
bool tscIsInvariant() noexcept;

class TickClock {
 public:
  // Takes the first anchor; spins ~1 ms for a first slope. epochUnixNs < 0: the epoch is now. skewNs is added to
  // the wall clock this rank reads (tests: a host whose clock is off, RuntimeOptions::testClockOffsetNs).
  void init(int64_t epochUnixNs, int64_t skewNs = 0);
  std::mutex& lock() const { return mutex_; }

  // A fresh anchor (skipped if the last one is under 50 ms old). Caller holds lock().
  void recalibrate();
  // Caller holds lock().
  int64_t ticksToMono(uint64_t ticks) noexcept;
  int64_t ticksToFile(uint64_t ticks) noexcept { return ticksToMono(ticks) + monoToFile_; }

  // Takes lock() itself.
  int64_t ticksToFileLocked(uint64_t ticks) {
    std::lock_guard guard(mutex_);
    return ticksToFile(ticks);
  }

  // Lock-free: fixed at init().
  int64_t monoToFile(int64_t mono) const noexcept { return mono + monoToFile_; }
  int64_t monoToUnix(int64_t mono) const noexcept { return mono + monoToUnix_; }
  int64_t nowUnix() const noexcept { return monoToUnix(monotonicNow()); }
  int64_t nowFile() const noexcept { return monoToFile(monotonicNow()); }
  int64_t epochUnixNs() const noexcept { return epochUnix_; }
  double ticksPerNs() const noexcept { return 4294967296.0 / static_cast<double>(slopeQ32_); }
  std::string source() const;  // "tsc (invariant)", "tsc (not invariant)", "steady_clock"

 private:
  struct Point {
    uint64_t tick;
    int64_t mono;
    int64_t slopeQ32;  // ns per tick (Q32) of the segment that ENDS at this point (unused for the first)
  };
  void measure(uint64_t* ticks, int64_t* mono) const noexcept;
  int64_t extrapolate(uint64_t ticks) const noexcept;
  void addPoint(uint64_t tick, int64_t mono);

  mutable std::mutex mutex_;
  std::vector<Point> fixed_;         // ascending in tick and mono
  uint64_t firstTick_ = 0;           // the first measured anchor
  int64_t firstMono_ = 0;
  int64_t slopeQ32_ = int64_t{1} << 32;  // long-baseline ns per tick, Q32
  uint64_t maxConverted_ = 0;        // largest tick converted past the last fixed point
  bool convertedPast_ = false;
  int64_t lastAnchorMono_ = 0;
  int64_t monoToUnix_ = 0;
  int64_t epochUnix_ = 0;
  int64_t monoToFile_ = 0;
};

}  // namespace tpscope::probes::runtime_detail
