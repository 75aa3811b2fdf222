#include "whatif_graph.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "intervals.h"
#include "tpscope/analysis/collectives.h"
#include "tpscope/vocabulary/collective_ops.h"
#include "tpscope/vocabulary/spike_baseline.h"
#include "tpscope/tracedb/query.h"

namespace tpscope::analysis::detail {

namespace {

using LaneKey = std::pair<int, int>;  // (rank, thread)

struct Record {
  int rank = 0, thread = 0;
  std::string group, op;
  int64_t seq = 0, bytes = 0, enqueueNs = 0, startNs = 0, endNs = 0;
  int block = -1;  // index into its lane's blocks; -1: unbound
  int blockLane = -1;
};

struct Block {
  Interval span;
  std::vector<int> records;  // indexes into the records bound to it
};

struct Builder {
  WhatIfGraph g;
  std::vector<bool> deviceRank;                  // by rank
  std::set<LaneKey> streams;                     // (rank, thread) of GPU streams
  std::map<LaneKey, std::vector<Block>> blocks;  // leaves, by begin
  std::vector<Record> records;
  std::map<LaneKey, int> laneOf;

  bool isDevice(int rank) const { return rank >= 0 && rank < static_cast<int>(deviceRank.size()) && deviceRank[rank]; }
  int lane(int rank, int thread) {
    auto [it, fresh] = laneOf.insert({{rank, thread}, static_cast<int>(g.lanes.size())});
    if (fresh) g.lanes.push_back(WhatIfLane{rank, thread, {}, {}, 0});
    return it->second;
  }
};

// Blocking spans that contain no other blocking span (an outer "dp gradient reduction" around its waits is work
// between them). Sorted by begin.
std::vector<Block> leavesOf(std::vector<Interval> spans) {
  std::sort(spans.begin(), spans.end(), [](const Interval& a, const Interval& b) {
    return a.first != b.first ? a.first < b.first : a.second > b.second;
  });
  std::vector<bool> leaf(spans.size(), true);
  std::vector<size_t> open;  // enclosing spans, innermost last
  for (size_t i = 0; i < spans.size(); ++i) {
    while (!open.empty() && spans[open.back()].second <= spans[i].first) open.pop_back();
    if (!open.empty()) leaf[open.back()] = false;
    open.push_back(i);
  }
  std::vector<Block> out;
  for (size_t i = 0; i < spans.size(); ++i)
    if (leaf[i]) out.push_back(Block{spans[i], {}});
  return out;
}

// Host lanes: comm and wait spans on host threads; device lanes: nccl_kernel spans on the rank's streams.
tracedb::Status readBlocks(tracedb::Reader& reader, Builder& b) {
  std::map<LaneKey, std::vector<Interval>> spans;
  tracedb::Query q(reader, "SELECT rank, thread, kind, begin_ns, begin_ns + dur_ns FROM spans WHERE kind IN (1, 9, 11)",
                   "blocking spans");
  auto st = q.each([&](tracedb::Query& r) {
    const LaneKey key{r.i32(0), r.i32(1)};
    const bool nccl = r.i32(2) == static_cast<int>(tracedb::SpanKind::NcclKernel);
    const bool onStream = b.streams.count(key) > 0;
    if (b.isDevice(key.first) ? (nccl && onStream) : (!nccl && !onStream)) spans[key].push_back({r.i64(3), r.i64(4)});
  });
  if (!st) return st;
  for (auto& [key, list] : spans) b.blocks[key] = leavesOf(std::move(list));
  return {};
}

tracedb::Status readRecords(tracedb::Reader& reader, Builder& b) {
  tracedb::Query q(
      reader,
      "SELECT rank, thread, group_name, seq, op, bytes, enqueue_ns, coalesce(start_ns, enqueue_ns), end_ns "
      "FROM collectives WHERE end_ns IS NOT NULL AND state NOT IN ('timed_out', 'failed')",
      "collective records");
  return q.each([&](tracedb::Query& r) {
    Record rec;
    rec.rank = r.i32(0);
    rec.thread = r.i32(1);
    rec.group = r.text(2);
    rec.seq = r.i64(3);
    rec.op = canonicalOpName(r.view(4));
    rec.bytes = r.i64(5);
    rec.enqueueNs = r.i64(6);
    rec.startNs = r.i64(7);
    rec.endNs = r.i64(8);
    b.records.push_back(std::move(rec));
  });
}

// The leaf of `list` that a record ending at `end` is bound to (begin ≤ end ≤ its end + kBindNs), or -1.
int blockAt(const std::vector<Block>& list, int64_t end) {
  auto it = std::upper_bound(list.begin(), list.end(), end, [](int64_t t, const Block& x) { return t < x.span.first; });
  if (it == list.begin()) return -1;
  --it;
  return end <= it->span.second + kBindNs ? static_cast<int>(it - list.begin()) : -1;
}

// Binds each record to the blocking span it ends in: on its own thread (host), on any of the rank's streams (device).
void bindRecords(Builder& b) {
  for (size_t i = 0; i < b.records.size(); ++i) {
    Record& rec = b.records[i];
    for (auto it = b.blocks.lower_bound({rec.rank, INT_MIN}); it != b.blocks.end() && it->first.first == rec.rank;
         ++it) {
      auto& [key, list] = *it;
      if (!b.isDevice(rec.rank) && key.second != rec.thread) continue;
      const int at = blockAt(list, rec.endNs);
      if (at < 0) continue;
      list[static_cast<size_t>(at)].records.push_back(static_cast<int>(i));
      rec.block = at;
      rec.blockLane = b.lane(key.first, key.second);
      break;
    }
    if (rec.block < 0) ++b.g.unboundRecords;
  }
}

// The arrival of a record: its enqueue on its thread (host; inside its own Block, that Block's begin, so that the rank
// enters before it waits), the begin of its NCCL kernel (device); unbound on a device rank: not in the replay.
void addArrival(Builder& b, const Record& rec, WhatIfArrival& a) {
  a.rank = rec.rank;
  a.endNs = rec.endNs;
  a.recv = rec.op == "recv";
  if (b.isDevice(rec.rank)) {
    if (rec.block < 0) {
      a.measuredNs = rec.startNs;
      return;
    }
    const Block& blk = b.blocks.at({b.g.lanes[rec.blockLane].rank, b.g.lanes[rec.blockLane].thread})[rec.block];
    a.measuredNs = blk.span.first;
    a.lane = rec.blockLane;
  } else {
    a.measuredNs = rec.enqueueNs;
    a.lane = b.lane(rec.rank, rec.thread);
    if (rec.block >= 0 && rec.blockLane == a.lane) {
      const Block& blk = b.blocks.at({rec.rank, rec.thread})[rec.block];
      if (a.measuredNs >= blk.span.first && a.measuredNs <= blk.span.second) a.measuredNs = blk.span.first;
    }
  }
}

// The measured last arriver and transfer of a collective (see the header). The last arriver is the member that
// waited least (its own end − arrival, on its own clock: collectives.h's latency), so that an error in the clock
// alignment of the ranks (Kineto records none) cannot put a member's waiting into the transfer. A message's transfer
// is measured on its receiver, from the later of the send posted and the receive begun.
void measureTransfer(WhatIfCollective& c, const std::vector<WhatIfArrival>& arrivals) {
  int64_t last = INT64_MIN, least = INT64_MAX;
  for (int m : c.members) {
    last = std::max(last, arrivals[m].measuredNs);
    const int64_t d = arrivals[m].endNs - arrivals[m].measuredNs;
    if (d < least) {
      least = d;
      c.lastMember = m;
    }
  }
  int64_t transfer = least;
  if (c.p2p) {
    for (int m : c.members)
      if (arrivals[m].recv) transfer = arrivals[m].endNs - last;
  }
  c.transferNs = std::max<int64_t>(0, transfer);
}

// One WhatIfCollective per (group, seq); one arrival per record; Issue events for the arrivals in the replay.
void addCollectives(Builder& b, const RunInfo& info) {
  std::map<std::pair<std::string, int64_t>, std::vector<int>> byKey;
  for (size_t i = 0; i < b.records.size(); ++i)
    byKey[{b.records[i].group, b.records[i].seq}].push_back(static_cast<int>(i));
  std::vector<int> collOfRecord(b.records.size(), -1);
  for (const auto& [key, recs] : byKey) {
    WhatIfCollective c;
    c.group = key.first;
    c.op = b.records[recs.front()].op;
    auto em = info.emulatedOps.find(c.op);
    c.busOp = em == info.emulatedOps.end() ? c.op : em->second;
    c.p2p = isPointToPointGroup(c.group);
    const tracedb::GroupInfo* gi = info.group(c.group);
    c.groupSize =
        gi != nullptr && !gi->ranks.empty() ? static_cast<int>(gi->ranks.size()) : static_cast<int>(recs.size());
    for (int r : recs) {
      c.bytes = std::max(c.bytes, b.records[r].bytes);
      WhatIfArrival a;
      addArrival(b, b.records[r], a);
      if (a.lane >= 0) {
        a.event = static_cast<int>(b.g.lanes[a.lane].events.size());
        b.g.lanes[a.lane].events.push_back(
            {a.measuredNs, a.measuredNs, WhatIfEventType::Issue, static_cast<int>(b.g.arrivals.size()), 0});
      }
      c.members.push_back(static_cast<int>(b.g.arrivals.size()));
      b.g.arrivals.push_back(a);
      collOfRecord[r] = static_cast<int>(b.g.colls.size());
    }
    if (c.op == vocabulary::opName(vocabulary::CollectiveOp::AllGather)) c.bytes *= c.groupSize;
    measureTransfer(c, b.g.arrivals);
    b.g.colls.push_back(std::move(c));
  }
  // Blocks with their collectives; blocking spans without a record stay work.
  for (auto& [key, list] : b.blocks) {
    for (const Block& blk : list) {
      if (blk.records.empty()) {
        ++b.g.unboundBlocks;
        continue;
      }
      ++b.g.boundBlocks;
      WhatIfLane& l = b.g.lanes[b.lane(key.first, key.second)];
      WhatIfEvent e{blk.span.first, blk.span.second, WhatIfEventType::Block, static_cast<int>(l.deps.size()),
                    static_cast<int>(blk.records.size())};
      for (int r : blk.records) l.deps.push_back(collOfRecord[r]);
      l.events.push_back(e);
      ++l.blocks;
    }
  }
}

// Device lanes: a collective's NCCL kernels end together on every member (to µs), so each rank's clock offset from
// the lowest rank is the median over their shared collectives of the difference of their ends; the rank's times are
// moved by it. Kineto records no clock alignment (docs/formats.md); a few µs of it are enough for a replay whose
// collectives wait for the latest arrival.
void alignOnKernelEnds(WhatIfGraph& g) {
  std::map<int, std::vector<double>> diffs;  // rank -> end − the lowest member's end
  for (const auto& c : g.colls) {
    if (c.p2p || c.members.size() < 2) continue;
    const WhatIfArrival* ref = nullptr;
    for (int m : c.members)
      if (g.arrivals[m].lane >= 0 && (ref == nullptr || g.arrivals[m].rank < ref->rank)) ref = &g.arrivals[m];
    if (ref == nullptr) continue;
    for (int m : c.members)
      if (g.arrivals[m].lane >= 0 && g.arrivals[m].rank != ref->rank)
        diffs[g.arrivals[m].rank].push_back(static_cast<double>(g.arrivals[m].endNs - ref->endNs));
  }
  std::map<int, int64_t> shift;
  for (auto& [rank, d] : diffs) shift[rank] = -static_cast<int64_t>(std::llround(vocabulary::medianOf(std::move(d))));
  for (auto& l : g.lanes) {
    auto it = shift.find(l.rank);
    if (it == shift.end()) continue;
    for (auto& e : l.events) {
      e.t += it->second;
      e.tEnd += it->second;
    }
  }
  for (auto& a : g.arrivals) {
    auto it = shift.find(a.rank);
    if (it == shift.end()) continue;
    a.measuredNs += it->second;
    a.endNs += it->second;
  }
  for (auto& [rank, ns] : shift) g.clockShiftNs[rank] = ns;
}

// Step window marks on each rank's primary lane (its lane with the most blocks; its thread 0 when it has none).
void addMarks(Builder& b, const Breakdown& breakdown) {
  std::map<int, int> primary;
  for (size_t i = 0; i < b.g.lanes.size(); ++i) {
    const WhatIfLane& l = b.g.lanes[i];
    auto it = primary.find(l.rank);
    if (it == primary.end() || l.blocks > b.g.lanes[it->second].blocks) primary[l.rank] = static_cast<int>(i);
  }
  for (const StepBreakdown& s : breakdown.steps) {
    auto it = primary.find(s.rank);
    const int lane = it != primary.end() ? it->second : b.lane(s.rank, 0);
    primary[s.rank] = lane;
    for (bool end : {false, true}) {
      const int64_t t = end ? s.endNs : s.beginNs;
      b.g.lanes[lane].events.push_back({t, t, WhatIfEventType::Mark, static_cast<int>(b.g.marks.size()), 0});
      b.g.marks.push_back(WhatIfMark{s.rank, s.step, end, lane, -1});
    }
  }
  for (const auto& [rank, lane] : primary) {
    if (rank >= static_cast<int>(b.g.primaryLane.size())) b.g.primaryLane.resize(rank + 1, -1);
    b.g.primaryLane[rank] = lane;
  }
}

// Sorts each lane's events and points arrivals and marks at their new places.
void sortLanes(WhatIfGraph& g) {
  for (size_t li = 0; li < g.lanes.size(); ++li) {
    auto& ev = g.lanes[li].events;
    std::stable_sort(ev.begin(), ev.end(), [](const WhatIfEvent& a, const WhatIfEvent& b) {
      return a.t != b.t ? a.t < b.t : a.type < b.type;
    });
    for (size_t i = 0; i < ev.size(); ++i) {
      if (ev[i].type == WhatIfEventType::Issue) g.arrivals[ev[i].ref].event = static_cast<int>(i);
      if (ev[i].type == WhatIfEventType::Mark) g.marks[ev[i].ref].event = static_cast<int>(i);
    }
  }
}

}  // namespace

int64_t WhatIfGraph::workNs(int lane, int event) const {
  if (event <= 0) return 0;
  const auto& ev = lanes[lane].events;
  const int64_t prevEnd = std::max(ev[event - 1].t, ev[event - 1].tEnd);
  return std::max<int64_t>(0, ev[event].t - prevEnd);
}

tracedb::Result<WhatIfGraph> buildWhatIfGraph(tracedb::Reader& reader, const Breakdown& breakdown,
                                              const RunInfo& info) {
  Builder b;
  for (const RankBreakdown& r : breakdown.ranks) {
    if (r.rank >= static_cast<int>(b.deviceRank.size())) b.deviceRank.resize(r.rank + 1, false);
    b.deviceRank[r.rank] = r.lanes == Lanes::Device;
    b.g.device = b.g.device || r.lanes == Lanes::Device;
  }
  auto threads = reader.threads();
  if (!threads) return threads.status();
  for (const auto& t : *threads)
    if (t.kind == tracedb::thread_kinds::kCudaStream) b.streams.insert({t.rank, t.thread});
  if (auto st = readBlocks(reader, b); !st) return st;
  if (auto st = readRecords(reader, b); !st) return st;
  bindRecords(b);
  addCollectives(b, info);
  addMarks(b, breakdown);
  if (b.g.device) alignOnKernelEnds(b.g);
  sortLanes(b.g);
  return std::move(b.g);
}

namespace {

// The discrete-event walk of replay(): lanes advance until a Block whose collectives are not ready.
class Replayer {
 public:
  Replayer(const WhatIfGraph& g, const WhatIfEdit& edit) : g_(g), edit_(edit) {
    r_.time.resize(g.lanes.size());
    r_.via.resize(g.lanes.size());
    for (size_t i = 0; i < g.lanes.size(); ++i) {
      r_.time[i].assign(g.lanes[i].events.size(), 0);
      r_.via[i].assign(g.lanes[i].events.size(), -1);
    }
    r_.markNs.assign(g.marks.size(), 0);
    r_.lastMember.assign(g.colls.size(), -1);
    r_.transferNs.resize(g.colls.size());
    for (size_t c = 0; c < g.colls.size(); ++c)
      r_.transferNs[c] =
          edit.transfer ? edit.transfer(static_cast<int>(c), g.colls[c].transferNs) : g.colls[c].transferNs;
    arrival_.assign(g.arrivals.size(), 0);
    for (size_t a = 0; a < g.arrivals.size(); ++a) arrival_[a] = g.arrivals[a].measuredNs;
    missing_.assign(g.colls.size(), 0);
    for (size_t c = 0; c < g.colls.size(); ++c)
      for (int m : g.colls[c].members) missing_[c] += g.arrivals[m].lane >= 0 ? 1 : 0;
    ready_.assign(g.colls.size(), INT64_MIN);
    for (size_t c = 0; c < g.colls.size(); ++c)
      if (missing_[c] == 0) release(static_cast<int>(c));
    lanes_.resize(g.lanes.size());
    waiters_.resize(g.colls.size());
  }

