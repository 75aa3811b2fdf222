// Plain row types of the trace format (schema version 2, probes/tracedb/src/schema.sql; docs/schema.md).
// Times: ns since the file's epoch (meta 'epoch_unix_ns'); sizes: bytes. No SQLite types leak out of here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tpscope::tracedb {

inline constexpr int kFormatVersion = 3;  // PRAGMA user_version (2: + the summary tables; 3: + lane_summary)
inline constexpr std::string_view kFormatName = "tpscope-trace";  // meta 'format'

// Well-known meta keys.
namespace meta_keys {
inline constexpr std::string_view kFormat = "format";
inline constexpr std::string_view kRunId = "run_id";
inline constexpr std::string_view kEpochUnixNs = "epoch_unix_ns";   // wall-clock ns of time 0 in this file
inline constexpr std::string_view kClockAligned = "clock_aligned";  // "1": ranks' offsets already applied (merged)
inline constexpr std::string_view kConfig = "config";               // the training config, JSON
inline constexpr std::string_view kTool = "tool";                   // "tpscope <version>", "tpscope import kineto", ...
inline constexpr std::string_view kSource = "source";               // "capture", "merge", "kineto", ...
inline constexpr std::string_view kHostCpusPrefix = "host_cpus.";   // + host name: its logical CPUs (recorder)
inline constexpr std::string_view kCaptureExit = "capture_exit";    // a rank file: its exit as the launcher saw it
// Pipeline parallelism, JSON: {schedule, stages, microbatches, virtual_stages, stage_layers, stage_of_rank}
// (docs/schema.md); absent without PP.
inline constexpr std::string_view kPipeline = "pipeline";
// An imported Flight Recorder folder: the ranks below the highest one dumped or named in a pg_config that left no
// dump file, comma-separated ("2,3"); absent when every rank's dump is there (docs/formats.md "Flight Recorder dumps").
inline constexpr std::string_view kMissingRankDumps = "flight_recorder_missing_ranks";
// An imported trace whose records carry no sequence numbers: the process groups whose seq is each rank's order of
// enqueueing, comma-separated ("default_pg"); absent when every group's seq came from the trace (docs/formats.md).
inline constexpr std::string_view kSeqByOrder = "collective_seq_by_order";
// "device": an imported trace whose collectives were timed by their NCCL kernels (start_ns: the kernel's start on the
// GPU). A rank's kernel starts when its stream reaches it, so there is where a rank arrives: a rank whose GPU computes
// slower while its host keeps pace arrives late on the device only. Absent: host arrival (enqueue_ns).
inline constexpr std::string_view kCollectiveArrival = "collective_arrival";
// A rank file while its rank records: the spans open on its threads at the last flush (the recorder rewrites it at
// every flush), JSON [{"thread", "name", "kind", "layer", "begin_ns"}], outermost first per thread; "[]" when none.
// A live watcher reads it to tell a rank stuck inside an operation from one that never entered a collective.
inline constexpr std::string_view kOpenSpans = "open_spans";
// A Python program's DTensor parameters, JSON {name: placement per mesh dimension} ("dp:_S(0, 2) tp:S(0)"), written
// by tpscope's Python recorder (docs/capture.md). A parameter sharded over a mesh dimension (FSDP2's `fully_shard`)
// has its gradient rows taken from the reduce-scattered shard: the reduction over that dimension is in them.
inline constexpr std::string_view kParamPlacements = "param_placements";
}  // namespace meta_keys

// Well-known counter names (table counters).
namespace counter_names {
// The time a rank's threads have spent runnable but waiting for a CPU, ns (Linux's run_delay, each thread's growth
// summed: it never decreases), written at the end of every step by the recorder.
inline constexpr std::string_view kRunDelay = "sched.run_delay_ns";
}  // namespace counter_names

// Values of threads.kind: what a lane of the timeline is.
namespace thread_kinds {
inline constexpr std::string_view kCpu = "cpu";                // a host thread
inline constexpr std::string_view kCudaStream = "cuda-stream";  // a GPU stream: kernels, memcpy, memset
}  // namespace thread_kinds

