// What every analysis needs to know about a run before it looks at records: its ranks and their TP/DP coordinates,
// its process groups, whether the query indexes exist, the time extent, and the model dimensions from meta 'config'.
//
// Works on any run file (merged, a single rank's file, imported): missing information is empty, never an error.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/records.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis {

// Model dimensions read from meta 'config' (JSON keys layers, hidden, seq_len, micro_batch_size; optional
// grad_accum_steps / gradient_accumulation_steps, sequence_parallel, tp). Absent keys stay 0 / false.
struct ModelConfig {
  int layers = 0;
  int64_t hidden = 0;
  int64_t seqLen = 0;
  int64_t microBatchSize = 0;
  int gradAccumSteps = 1;
  bool sequenceParallel = false;
  bool activationCheckpointing = false;  // per-layer recompute: the forward's collectives run again in backward
  bool vocabParallel = false;            // the config has a vocab_size: a vocab-parallel embedding and LM head
  bool complete() const { return layers > 0 && hidden > 0 && seqLen > 0 && microBatchSize > 0; }
};

// The extent of one rank's spans. With the query indexes `lastNs`/`lastStep` come from its 256 last-begun spans
// (an outer span that begins earlier and ends later is bounded by its step's records anyway); without, exact.
struct RankExtent {
  int rank = 0;
  int64_t firstNs = 0, lastNs = 0;
  int lastStep = -1;
};

struct RunInfo {
  std::vector<tracedb::RankInfo> ranks;    // by rank; ranks seen only in records get a default RankInfo
  std::vector<tracedb::GroupInfo> groups;  // process_groups; groups seen only in collectives are added (ranks from
                                           // the collectives' rank column, sorted)
  bool indexed = false;                    // the query indexes of indexes.sql exist (merged or imported files)
  // meta 'emulated_ops' ("reduce_scatter=all_reduce,..."): logical op → the op that really ran underneath
  std::map<std::string, std::string> emulatedOps;
  // meta 'host_cpus.<host>' (the recorder): logical CPUs per host. A host running more ranks than that is
  // oversubscribed: ranks take turns on the cores and one lags by the luck of scheduling.
  std::map<std::string, int> hostCpus;
  bool oversubscribed(const std::string& host) const;  // more ranks on `host` than its CPUs (false when unknown)
  // Every CPU of `host` runs a rank (ranks ≥ CPUs; false when unknown): the launcher, the recorders' threads and the
  // OS take a core from some rank a timeslice (a few ms) at a time.
  bool cpusFull(const std::string& host) const;
  // meta 'flight_recorder_missing_ranks' (an imported Flight Recorder folder): ranks its process groups name that
  // left no dump. They have no records; the desync analysis says what cannot be decided without them.
  std::vector<int> missingRankDumps;
  // meta 'collective_seq_by_order' (an imported trace without sequence numbers): groups whose seq is each rank's
  // order of enqueueing. Two threads' collectives may interleave differently on two ranks there, so a mismatch at a
  // seq is no evidence of a desync (desync.h).
  std::vector<std::string> seqByOrder;
  // meta 'collective_arrival' = "device" (an import whose collectives were timed by their NCCL kernels): a rank's
  // arrival at a collective is its start_ns (the kernel's start on its GPU), not its host enqueue.
  bool deviceArrival = false;
  // meta 'param_placements' (a Python program's DTensor parameters): the mesh dimensions some parameter is sharded
  // over ("dp" for `dp:S(0)` or FSDP2's strided `dp:_S(0, 2)`). A group whose class is one of them reduce-scatters
  // gradients into the shards the rank's gradient rows are taken from: its backward collectives show in those rows.
  std::set<std::string> gradShardDims;
  int64_t beginNs = 0, endNs = 0;          // extent of spans, collectives and step_stats (0, 0 when empty)
  std::vector<RankExtent> spanExtents;     // by rank, ranks with spans only
  std::optional<ModelConfig> model;        // when meta 'config' is JSON with at least one of the model keys
  std::vector<int> stageOfRank;            // meta 'pipeline' stage_of_rank (empty without PP)

  const tracedb::RankInfo* rank(int rank) const;
  const tracedb::GroupInfo* group(const std::string& name) const;
  // Whether `group`'s members hold two or more pipeline stages (the stages' loss and norm all-reduce, the tied
  // embedding's): who arrives last there is the schedule's order and the stages' balance (pipeline.h).
  bool spansStages(const std::string& group) const;
  // "tp 5, dp 1, host node-3" (parts that are unknown are left out).
  std::string describeRank(int rank) const;
};

tracedb::Result<RunInfo> loadRunInfo(tracedb::Reader& reader);

// Renders a rank list compactly: "8–15", "1, 3, 5–7", "none".
std::string formatRanks(std::vector<int> ranks);
// The same with the noun: "rank 3", "ranks 8–15".
std::string rankList(const std::vector<int>& ranks);
// A process group's class: the name up to the last '-' followed by digits ("tp-1" → "tp", "world" → "world").
std::string groupClass(const std::string& group);

// A pipeline message's pseudo-group "p2p-<src>-<dst>" (docs/schema.md), not a process group.
inline bool isPointToPointGroup(std::string_view group) { return group.starts_with("p2p-"); }

}  // namespace tpscope::analysis
