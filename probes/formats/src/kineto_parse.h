// Parsing of one Kineto trace file (simdjson On-Demand) into flat raw records. Nothing is interpreted here beyond
// JSON types: names, categories and args are kept as views into the file's buffer, which must outlive the result.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gzip_file.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::formats::kineto {

enum class Cat : uint8_t {
  CpuOp, UserAnnotation, PythonFunction, CudaRuntime, CudaDriver, Kernel, GpuMemcpy, GpuMemset,
  GpuUserAnnotation, Trace, Other,
};
Cat categoryOf(std::string_view cat);
inline bool isGpuCategory(Cat c) {
  return c == Cat::Kernel || c == Cat::GpuMemcpy || c == Cat::GpuMemset || c == Cat::GpuUserAnnotation;
}

// pid/tid of an event; string pids/tids ("Spans", "PyTorch Profiler") get negative ids (see KinetoFile::laneStrings).
struct LaneKey {
  int64_t pid = 0;
  int64_t tid = 0;
  bool operator==(const LaneKey&) const = default;
};
struct LaneKeyHash {
  size_t operator()(const LaneKey& k) const noexcept {
    return std::hash<int64_t>()(k.pid * 1000003 ^ (k.tid + 0x9e3779b97f4a7c15LL));
  }
};

// The collective metadata PyTorch attaches to record_param_comms and NCCL kernels.
struct CollectiveMeta {
  std::string_view name;   // "Collective name"
  std::string_view dtype;  // "dtype" ("Float", ...)
  std::string_view pgName, pgDesc;
  std::string_view pgRanks;  // "[0, 1]" (string or raw JSON array)
  int64_t inNelems = -1, outNelems = -1, groupSize = -1, seq = -1;
};

// Args beyond Kineto's that name where in training an event happened: pipeline-parallel traces (Megatron-style
// "step", "mb_id", "model_chunk") and tpscope's own Chrome export ("step", "layer", "phase", and a collective
// record's "group", "op", "enqueue_ns", "callsite", ...). Only events that carry one of them get a record.
struct SpanArgs {
  int64_t step = -1, microbatch = -1, chunk = -1, layer = -1;
  int64_t bytes = -1;
  std::optional<int64_t> enqueueNs;  // ns, in the file's time (before its base is added)
  std::string_view phase, group, op, callsite, state, shape;  // shape: raw JSON array
  std::string_view cat;  // the event's "cat" as written ("compute", "collective", ...)
};

// Where a rank sits in the parallel layout, from distributedInfo or a process or thread name ("PP rank 2, TP rank
// 0", "pp_rank=2 tp_rank=0", tpscope's "rank 5 (host) tp 1/2 dp 0/1 pp 1/2"). Unset fields are unknown.
struct RankCoords {
  std::optional<int> rank, pp, tp, dp, ppSize, tpSize, dpSize;
  bool any() const { return rank || pp || tp || dp; }
  bool operator==(const RankCoords&) const = default;
};

struct RawSpan {  // one "X" event
  std::string_view name;
  Cat cat = Cat::Other;
  LaneKey lane;
  int64_t tsNs = 0;   // relative to the file's base (baseTimeNanoseconds)
  int64_t durNs = 0;
  int64_t externalId = -1, correlation = -1, device = -1, stream = -1;
  int32_t meta = -1;  // index into KinetoFile::metas
  int32_t args = -1;  // index into KinetoFile::spanArgs
  std::string_view inputDims, inputTypes;  // raw JSON arrays ("Input Dims", "Input type"), may be empty
};

struct RawFlow {  // one ac2g "s"/"f" event
  char ph = 's';
  int64_t id = 0;
  LaneKey lane;
  int64_t tsNs = 0;
};

struct RawCounter {
  std::string name;
  LaneKey lane;
  int64_t tsNs = 0;
  double value = 0;
};

struct PgConfig {
  std::string name, desc, backend;
  std::vector<int> ranks;
};

struct KinetoFile {
  std::filesystem::path path;
  JsonBuffer buffer;                     // owns the text raw JSON views point into
  std::shared_ptr<void> stringStorage;   // the parser whose string buffer holds the unescaped string views
  bool objectForm = false;
  std::optional<int> rank, worldSize;
  RankCoords coords;  // distributedInfo's pp_rank, tp_rank, dp_rank and sizes
  std::string backend;
  std::vector<PgConfig> pgConfig;
  std::optional<int64_t> baseTimeNs;
  std::string deviceProperties;  // raw JSON, "" if absent

  std::vector<RawSpan> spans;
  std::vector<CollectiveMeta> metas;
  std::vector<SpanArgs> spanArgs;
  std::vector<RawFlow> flows;
  std::vector<RawCounter> counters;
  std::unordered_map<LaneKey, std::string, LaneKeyHash> threadNames;  // "thread_name" metadata
  std::unordered_map<int64_t, std::string> processLabels;             // "process_labels" ("CPU", "GPU 0")
  std::unordered_map<int64_t, std::string> processNames;              // "process_name"
  std::vector<std::string> laneStrings;  // string pid/tid values: id -1 - i  <->  laneStrings[i]
  int64_t events = 0;
  std::map<std::string, int64_t> skipped;  // reason -> count (unknown or malformed events)
};

// Reads, decompresses and parses `path`. Errors name the file: unreadable, truncated gzip, not JSON, not a Kineto
// trace (neither an object with "traceEvents" nor an array), no events. Where `reuse` is given, the JSON parser is
// taken from it when no file parsed by it is still alive, and left in it: one thread parsing file after file then
// allocates and faults in the parser's buffers (sized for the largest file so far) once, not once per file, and its
// heap does not keep the pages of every size it was given (the load phase of a 64-file import, 64 × 300: ~100 MB
// at its peak instead of ~128 MB).
tracedb::Result<KinetoFile> parseKinetoFile(const std::filesystem::path& path, std::shared_ptr<void>* reuse = nullptr);

}  // namespace tpscope::formats::kineto