// Span kinds and phases: same numbering as tpscope::probes::SpanKind / Phase and the span_kinds / phases tables.
enum class SpanKind : uint8_t {
  Compute = 0, Comm = 1, Data = 2, Optimizer = 3, Step = 4, Checkpoint = 5,
  Kernel = 6, Memcpy = 7, Memset = 8, NcclKernel = 9, Other = 10, Wait = 11,
};
inline constexpr int kSpanKindCount = 12;
std::string_view spanKindName(SpanKind kind);
enum class Phase : uint8_t { None = 0, Forward = 1, Backward = 2, Optimizer = 3, Data = 4, Checkpoint = 5, Other = 6 };
std::string_view phaseName(Phase phase);  // the probe API's names (probes::phaseName): "fwd", "bwd", ...

enum class CollectiveState : uint8_t { Scheduled = 0, Started = 1, Completed = 2, TimedOut = 3, Failed = 4 };
std::string_view collectiveStateName(CollectiveState state);  // "scheduled", "started", "completed", "timed_out", "failed"
std::optional<CollectiveState> parseCollectiveState(std::string_view name);

struct RankInfo {
  int rank = 0;
  std::string host;
  int64_t pid = 0;
  int worldSize = 1;
  int localRank = 0;
  int tpRank = 0, tpSize = 1;
  int dpRank = 0, dpSize = 1;
  std::string device = "cpu";
  int64_t clockOffsetNs = 0;       // rank 0's clock minus this rank's clock: t_rank0 = t_local + offset
  int64_t clockUncertaintyNs = 0;  // half the best round trip
  std::optional<int64_t> startNs, endNs;
  std::string exitReason;          // "", "ok", "signal SIGTERM", "timeout", "crash", ...
};

struct ThreadInfo {
  int rank = 0;
  int thread = 0;          // dense per rank; CUDA streams use their own ids with kind thread_kinds::kCudaStream
  std::string kind{thread_kinds::kCpu};
  std::string name;
};

// One span. `name` is an id in the strings table (Writer::intern / Reader::string).
struct SpanRow {
  int rank = 0;
  int thread = 0;
  SpanKind kind = SpanKind::Compute;
  uint32_t name = 0;
  int64_t beginNs = 0;
  int64_t durNs = 0;
  int step = -1;
  int layer = -1;
  Phase phase = Phase::None;
  std::optional<int64_t> correlation;  // CUPTI correlation / enclosing host span id
  int64_t endNs() const { return beginNs + durNs; }
};

struct GroupInfo {
  std::string name;        // "tp-0", "dp-1", "world"
  std::vector<int> ranks;  // global ranks in group-rank order
  std::string backend;     // "gloo", "nccl", ""
};

// A collective as one rank saw it (flight-recorder record). (rank, group, seq) is unique; (group, seq) joins ranks.
struct CollectiveRow {
  int rank = 0;
  std::string group;
  int64_t seq = 0;
  std::string op;     // "all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "all_to_all", ...
  std::string dtype;  // "float32", ...
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t bytes = 0;
  std::string callsite;
  int step = -1;
  int layer = -1;
  Phase phase = Phase::None;
  int thread = 0;
  int64_t enqueueNs = 0;
  std::optional<int64_t> startNs, endNs;
  CollectiveState state = CollectiveState::Scheduled;
};

struct GradStatRow {
  int rank = 0;
  int step = 0;
  std::string param;
  int layer = -1;
  double l2Norm = 0;
  double maxAbs = 0;
  int64_t nanCount = 0;
  int64_t infCount = 0;
  int64_t numel = 0;
};

struct StepStatRow {
  int rank = 0;
  int step = 0;
  std::optional<double> loss, lr, gradNorm, lossScale;
  std::optional<int64_t> tokens;
  std::optional<int64_t> beginNs, endNs;
  bool skipped = false;
};

struct AlertRow {
  int64_t id = 0;  // assigned on write
  int rank = 0;
  int step = -1;
  int64_t tsNs = 0;
  std::string severity = "warning";  // a name of the one scale, tpscope/vocabulary/severity.h: "critical" ... "info"
  std::string kind;
  int layer = -1;
  std::string param;
  std::string message;
  std::string evidence = "{}";  // JSON object
};

struct CounterRow {
  int rank = 0;
  std::string name;
  int64_t tsNs = 0;
  double value = 0;
};

struct RecorderStatsRow {
  int rank = 0;
  int64_t tsNs = 0;
  int64_t spansWritten = 0, spansDropped = 0;
  int64_t recordsWritten = 0, recordsDropped = 0;  // everything that is not a span
  int64_t flushes = 0, flushNsMax = 0, flushNsTotal = 0;
  int64_t probeOverheadNs = 0;  // estimated time spent in probes on the recorded threads
};

}  // namespace tpscope::tracedb
