// Reading one Nsight Systems SQLite export (`nsys export --type sqlite`, export schema 2.x and 3.x) into plain rows.
// Tables and columns are found by name (PRAGMA table_info), never by position; optional tables and columns may be
// missing. Strings: columns that hold a StringIds id (integer) are resolved through StringIds, columns that hold
// text are taken as they are; both are sanitised to UTF-8 and interned into NsysFile::names. Times stay as nsys
// wrote them: ns since the session start (TARGET_INFO_SESSION_START_TIME.utcEpochNs, when present, is that instant).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tpscope/tracedb/status.h"

namespace tpscope::formats::nsys {

enum class GpuKind : uint8_t { Kernel, Memcpy, Memset };

// A row of CUPTI_ACTIVITY_KIND_KERNEL / _MEMCPY / _MEMSET.
struct GpuRow {
  GpuKind kind = GpuKind::Kernel;
  int64_t start = 0, end = 0;
  int64_t device = 0, stream = 0;
  int64_t correlation = -1;
  std::optional<int64_t> process;  // processKey of globalPid; nullopt when the column is missing
  uint32_t name = 0;               // kernels: demangledName, else shortName, else mangledName; memcpy/memset: a label
  uint32_t shortName = 0;          // kernels: shortName, else the name (what NCCL kernels are parsed from)
};

// A row of CUPTI_ACTIVITY_KIND_RUNTIME (a CUDA runtime call on a host thread).
struct RuntimeRow {
  int64_t start = 0, end = 0;
  int64_t globalTid = 0;
  int64_t correlation = -1;
  uint32_t name = 0;
};

// An NVTX range (eventType 59/70 push-pop, 60/71 start-end) or mark (34) of NVTX_EVENTS.
struct NvtxRow {
  int64_t start = 0, end = 0;  // end == start for marks
  int64_t globalTid = 0;
  uint32_t text = 0;           // the domain's name prefixed ("NCCL:ncclAllReduce") when the domain is named
  uint32_t bareText = 0;       // the text alone
  bool mark = false;
};

struct NsysFile {
  std::filesystem::path path;
  std::string schemaVersion;           // META_DATA_EXPORT EXPORT_SCHEMA_VERSION, "" when absent
  std::optional<int64_t> sessionUtcNs;  // TARGET_INFO_SESSION_START_TIME.utcEpochNs
  std::vector<std::string> names;       // interned, valid UTF-8; names[0] = ""
  std::vector<GpuRow> gpu;
  std::vector<RuntimeRow> runtime;
  std::vector<NvtxRow> nvtx;
  std::map<int64_t, std::string> threadNames;   // globalTid -> ThreadNames name
  std::map<int64_t, std::string> processNames;  // processKey -> PROCESSES name
  std::map<int64_t, int64_t> processPids;       // processKey -> PROCESSES pid
  std::map<int64_t, std::string> gpuNames;      // TARGET_INFO_GPU id -> name
  std::map<std::pair<int64_t, int64_t>, int64_t> cudaIds;  // (pid, gpuId) -> cudaId (TARGET_INFO_CUDA_DEVICE)
  std::map<std::string, int64_t> skipped;       // reason -> rows not imported
  int64_t bytes = 0;
};

// Reads `path`. Errors (naming the file): cannot be opened, is not SQLite, is damaged or truncated, has none of the
// activity tables (CUPTI_ACTIVITY_KIND_KERNEL, _MEMCPY, _MEMSET, _RUNTIME, NVTX_EVENTS), lacks a required column
// (start/end of an activity table), or refers to strings without a StringIds table.
tracedb::Result<NsysFile> readNsysFile(const std::filesystem::path& path);

}  // namespace tpscope::formats::nsys
