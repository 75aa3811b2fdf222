// Internal: the dependency graph of a run's steps across ranks, and its replay (whatif.h says what it is for).
//
// A lane is one thread of a rank (host lanes) or one GPU stream (device lanes, breakdown.h's choice per rank). Its
// events, in time order, are:
//   Issue  the rank enters a collective or point-to-point message (its arrival): a collective record's enqueue_ns on
//          the record's thread (host); the start of the NCCL kernel the record is bound to (device)
//   Block  the lane is blocked until its collectives complete: a leaf comm/wait span (host) or an nccl_kernel span
//          (device) to which a record of the rank is bound (the record ends inside it: begin ≤ end_ns ≤ end + kBindNs)
//   Mark   a step window's begin or end (breakdown.h's windows), on the rank's primary lane (the one with the most
//          blocks): a measured time the replay maps
// Everything between two events of a lane is work (spans or not: uninstrumented host time is time too): it keeps its
// measured duration unless an edit changes it. Blocking spans with no record are work.
// A collective's ready time = its last member's arrival + its transfer; the transfer is measured on the last arriver
// (end_ns − arrival; the last arriver is the member that waited least, which needs no cross-rank clock), for a
// point-to-point message on the receiver (recv end − the later of send posted and receive begun). A Block ends at
// max(its begin, the ready time of its collectives).
// The replay evaluates this max-plus system in dependency order (a discrete-event walk over the lanes). Where the
// records are inconsistent (a lane blocks on a collective whose member arrives only later on a blocked lane), the
// waiting collective is released from the arrivals it has and the member's measured arrival; the count is kept.
// Times are ns on the run file's one clock (merged and imported files are aligned); on device lanes each rank's clock
// is moved so that its NCCL kernels end with the lowest rank's (alignOnKernelEnds), as they do on the GPUs.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tpscope/analysis/breakdown.h"
#include "tpscope/analysis/run_info.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis::detail {

// How far a record's end may lie after the end of the blocking span it is bound to (the span closes after the
// record's completion is stamped; a few µs on the recorder, 0 in an import).
inline constexpr int64_t kBindNs = 50'000;

struct WhatIfArrival {
  int rank = -1;
  int64_t measuredNs = 0;     // arrival
  int64_t endNs = 0;          // the record's end_ns
  bool recv = false;          // the receiving side of a point-to-point message
  int lane = -1, event = -1;  // its Issue event; -1: not in the replay (arrives at measuredNs)
};

struct WhatIfCollective {
  std::string group, op;  // op canonical (analysis::canonicalOpName)
  std::string busOp;      // the op that moved the bytes (meta 'emulated_ops'), for the bus-bandwidth factor
  int groupSize = 0;
  int64_t bytes = 0;  // nccl-tests' size S (collectives.h)
  bool p2p = false;
  std::vector<int> members;  // indexes into WhatIfGraph::arrivals
  int lastMember = -1;       // measured last arriver: the member that waited least (an index into arrivals)
  int64_t transferNs = 0;
};

enum class WhatIfEventType : uint8_t { Issue = 0, Mark = 1, Block = 2 };

struct WhatIfEvent {
  int64_t t = 0, tEnd = 0;  // measured; tEnd > t only for a Block
  WhatIfEventType type = WhatIfEventType::Issue;
  int ref = -1;   // Issue: arrival; Mark: mark; Block: first dependency in WhatIfLane::deps
  int count = 0;  // Block: dependencies
};

struct WhatIfLane {
  int rank = 0, thread = 0;
  std::vector<WhatIfEvent> events;  // sorted by (t, type)
  std::vector<int> deps;            // collectives the Blocks wait for
  int blocks = 0;
};

struct WhatIfMark {
  int rank = 0, step = -1;
  bool end = false;
  int lane = -1, event = -1;
};

struct WhatIfGraph {
  std::vector<WhatIfLane> lanes;
  std::vector<WhatIfCollective> colls;
  std::vector<WhatIfArrival> arrivals;
  std::vector<WhatIfMark> marks;
  std::vector<int> primaryLane;         // by rank (-1: a rank with no window)
  int64_t boundBlocks = 0;              // blocking spans bound to a record
  int64_t unboundBlocks = 0;            // blocking spans left as work (no record ends in them)
  int64_t unboundRecords = 0;           // completed records bound to no blocking span
  bool device = false;                  // some rank is read on its device lanes
  std::map<int, int64_t> clockShiftNs;  // device lanes: each rank's times moved by this (aligned on kernel ends)

  // Work segment `event` of `lane`: from the end of the event before (its tEnd) to the event; 0 for the first.
  int64_t workNs(int lane, int event) const;
};

// Builds the graph from the records and the breakdown's windows and lanes. Errors name the file.
tracedb::Result<WhatIfGraph> buildWhatIfGraph(tracedb::Reader& reader, const Breakdown& breakdown, const RunInfo& info);

// One change to replay: a work segment's new duration and a collective's new transfer (null: as measured).
struct WhatIfEdit {
  std::function<int64_t(int lane, int event, int64_t measuredNs)> work;
  std::function<int64_t(int coll, int64_t measuredNs)> transfer;
};

struct WhatIfReplay {
  std::vector<std::vector<int64_t>> time;  // [lane][event]: replayed time (a Block: its end)
  std::vector<std::vector<int32_t>> via;   // [lane][event]: the collective that released a Block, else -1
  std::vector<int64_t> markNs;             // by mark
  std::vector<int> lastMember;             // by collective: the replayed last arriver (arrival index)
  std::vector<int64_t> transferNs;         // by collective, as replayed
  int forced = 0;                          // collectives released without all their arrivals (see above)
};

WhatIfReplay replay(const WhatIfGraph& graph, const WhatIfEdit& edit);

// One stretch of a critical path, latest first as walked: a lane's work or a collective's transfer.
struct WhatIfPathSegment {
  int lane = -1, event = -1;  // work: the segment before this event; transfer: the release Block
  int coll = -1;              // >= 0: a transfer of this collective, measured on `rank`
  int rank = -1;
  int64_t durNs = 0;
};

// The chain that sets `lane`'s event `event` in `r`, walked back until a time <= stopNs (replayed).
std::vector<WhatIfPathSegment> criticalPath(const WhatIfGraph& g, const WhatIfReplay& r, int lane, int event,
                                            int64_t stopNs);

}  // namespace tpscope::analysis::detail
