// Collective statistics, straggler attribution and the TP communication model check.
//
// A collective is one (group, seq); each member rank has one record of it (collectives table). Per (group, op):
// counts, bytes, latency and nccl-tests' algorithm and bus bandwidth (CollectiveStats). Stragglers: at each
// collective with ≥ 2 arrivals the last arriver is its straggler and each other member waited for it; a rank is
// called late only when the waiting it caused exceeds what chance would give (RankStraggling's z test, weighted by
// what each collective cost, so that a rank late at a few costly collectives stands out against many cheap ones
// where order is chance). The TP check compares the TP collectives per step with what the engine's layer contracts
// issue (TpModelCheck). docs/diagnosis.md ("Collectives, bandwidth, stragglers") has the definitions in full.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tpscope/analysis/run_info.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis {

// The canonical name of a collective op as the analyses group by it: the catalogue's (vocabulary::canonicalOp,
// opName: "all_reduce", ..., every spelling of c10d, Gloo, NCCL and the profiler, coalesced and tensor variants
// included); an op the catalogue does not know comes back lower-cased, without prefix and surrounding '_'.
std::string canonicalOpName(std::string_view op);

// nccl-tests' bus-bandwidth factor for an op over n ranks (PERFORMANCE.md of nccl-tests): all_reduce 2(n−1)/n;
// all_gather, reduce_scatter, all_to_all, gather, scatter (n−1)/n; broadcast, reduce, send, recv, send_recv 1;
// barrier 0. Coalesced and tensor variants take their op's factor (canonicalOpName).
double busBandwidthFactor(std::string_view op, int n);

// Per record: arrival = enqueue_ns (when the rank called it); duration = end_ns − coalesce(start_ns, enqueue_ns)
// (records without end_ns have none). Per collective completed on at least one rank: n = the group's size
// (process_groups.size, else the distinct ranks seen in the group); S = the message size in bytes in nccl-tests'
// sense, max over records of `bytes` (the input tensor), times n for all_gather (the input is one shard of the
// output); latency = min duration across the members (the last arriver waited least: that is the transfer);
// time = mean duration across the members; skew = max arrival − min arrival.
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
  double busbwGbps = 0;     // algbwGbps · busBandwidthFactor(op, groupSize) — of emulatedBy when set
  std::string emulatedBy;   // the op that really ran (meta 'emulated_ops'), e.g. "all_reduce" for a reduce_scatter
  int64_t steps = 0;        // distinct steps the collectives belong to (−1 not counted)
};

// One rank's straggling within one process group (the same accounting as RankStraggling, restricted to the group's
// collectives): where its lateness lands, for the root-cause chain (chain.h).
struct GroupStraggling {
  std::string group;
  int64_t collectives = 0;     // decided collectives of the group it took part in
  int64_t lastCount = 0;       // where it arrived last
  int64_t causedWaitNs = 0;    // Σ over those of the others' waiting
  double expectedWaitNs = 0;   // μ restricted to the group
  std::vector<std::pair<int64_t, int64_t>> worst;  // (seq, others' waiting) where it was last, most first (≤ 4)
};

// Significance (is a rank last more than chance allows?): each decided collective c with n_c arrivals carries the
// weight w_c = Σ of the others' waiting at it. Under the null hypothesis that arrival order is exchangeable, the last
// arriver is uniform over the n_c arrivals, independently per collective, so for rank r the waiting it caused,
// S_r = Σ_c w_c · [r last at c], has
//   μ_r = Σ_c w_c / n_c,   σ²_r = Σ_c w_c² · (1/n_c)(1 − 1/n_c)      (sums over the decided collectives r joined)
// and z_r = (S_r − μ_r) / σ_r. A few heavy collectives cannot make z large on their own (k equally heavy collectives
// of n ranks, all lost by one rank by chance, give z = √(k(n−1))), so z needs evidence across many.
// The collectives of one step are not independent, though: one scheduling hiccup delays a rank at several in a row,
// and on a host whose every CPU runs a rank the OS favours one rank for a stretch of steps. With steps as the unit —
// d_s = Σ over the step's decided collectives of (r's caused waiting − w_c / n_c), mean 0 under the null hypothesis
// whatever the correlation inside a step — the step-clustered statistic z_step = Σ_s d_s / √(Σ_s d_s²) (a
// self-normalised sum: the variance is estimated from the steps themselves) asks whether r is late step after step.
// A rank slowed every step has every d_s > 0: z_step = √(steps) for equal excesses (4.4 at 19 steps). A healthy
// rank's bursts give a large z but a small z_step (a DP 2 run on 2 CPUs: z 4.2, z_step 3.0, late in 26 of 42 steps).
struct RankStraggling {
  int rank = 0;
  int64_t collectives = 0;  // decided collectives (≥ 2 arrivals, skew above clock uncertainty) it took part in
  int64_t lastCount = 0;    // collectives where it arrived last (decided ones)
  int64_t causedWaitNs = 0; // Σ over those of the others' waiting
  int64_t waitedNs = 0;     // Σ of its own waiting on later arrivers
  int64_t lagNs = 0;        // Σ over the collectives it arrived last at of the others' mean waiting (its lateness)
  std::map<int, int64_t> waitedOn;  // Σ of its own waiting at collectives where that rank arrived last, by rank
  double expectedWaitNs = 0;  // μ_r: the waiting it would cause by chance (see the significance test above)
  double z = 0;               // z_r; 0 when σ_r = 0
  double pValue = 1;          // one-sided, ½·erfc(z/√2)
  // The same question with steps as the unit (see below): steps whose collectives carry a step number, those in
  // which it caused more waiting than its chance share, and the step-clustered z and one-sided p.
  int64_t stepsCounted = 0, stepsLate = 0;
  double zStep = 0, pStep = 1;
  std::vector<GroupStraggling> groups;  // the same per process group it belongs to, by group name
  double lastPct() const { return collectives > 0 ? 100.0 * lastCount / collectives : 0.0; }
};