  WhatIfReplay run() {
    for (size_t l = 0; l < g_.lanes.size(); ++l) {
      const auto& ev = g_.lanes[l].events;
      lanes_[l].cursor = ev.empty() ? 0 : ev.front().t;
      work_.push_back(static_cast<int>(l));
    }
    for (;;) {
      while (!work_.empty()) {
        const int l = work_.back();
        work_.pop_back();
        advance(l);
      }
      if (!forceOne()) break;
    }
    return std::move(r_);
  }

 private:
  struct LaneState {
    size_t next = 0;
    int64_t cursor = 0;  // replayed
    bool atBlock = false;
  };

  void release(int c) {
    const WhatIfCollective& coll = g_.colls[c];
    int64_t last = INT64_MIN;
    for (int m : coll.members)
      if (arrival_[m] > last) {
        last = arrival_[m];
        r_.lastMember[c] = m;
      }
    ready_[c] = last + r_.transferNs[c];
  }

  int64_t work(int l, size_t i) const {
    const int64_t measured = g_.workNs(l, static_cast<int>(i));
    return edit_.work ? edit_.work(l, static_cast<int>(i), measured) : measured;
  }

  // Runs lane l until it ends or blocks on a collective that is not ready.
  void advance(int l) {
    LaneState& s = lanes_[l];
    const WhatIfLane& lane = g_.lanes[l];
    while (s.next < lane.events.size()) {
      const WhatIfEvent& e = lane.events[s.next];
      if (!s.atBlock) s.cursor += work(l, s.next);
      s.atBlock = false;
      if (e.type == WhatIfEventType::Block && !finishBlock(l, e)) return;
      r_.time[l][s.next] = s.cursor;
      if (e.type == WhatIfEventType::Issue) arrive(e.ref, s.cursor);
      if (e.type == WhatIfEventType::Mark) r_.markNs[e.ref] = s.cursor;
      ++s.next;
    }
  }

