// Internal: the device-lane side of the time breakdown (breakdown.h) — a rank's GPU-stream work, the launch times
// of its host calls, and the split of the gaps between GPU work into host wait, kernel wait and other.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "intervals.h"

namespace tpscope::analysis::detail {

// One rank's spans on its GPU streams. Filled by one thread; merged with mergeFrom.
struct DeviceLanes {
  std::vector<Interval> compute, comm, memory;      // kernel, nccl_kernel, memcpy + memset
  std::vector<std::pair<int64_t, int64_t>> starts;  // (begin, correlation id or -1) of each span above
  std::unordered_map<int64_t, int64_t> launchNs;    // correlation id -> latest begin of a host span carrying it

  bool active() const { return !starts.empty(); }
  // Adds a GPU-stream span of span kind `kind` (tracedb::SpanKind); kinds that are not GPU work are ignored.
  void addSpan(int kind, int64_t begin, int64_t end, int64_t correlation);
  // Records a host span that carries a correlation id (the launch of the GPU work with that id).
  void addLaunch(int64_t correlation, int64_t begin);
  void mergeFrom(DeviceLanes&& other);
};

struct IdleSplit {
  IntervalSet hostWait, kernelWait, other;
};

// The gaps of `busy` (the rank's GPU work) inside [lo, hi), classified as breakdown.h defines. Sorts lanes.starts.
IdleSplit splitIdle(const IntervalSet& busy, DeviceLanes& lanes, int64_t lo, int64_t hi);

}  // namespace tpscope::analysis::detail
