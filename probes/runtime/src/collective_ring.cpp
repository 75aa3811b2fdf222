#include "collective_ring.h"

namespace tpscope::probes::runtime_detail {

void CollectiveRing::reset(size_t capacity) {
  std::lock_guard lock(mutex_);
  // Each entry's strings and shape get their room now, in one stretch, before the training loop churns the heap:
  // enqueue's assigns then reuse it. Grown there one entry at a time, they were small blocks that live for 4096
  // collectives, carved out of freed tensor buffers: at TP = 2 the rank's heap grew ~5 MB a step (the tensors no
  // longer fit their old holes) and the new pages faulted in, a step slower and the RSS ever larger.
  entries_.assign(capacity, Entry{});
  for (Entry& e : entries_) {
    tracedb::CollectiveRow& r = e.snap.row;
    r.group.reserve(kReservedGroupChars);
    r.op.reserve(kReservedOpChars);
    r.shape.reserve(kReservedDims);
    r.callsite.reserve(kReservedCallsiteChars);
  }
  dirtyList_.clear();
  dirtyList_.reserve(capacity);
  nextHandle_ = 1;
  dropped_ = 0;
  groups_.clear();
  newGroups_.clear();
}

uint64_t CollectiveRing::enqueue(const CollectiveDesc& desc, uint64_t ticks, int thread, int step) {
  std::lock_guard lock(mutex_);
  if (entries_.empty()) {
    ++dropped_;
    return 0;
  }
  const uint64_t handle = nextHandle_++;
  const auto index = static_cast<uint32_t>(handle % entries_.size());
  Entry& e = entries_[index];
  if (e.dirty) {
    ++dropped_;  // its last state never reached the disk
  } else {
    dirtyList_.push_back(index);
  }
  e.handle = handle;
  e.dirty = true;
  tracedb::CollectiveRow& r = e.snap.row;
  r.group.assign(desc.group);
  r.seq = static_cast<int64_t>(desc.seq);
  r.op.assign(desc.op);
  r.dtype.assign(desc.dtype);
  r.shape.assign(desc.shape.begin(), desc.shape.end());
  r.numel = desc.numel;
  r.bytes = desc.bytes;
  r.callsite.assign(desc.callsite);
  r.step = step;
  r.layer = desc.layer;
  r.phase = static_cast<tracedb::Phase>(desc.phase);
  r.thread = thread;
  r.state = tracedb::CollectiveState::Scheduled;
  e.snap.enqueueTicks = ticks;
  e.snap.startTicks = 0;
  e.snap.endTicks = 0;

  auto it = groups_.find(desc.group);
  if (it == groups_.end() || !std::equal(it->second.begin(), it->second.end(), desc.groupRanks.begin(),
                                         desc.groupRanks.end())) {
    std::vector<int> ranks(desc.groupRanks.begin(), desc.groupRanks.end());
    newGroups_.push_back(tracedb::GroupInfo{std::string(desc.group), ranks, ""});
    groups_.insert_or_assign(std::string(desc.group), std::move(ranks));
  }
  return handle;
}

void CollectiveRing::setState(uint64_t handle, CollectiveState state, uint64_t ticks) {
  std::lock_guard lock(mutex_);
  if (entries_.empty() || handle == 0) {
    ++dropped_;
    return;
  }
  const auto index = static_cast<uint32_t>(handle % entries_.size());
  Entry& e = entries_[index];
  if (e.handle != handle) {
    ++dropped_;  // evicted
    return;
  }
  e.snap.row.state = static_cast<tracedb::CollectiveState>(state);
  switch (state) {
    case CollectiveState::Scheduled:
      break;
    case CollectiveState::Started:
      e.snap.startTicks = ticks;
      break;
    case CollectiveState::Completed:
    case CollectiveState::TimedOut:
    case CollectiveState::Failed:
      if (e.snap.startTicks == 0) e.snap.startTicks = e.snap.enqueueTicks;
      e.snap.endTicks = ticks;
      break;
  }
  if (!e.dirty) {
    e.dirty = true;
    dirtyList_.push_back(index);
  }
}

void CollectiveRing::takeDirty(std::vector<CollectiveSnapshot>* out, std::vector<tracedb::GroupInfo>* groups) {
  out->clear();
  groups->clear();
  std::lock_guard lock(mutex_);
  out->reserve(dirtyList_.size());
  for (uint32_t index : dirtyList_) {
    Entry& e = entries_[index];
    if (!e.dirty) continue;
    e.dirty = false;
    out->push_back(e.snap);
  }
  dirtyList_.clear();
  groups->swap(newGroups_);
}

int64_t CollectiveRing::dropped() const {
  std::lock_guard lock(mutex_);
  return dropped_;
}

}  // namespace tpscope::probes::runtime_detail
