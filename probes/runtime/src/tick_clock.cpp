#include "tick_clock.h"

#include <time.h>

#include <algorithm>

#include "tpscope/probes/probes.h"

#if TPSCOPE_TICKS_ARE_TSC
#include <cpuid.h>
#endif

namespace tpscope::probes::runtime_detail {

namespace {
int64_t readClock(clockid_t id) noexcept {
  timespec ts{};
  clock_gettime(id, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

constexpr int64_t kMinAnchorGapNs = 1'000'000;  // an anchor per flush, up to one per ms
constexpr size_t kMaxPoints = 1 << 16;        // then the older half is thinned (ticks that old are rarely converted)

int64_t slopeQ32(uint64_t t0, int64_t m0, uint64_t t1, int64_t m1) {
  if (t1 <= t0 || m1 <= m0) return 0;
  return static_cast<int64_t>((static_cast<unsigned __int128>(m1 - m0) << 32) / (t1 - t0));
}
}  // namespace

int64_t monotonicNow() noexcept { return readClock(CLOCK_MONOTONIC); }
int64_t realtimeNow() noexcept { return readClock(CLOCK_REALTIME); }

bool tscIsInvariant() noexcept {
#if TPSCOPE_TICKS_ARE_TSC
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0x80000000u, nullptr) < 0x80000007u) return false;
  __cpuid(0x80000007u, eax, ebx, ecx, edx);
  return (edx & (1u << 8)) != 0;
#else
  return false;
#endif
}

void TickClock::measure(uint64_t* ticks, int64_t* mono) const noexcept {
  int64_t bestGap = INT64_MAX;
  for (int i = 0; i < 7; ++i) {
    const int64_t m1 = monotonicNow();
    const uint64_t t = rawTicks();
    const int64_t m2 = monotonicNow();
    if (m2 - m1 < bestGap) {
      bestGap = m2 - m1;
      *ticks = t;
      *mono = m1 + (m2 - m1) / 2;
    }
  }
}

void TickClock::init(int64_t epochUnixNs, int64_t skewNs) {
  std::lock_guard guard(mutex_);
  fixed_.clear();
  convertedPast_ = false;
  maxConverted_ = 0;
  measure(&firstTick_, &firstMono_);
  fixed_.push_back(Point{firstTick_, firstMono_, 0});
  lastAnchorMono_ = firstMono_;
  // CLOCK_REALTIME − CLOCK_MONOTONIC, from the tightest bracket of a few tries.
  int64_t bestGap = INT64_MAX;
  for (int i = 0; i < 7; ++i) {
    const int64_t m1 = monotonicNow();
    const int64_t r = realtimeNow();
    const int64_t m2 = monotonicNow();
    if (m2 - m1 < bestGap) {
      bestGap = m2 - m1;
      monoToUnix_ = r - (m1 + (m2 - m1) / 2);
    }
  }
  monoToUnix_ += skewNs;
  epochUnix_ = epochUnixNs >= 0 ? epochUnixNs : firstMono_ + monoToUnix_;
  monoToFile_ = monoToUnix_ - epochUnix_;
#if TPSCOPE_TICKS_ARE_TSC
  // A first slope over ~1 ms (refined at every anchor); this short segment is not fixed.
  while (monotonicNow() - firstMono_ < 1'000'000) {
  }
  uint64_t t = 0;
  int64_t m = 0;
  measure(&t, &m);
  if (const int64_t s = slopeQ32(firstTick_, firstMono_, t, m); s > 0) slopeQ32_ = s;
#else
  slopeQ32_ = int64_t{1} << 32;  // steady-clock ns: one tick is one ns
#endif
}

int64_t TickClock::extrapolate(uint64_t ticks) const noexcept {
  const Point& last = fixed_.back();
  const __int128 d = static_cast<__int128>(static_cast<int64_t>(ticks - last.tick));
  return last.mono + static_cast<int64_t>((d * slopeQ32_) >> 32);
}

int64_t TickClock::ticksToMono(uint64_t ticks) noexcept {
  const Point& last = fixed_.back();
  if (ticks >= last.tick) {
    if (!convertedPast_ || ticks > maxConverted_) {
      maxConverted_ = ticks;
      convertedPast_ = true;
    }
    return extrapolate(ticks);
  }
  if (ticks < fixed_.front().tick) {  // before the start: the long-baseline slope backwards
    const __int128 d = -static_cast<__int128>(fixed_.front().tick - ticks);
    return fixed_.front().mono + static_cast<int64_t>((d * slopeQ32_) >> 32);
  }
  // The segment [a, b] holding `ticks`: usually the last one.
  size_t b = fixed_.size() - 1;
  if (ticks < fixed_[b - 1].tick) {
    b = static_cast<size_t>(std::upper_bound(fixed_.begin(), fixed_.end(), ticks,
                                             [](uint64_t t, const Point& p) { return t < p.tick; }) -
                            fixed_.begin());
  }
  const Point& pa = fixed_[b - 1];
  const Point& pb = fixed_[b];
  const int64_t v = pa.mono + static_cast<int64_t>((static_cast<unsigned __int128>(ticks - pa.tick) *
                                                    static_cast<uint64_t>(pb.slopeQ32)) >> 32);
  return std::min(v, pb.mono);
}

void TickClock::addPoint(uint64_t tick, int64_t mono) {
  const Point& last = fixed_.back();
  if (tick <= last.tick || mono < last.mono) return;
  fixed_.push_back(Point{tick, mono, slopeQ32(last.tick, last.mono, tick, mono)});
  if (fixed_.size() > kMaxPoints) {
    // Drop every other point of the older half; segment slopes are recomputed across the gaps.
    std::vector<Point> thinned;
    thinned.reserve(kMaxPoints);
    const size_t half = fixed_.size() / 2;
    for (size_t i = 0; i < fixed_.size(); ++i) {
      if (i > 0 && i < half && (i & 1)) continue;
      Point p = fixed_[i];
      if (!thinned.empty()) p.slopeQ32 = slopeQ32(thinned.back().tick, thinned.back().mono, p.tick, p.mono);
      thinned.push_back(p);
    }
    fixed_.swap(thinned);
  }
}

void TickClock::recalibrate() {
#if TPSCOPE_TICKS_ARE_TSC
  const int64_t now = monotonicNow();
  if (now - lastAnchorMono_ < kMinAnchorGapNs) return;
  uint64_t t = 0;
  int64_t m = 0;
  measure(&t, &m);
  lastAnchorMono_ = m;
  // Pin what was already handed out past the last fixed point, then the new anchor.
  if (convertedPast_) {
    addPoint(maxConverted_, extrapolate(maxConverted_));
    convertedPast_ = false;
  }
  addPoint(t, m);
  if (const int64_t s = slopeQ32(firstTick_, firstMono_, t, m); s > 0) slopeQ32_ = s;
#endif
}

std::string TickClock::source() const {
#if TPSCOPE_TICKS_ARE_TSC
  return tscIsInvariant() ? "tsc (invariant)" : "tsc (not invariant)";
#else
  return "steady_clock";
#endif
}

}  // namespace tpscope::probes::runtime_detail
