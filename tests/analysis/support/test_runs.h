// Tiny deterministic runs for the analysis and CLI tests (and, scaled up, the analysis benchmark).
//
// A small simulator of a Megatron-style TP×DP job writes one run file (or, for the scale benchmark, a capture folder
// of rank files) through tracedb::Writer: ranks are laid out TP-inner (rank = dp·tp + tp_rank), groups "tp-<dp>" and
// "dp-<tp_rank>". Each step of each rank records:
//   data loading span → per layer forward: attention compute, TP all-reduce, MLP compute, TP all-reduce →
//   per layer (last first) backward: MLP compute, TP all-reduce, attention compute, TP all-reduce →
//   DP gradient all-reduce → optimizer; a Step span around it, grad_stats per (layer, param), step_stats.
// A collective completes when its last member arrives plus a fixed transfer time, so waiting is real.
// Faults (each off by default) reproduce what the analyses look for. Times are fixed integers: outputs are stable.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tpscope/tracedb/status.h"

namespace tpscope::testing {

struct RunSpec {
  int tp = 2;
  int dp = 2;
  int layers = 2;
  int steps = 8;
  bool indexed = true;      // create the query indexes (a merged file) or not (a raw recorder file)
  bool commSpans = true;    // also record a comm span for each collective (as the communicator does)
  int64_t elements = 256;   // b·s·h of each TP all-reduce (config: micro_batch_size 2, seq_len 8, hidden 16)
  // > 0: every other compute span of each rank takes this much longer, the ranks taking turns, so that each TP
  // collective has a last arriver by chance (a real run's small skews), not a tie
  int64_t computeJitterNs = 0;

  // Faults.
  int stragglerRank = -1;          // this rank's data loading takes `stragglerDelayNs` longer every step
  int64_t stragglerDelayNs = 2'000'000;
  int nanRank = -1, nanStep = -1, nanLayer = -1;  // first NaN in this rank's gradients of `nanLayer` at `nanStep`
  bool nanIsInf = false;                          // the same, with ±Inf instead of NaN
  int activationRank = -1, activationStep = -1;   // a non-finite activation in this rank's forward of layer 0
                                                  // (alert "nonfinite_activation" with its time): the forward
                                                  // all-reduce spreads it to the TP peers' gradients at every layer
  int spikeRank = -1, spikeStep = -1;             // this rank's layer-`layers-1` MLP grad norm ×50 at that step
  double spikeFactor = 0;                         // > 0: instead, every gradient of the rank × this factor at that
                                                  // step (what capture's --inject spike does)
  int lossSpikeStep = -1;                         // the loss is 4× at that step
  int divergeStep = -1;                           // rank 1's post-reduction grad_norm differs at that step
  // The replica check's silent_corruption alerts (docs/diagnosis.md, "Silent data corruption"), as the engine writes
  // them: state of `sdcTensor` (replicated on every rank: dated exactly) first disagrees at `sdcStep`; each of
  // `sdcSuspects` raises one at the check (the next multiple of 10, or the last step). `sdcMajority`: the other
  // copies agreed (else no majority: every suspect is one).
  int sdcStep = -1;
  std::vector<int> sdcSuspects;
  bool sdcMajority = false;
  std::string sdcTensor = "position";
  int sdcLayer = -1;
  std::string hangGroup;                          // `hangRank` never enters (hangGroup, hangSeq): it stalls in
  int hangRank = -1;                              // data loading, and the job is stopped (SIGTERM to every rank)
  int64_t hangSeq = -1;
  std::string mismatchGroup;                      // at (mismatchGroup, mismatchSeq) `mismatchRank` sends a
  int64_t mismatchSeq = -1;                       // tensor twice as large (size mismatch), the others complete
  int mismatchRank = -1;
  std::string seqByOrder;                         // meta collective_seq_by_order (an import without seq); "" = none
  std::string pipelineMeta;                       // meta 'pipeline' as written (JSON); "" = none
  int crashRank = -1, crashStep = -1;             // this rank dies (SIGSEGV) after finishing `crashStep`
  std::string crashReason = "crash (SIGSEGV)";    // ranks.exit_reason of the crashed rank
  std::string stopReason = "signal SIGTERM";      // ... and of the others when there is a crash or a hang

  // Bench scale: extra compute spans nested in each compute span (more spans per step, same times).
  int extraSpansPerCompute = 0;

  // Hosts: ranks fill hosts "node-<k>" in rank order, ranksPerHost each. hostCpus > 0: each host's logical CPUs, in
  // meta host_cpus.<host> as the recorder writes it (writeRun: unknown when 0).
  int ranksPerHost = 4;
  int hostCpus = 0;
};

// Writes the run to `path` (replacing it). Errors name the file.
tracedb::Status writeRun(const std::filesystem::path& path, const RunSpec& spec);

// Writes the run as a capture folder instead: DIR/rank-<K>.db, one per rank, as the recorder and the capture
// launcher leave them (meta source "capture", tool, config, host_cpus; a ranks row with start/end and exit_reason,
// meta capture_exit for a stopped rank; the rank's own process groups; no indexes; one recorder_stats row). Each
// file is on its rank's own clock (its own epoch, a clock offset of a few µs) so that `tpscope merge` has to align
// them. The whole run is simulated in memory first (the simulation needs every rank at once): memory grows with the
// run's records. Errors name the file.
tracedb::Status writeRankFiles(const std::filesystem::path& dir, const RunSpec& spec);

// Spans the run will hold per rank and step (for sizing a benchmark).
int64_t spansPerRankStep(const RunSpec& spec);

}  // namespace tpscope::testing
