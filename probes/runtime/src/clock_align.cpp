// NTP-style clock offset to rank 0 through a shared key-value store.
//
// For round i, rank r (> 0) reads t1, sets <prefix>/<tag>/<r>/<i>/ping, waits for .../pong (rank 0's clock T0 as
// decimal unix ns, written as soon as rank 0 sees the ping), reads t2. T0 was read somewhere in [t1, t2] of true time,
// so offset = T0 − (t1 + t2)/2 is off by at most (t2 − t1)/2; the round with the smallest RTT wins.
// Rank 0 answers the ranks in order; a rank whose first ping does not come within the timeout is skipped, later
// rounds wait at most 1 s each, and the whole service has one budget (2 × timeout + 50 ms per rank), after which
// rank 0 only answers pings that are already there. Any failure leaves the best result so far (rounds counts the completed ones).
#include <algorithm>
#include <charconv>
#include <climits>
#include <string>
#include <time.h>

#include "tpscope/probes/runtime.h"

namespace tpscope::probes {

namespace {
int64_t realtimeNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

std::string key(const ClockAlignOptions& o, std::string_view tag, int rank, int round, const char* what) {
  std::string k = o.prefix;
  k += '/';
  k += tag;
  k += '/';
  k += std::to_string(rank);
  k += '/';
  k += std::to_string(round);
  k += '/';
  k += what;
  return k;
}

constexpr std::chrono::milliseconds kLaterRoundTimeout{1000};
}  // namespace

ClockOffset alignClock(KvStore& store, int rank, int worldSize, std::string_view tag, const ClockAlignOptions& options,
                       int64_t (*nowNs)()) {
  if (nowNs == nullptr) nowNs = &realtimeNs;
  const int rounds = std::max(1, options.rounds);
  ClockOffset best;
  if (rank == 0) {
    best.rounds = rounds;  // rank 0 is its own reference
    // One budget for the whole service: dead ranks cost one timeout between them, not one each.
    const auto deadline = std::chrono::steady_clock::now() + 2 * options.timeout +
                          std::chrono::milliseconds(50) * std::max(0, worldSize - 1);
    for (int r = 1; r < worldSize; ++r) {
      for (int i = 0; i < rounds; ++i) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        auto timeout = i == 0 ? options.timeout : std::min(options.timeout, kLaterRoundTimeout);
        timeout = std::max(std::chrono::milliseconds(1), std::min(timeout, left));
        if (!store.get(key(options, tag, r, i, "ping"), timeout)) break;
        const int64_t t0 = nowNs();
        if (!store.set(key(options, tag, r, i, "pong"), std::to_string(t0))) break;
      }
    }
    return best;
  }
  int64_t bestRtt = INT64_MAX;
  for (int i = 0; i < rounds; ++i) {
    const auto timeout = i == 0 ? options.timeout : std::min(options.timeout, kLaterRoundTimeout);
    const int64_t t1 = nowNs();
    if (!store.set(key(options, tag, rank, i, "ping"), "1")) break;
    const std::optional<std::string> pong = store.get(key(options, tag, rank, i, "pong"), timeout);
    const int64_t t2 = nowNs();
    if (!pong) break;
    int64_t t0 = 0;
    const auto [end, ec] = std::from_chars(pong->data(), pong->data() + pong->size(), t0);
    if (ec != std::errc() || end != pong->data() + pong->size()) break;
    const int64_t rtt = t2 - t1;
    ++best.rounds;
    if (rtt < bestRtt) {
      bestRtt = rtt;
      best.offsetNs = t0 - (t1 + rtt / 2);
      best.uncertaintyNs = (rtt + 1) / 2;
    }
  }
  return best;
}

}  // namespace tpscope::probes
