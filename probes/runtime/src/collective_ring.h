// Flight recorder of collectives: a bounded ring of the most recent ones. Every state change marks the entry dirty;
// the flusher takes the dirty entries (upserted by (rank, group, seq)). An entry evicted while still dirty, or a
// state update for an evicted handle, is counted as dropped.
#pragma once

#include <cstdint>
#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tpscope/probes/probes.h"
#include "tpscope/tracedb/records.h"

namespace tpscope::probes::runtime_detail {

struct CollectiveSnapshot {
  tracedb::CollectiveRow row;  // times not yet filled in
  uint64_t enqueueTicks = 0, startTicks = 0, endTicks = 0;
};

class CollectiveRing {
 public:
  void reset(size_t capacity);
  // Any thread. Returns the handle (>= 1); 0 when the ring has no capacity.
  uint64_t enqueue(const CollectiveDesc& desc, uint64_t ticks, int thread, int step);
  void setState(uint64_t handle, CollectiveState state, uint64_t ticks);
  // Flusher: moves the dirty entries' snapshots into `out` (cleared first) and the newly seen groups into `groups`.
  void takeDirty(std::vector<CollectiveSnapshot>* out, std::vector<tracedb::GroupInfo>* groups);
  int64_t dropped() const;

 private:
  // Room reserved per entry at reset (longer values still fit: they allocate). An op name takes up to 32 characters
  // (the functional collectives' "all_gather_into_tensor_coalesced"); a dtype's name fits std::string's own 15.
  static constexpr size_t kReservedGroupChars = 32, kReservedOpChars = 32, kReservedDims = 6,
                          kReservedCallsiteChars = 128;
  struct Entry {
    uint64_t handle = 0;
    bool dirty = false;
    CollectiveSnapshot snap;
  };
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
  std::vector<uint32_t> dirtyList_;
  uint64_t nextHandle_ = 1;
  int64_t dropped_ = 0;
  std::map<std::string, std::vector<int>, std::less<>> groups_;  // seen so far
  std::vector<tracedb::GroupInfo> newGroups_;
};

}  // namespace tpscope::probes::runtime_detail
