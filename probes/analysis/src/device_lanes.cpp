#include "device_lanes.h"

#include <algorithm>
#include <limits>

#include "tpscope/analysis/breakdown.h"
#include "tpscope/tracedb/records.h"

namespace tpscope::analysis::detail {

using tracedb::SpanKind;

void DeviceLanes::addSpan(int kind, int64_t begin, int64_t end, int64_t correlation) {
  switch (static_cast<SpanKind>(kind)) {
    case SpanKind::Kernel: compute.emplace_back(begin, end); break;
    case SpanKind::NcclKernel: comm.emplace_back(begin, end); break;
    case SpanKind::Memcpy:
    case SpanKind::Memset: memory.emplace_back(begin, end); break;
    default: return;  // annotations and other lane content are not GPU work
  }
  starts.emplace_back(begin, correlation);
}

void DeviceLanes::addLaunch(int64_t correlation, int64_t begin) {
  auto [it, fresh] = launchNs.try_emplace(correlation, begin);
  if (!fresh) it->second = std::max(it->second, begin);
}

void DeviceLanes::mergeFrom(DeviceLanes&& o) {
  auto append = [](auto& a, auto& b) { a.insert(a.end(), b.begin(), b.end()); };
  append(compute, o.compute);
  append(comm, o.comm);
  append(memory, o.memory);
  append(starts, o.starts);
  for (const auto& [corr, ns] : o.launchNs) addLaunch(corr, ns);
}

IdleSplit splitIdle(const IntervalSet& busy, DeviceLanes& lanes, int64_t lo, int64_t hi) {
  std::sort(lanes.starts.begin(), lanes.starts.end());
  // The earliest launch of the work that begins at t; INT64_MAX when none of it has a known launch.
  auto earliestLaunch = [&](int64_t t) {
    int64_t best = std::numeric_limits<int64_t>::max();
    auto it = std::lower_bound(lanes.starts.begin(), lanes.starts.end(),
                               std::pair(t, std::numeric_limits<int64_t>::min()));
    for (; it != lanes.starts.end() && it->first == t; ++it) {
      if (it->second < 0) continue;
      if (auto l = lanes.launchNs.find(it->second); l != lanes.launchNs.end()) best = std::min(best, l->second);
    }
    return best;
  };
  std::vector<Interval> host, kernel, other;
  int64_t g0 = lo;
  for (const Interval& work : busy.intervals()) {
    if (work.first > g0) {
      const int64_t launch = earliestLaunch(work.first);
      if (launch != std::numeric_limits<int64_t>::max() && launch > g0) host.emplace_back(g0, work.first);
      else if (work.first - g0 < kKernelWaitNs) kernel.emplace_back(g0, work.first);
      else other.emplace_back(g0, work.first);
    }
    g0 = std::max(g0, work.second);
  }
  if (hi > g0) other.emplace_back(g0, hi);  // after the last GPU work: nothing launched ends it
  return {IntervalSet::fromDisjoint(std::move(host)), IntervalSet::fromDisjoint(std::move(kernel)),
          IntervalSet::fromDisjoint(std::move(other))};
}

}  // namespace tpscope::analysis::detail