struct StragglerReport {
  std::vector<RankStraggling> ranks;  // ordered by causedWaitNs, most first (ties by rank)
  int64_t decided = 0;                // collectives attributed
  // skew within the members' clock uncertainty (ranks.clock_uncertainty_ns, summed over the first and last
  // arriver): the order is undecided, counted as such, not attributed
  int64_t undecided = 0;
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

// The TP communication model: what the engine (core/, Megatron's layer contracts) issues per TP group and step, for
// M = grad_accum micro-batches of b·s·h activations (b micro-batch size, s sequence length, h hidden).
// Per transformer layer and micro-batch, two column-parallel linears (QKV, fc1) and two row-parallel (attention
// output, fc2):
//   without sequence parallelism: row-parallel forward all-reduce ×2, column-parallel backward all-reduce ×2
//   with sequence parallelism:    column-parallel forward all-gather ×2 and backward reduce-scatter ×2, row-parallel
//                                 forward reduce-scatter ×2 and backward all-gather ×2
// Activation checkpointing recomputes each layer's forward in backward: its forward collectives run twice.
// With a vocab-parallel embedding and LM head (the config has vocab_size), per micro-batch: the embedding's forward
// all-reduce and the LM head input's backward all-reduce (with sequence parallelism: the embedding's forward
// reduce-scatter and backward all-gather, the head's forward all-gather and backward reduce-scatter). So per step,
// with L layers, c = 1 with activation checkpointing else 0, and v = 1 with a vocab-parallel embedding else 0:
//   all_reduce     = M · ((4 + 2c)·L + 2v)                     (0 with sequence parallelism)
//   all_gather     = M · ((4 + 2c)·L + 2v)                     (sequence parallelism only)
//   reduce_scatter = M · ((4 + 2c)·L + 2v)                     (sequence parallelism only)
// each moving b·s·h elements in nccl-tests' sense (an all-gather's input is one shard: numel · n = b·s·h). Smaller
// TP collectives (the vocab-parallel cross entropy's max and sums, the clip norm) are counted in measuredPerStep but
// are not part of the model.
struct TpModelCheck {
  bool haveModel = false;            // meta 'config' had layers, hidden, seq_len, micro_batch_size
  ModelConfig model;
  int64_t expectedPerStep = 0;       // model-sized all-reduces per TP group per step (formula above)
  int64_t expectedAllGatherPerStep = 0;
  int64_t expectedReduceScatterPerStep = 0;
  int64_t expectedElements = 0;      // b · s · h per collective
  int64_t expectedBytesPerStep = 0;  // Σ expected counts · b·s·h · element size of the measured dtype (4 if unknown)
  double measuredPerStep = 0;        // all-reduces per TP group ("tp-*") per step, all sizes
  double measuredModelSizedPerStep = 0;  // those of exactly b·s·h elements
  double measuredAllGatherPerStep = 0;   // model-sized all-gathers per TP group per step
  double measuredReduceScatterPerStep = 0;
  double measuredBytesPerStep = 0;   // Σ bytes of model-sized TP collectives per TP group per step
  int64_t measuredBytesEach = 0;     // the most common size in bytes of a TP all-reduce
  double busbwGbps = 0;              // of the TP all-reduces
  bool matches = false;              // every model-sized count per step == expected
};

struct CollectiveAnalysis {
  std::vector<CollectiveStats> stats;      // by group, op
  StragglerReport stragglers;
  std::vector<CollectiveArrival> worst;    // the collectives with the most total waiting, most first (≤ 20)
  TpModelCheck tp;
};

tracedb::Result<CollectiveAnalysis> analyzeCollectives(tracedb::Reader& reader, const RunInfo& info);

}  // namespace tpscope::analysis