  // A Block: false (lane parked) when a collective it waits for is not ready, else the lane moves to its end.
  bool finishBlock(int l, const WhatIfEvent& e) {
    LaneState& s = lanes_[l];
    const WhatIfLane& lane = g_.lanes[l];
    int64_t ready = INT64_MIN;
    int via = -1;
    for (int k = 0; k < e.count; ++k) {
      const int c = lane.deps[e.ref + k];
      if (ready_[c] == INT64_MIN) {
        s.atBlock = true;
        waiters_[c].push_back(l);
        return false;
      }
      if (ready_[c] > ready) {
        ready = ready_[c];
        via = c;
      }
    }
    if (ready > s.cursor) {
      s.cursor = ready;
      r_.via[l][s.next] = via;
    }
    return true;
  }

  void arrive(int a, int64_t t) {
    arrival_[a] = t;
    const int c = collOf(a);
    if (--missing_[c] == 0) wake(c);
  }

  void wake(int c) {
    release(c);
    for (int l : waiters_[c]) work_.push_back(l);
    waiters_[c].clear();
  }

  int collOf(int a) {
    if (collOfArrival_.empty()) {
      collOfArrival_.assign(g_.arrivals.size(), -1);
      for (size_t c = 0; c < g_.colls.size(); ++c)
        for (int m : g_.colls[c].members) collOfArrival_[m] = static_cast<int>(c);
    }
    return collOfArrival_[a];
  }

