// Collective statistics, straggler attribution and the TP communication model check.
//
// A collective is one (group, seq); each member rank has one record of it (collectives table). Per record:
//   arrival   = enqueue_ns (when the rank called the collective)
//   duration  = end_ns − coalesce(start_ns, enqueue_ns)          (records without end_ns have no duration)
// Per collective (only those completed on at least one rank):
//   n         = the group's size (process_groups.size, else the number of distinct ranks seen in the group)
//   size S    = the message size in bytes in nccl-tests' sense: max over records of `bytes` (the input tensor),
//               times n for all_gather (the input is one shard of the output)
//   latency   = min duration across the members (the member that arrived last waited least: that is the transfer)
//   time      = mean duration across the members (what an average member spent in it)
//   skew      = max arrival − min arrival
// Per (group, op): count, bytes = Σ S, total_ns = Σ time, latency_ns = Σ latency,
//   algbw_gbps = Σ S / Σ latency, in GB/s with GB = 1e9 bytes (nccl-tests' convention)
//   busbw_gbps = algbw_gbps · factor(op, n): all_reduce 2(n−1)/n; all_gather, reduce_scatter, all_to_all (n−1)/n;
//                broadcast, reduce, send/recv 1; barrier 0 (no payload)
//
// Stragglers: for each collective with ≥ 2 arrivals the last arriver is the straggler of that collective and
// each other member waited (last arrival − its arrival). When the skew is within the clock uncertainty of the
// members (ranks.clock_uncertainty_ns, summed over the first and last arriver) the order is undecided and the
// collective is counted as such, not attributed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tpscope/analysis/run_info.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis {

// nccl-tests bus-bandwidth factor for an op over n ranks (0 for barrier and unknown ops with n < 2).
double busBandwidthFactor(const std::string& op, int n);

struct CollectiveStats {
  std::string group;
  std::string op;
  int groupSize = 0;
  int64_t count = 0;        // completed collectives (distinct seq)
  int64_t incomplete = 0;   // seqs that no member completed
  int64_t bytes = 0;        // Σ S
  int64_t totalNs = 0;      // Σ mean member duration
  int64_t latencyNs = 0;    // Σ min member duration
  int64_t minLatencyNs = 0, maxLatencyNs = 0;  // over the collectives
  int64_t meanSkewNs = 0, maxSkewNs = 0;       // arrival skew over the collectives
  double algbwGbps = 0;     // Σ S / Σ latency, GB/s (1e9 bytes/s)
  double busbwGbps = 0;     // algbwGbps · busBandwidthFactor(op, groupSize)
  int64_t steps = 0;        // distinct steps the collectives belong to (−1 not counted)
};

struct RankStraggling {
  int rank = 0;
  int64_t collectives = 0;  // decided collectives (≥ 2 arrivals, skew above clock uncertainty) it took part in
  int64_t lastCount = 0;    // collectives where it arrived last (decided ones)
  int64_t causedWaitNs = 0; // Σ over those of the others' waiting
  int64_t waitedNs = 0;     // Σ of its own waiting on later arrivers
  double lastPct() const { return collectives > 0 ? 100.0 * lastCount / collectives : 0.0; }
};

struct StragglerReport {
  std::vector<RankStraggling> ranks;  // ordered by causedWaitNs, most first (ties by rank)
  int64_t decided = 0;                // collectives attributed
  int64_t undecided = 0;              // skew within clock uncertainty
  int64_t steps = 0;                  // distinct steps over the collectives (for "per step" figures)
};

// Per-collective detail, for the worst stragglers and the GUI's flow view.
struct CollectiveArrival {
  std::string group;
  int64_t seq = 0;
  std::string op;
  int step = -1;
  int lastRank = -1;        // -1: undecided
  int64_t skewNs = 0;
  int64_t totalWaitNs = 0;  // Σ of the others' waiting
  int64_t latencyNs = 0;    // min member duration (0 when none completed)
};

// The TP communication model (Megatron, no sequence parallelism): per layer and micro-batch, 4 all-reduces of
// b·s·h elements (2 forward: attention output and MLP output row-parallel; 2 backward: the copy-to-TP inputs of
// QKV and fc1). With sequence parallelism the same volume moves as 4 all-gathers + 4 reduce-scatters.
struct TpModelCheck {
  bool haveModel = false;            // meta 'config' had layers, hidden, seq_len, micro_batch_size
  ModelConfig model;
  int64_t expectedPerStep = 0;       // 4 · layers · grad_accum_steps all-reduces per TP group per step
  int64_t expectedElements = 0;      // b · s · h per all-reduce
  int64_t expectedBytesPerStep = 0;  // expectedPerStep · b·s·h · element size of the measured dtype (4 if unknown)
  double measuredPerStep = 0;        // all-reduces per TP group ("tp-*") per step, all sizes
  double measuredModelSizedPerStep = 0;  // those of exactly b·s·h elements
  double measuredBytesPerStep = 0;   // Σ bytes of TP all-reduces per TP group per step
  int64_t measuredBytesEach = 0;     // the most common size in bytes of a TP all-reduce
  double busbwGbps = 0;              // of the TP all-reduces
  bool matches = false;              // model-sized count per step == expected
};

struct CollectiveAnalysis {
  std::vector<CollectiveStats> stats;      // by group, op
  StragglerReport stragglers;
  std::vector<CollectiveArrival> worst;    // the collectives with the most total waiting, most first (≤ 20)
  TpModelCheck tp;
};

tracedb::Result<CollectiveAnalysis> analyzeCollectives(tracedb::Reader& reader, const RunInfo& info);

}  // namespace tpscope::analysis