  // Every lane is parked or done: releases the waited-for collective that would be ready first as measured, from the
  // arrivals it has (the others at their measured time). False when nothing waits.
  bool forceOne() {
    int best = -1;
    int64_t bestNs = INT64_MAX;
    for (size_t c = 0; c < g_.colls.size(); ++c) {
      if (waiters_[c].empty() || ready_[c] != INT64_MIN) continue;
      const int64_t measured = g_.arrivals[g_.colls[c].lastMember].measuredNs + g_.colls[c].transferNs;
      if (measured < bestNs) {
        bestNs = measured;
        best = static_cast<int>(c);
      }
    }
    if (best < 0) return false;
    ++r_.forced;
    wake(best);
    return true;
  }

  const WhatIfGraph& g_;
  const WhatIfEdit& edit_;
  WhatIfReplay r_;
  std::vector<int64_t> arrival_, ready_;
  std::vector<int> missing_, collOfArrival_;
  std::vector<LaneState> lanes_;
  std::vector<std::vector<int>> waiters_;
  std::vector<int> work_;
};

}  // namespace

WhatIfReplay replay(const WhatIfGraph& graph, const WhatIfEdit& edit) {
  return Replayer(graph, edit).run();
}

std::vector<WhatIfPathSegment> criticalPath(const WhatIfGraph& g, const WhatIfReplay& r, int lane, int event,
                                            int64_t stopNs) {
  std::vector<WhatIfPathSegment> out;
  while (lane >= 0 && event > 0 && r.time[lane][event] > stopNs) {
    const int c = r.via[lane][event];
    if (c >= 0) {
      const int m = r.lastMember[c];
      const WhatIfArrival& a = g.arrivals[m];
      out.push_back({lane, event, c, a.rank, r.transferNs[c]});
      lane = a.lane;
      event = a.event;
      continue;
    }
    // The lane's own work before this event (for a Block that did not wait: up to its begin; the Block adds nothing).
    const int64_t dur = r.time[lane][event] - r.time[lane][event - 1];
    if (dur > 0) out.push_back({lane, event, -1, g.lanes[lane].rank, dur});
    --event;
  }
  return out;
}

}  // namespace tpscope::analysis::detail
