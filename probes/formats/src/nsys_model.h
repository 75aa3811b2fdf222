// Interpretation of one read Nsight Systems export (nsys_read.h) as tpscope ranks: one rank per process with
// activity, host lanes per thread, device lanes per (device, stream), spans, NCCL kernels as communication and
// the collectives they belong to. Times stay nsys's (ns since the file's session start); the importer shifts them.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nsys_read.h"
#include "tpscope/tracedb/records.h"

namespace tpscope::formats::nsys {

// One process of a file, as a rank. Span names are ids into NsysFile::names until the importer interns them.
struct ProcessModel {
  int64_t key = 0;                 // processKey
  int64_t pid = 0;
  std::optional<int> rankHint;     // from an NVTX mark or range "rank N"
  std::string rankSource;          // filled by the importer: "NVTX 'rank N'", "file name", "pid order", ...
  tracedb::RankInfo info;          // rank, pid, device; startNs/endNs in file time
  std::vector<tracedb::ThreadInfo> threads;
  std::vector<tracedb::SpanRow> spans;              // beginNs in file time, name = NsysFile::names index
  std::vector<tracedb::CollectiveRow> collectives;  // times in file time; rank set by the importer
  int64_t minNs = 0, maxNs = 0;
  int64_t ncclKernels = 0;         // NCCL kernels seen
  int64_t pairedByRange = 0;       // of them, joined to a collective through an enclosing NVTX range
  int64_t kernelTimed = 0;         // collectives whose times are their NCCL kernels' (meta collective_arrival)
};

struct FileModel {
  std::vector<ProcessModel> processes;  // ordered by pid
  std::map<std::string, int64_t> skipped;
};

// Thread ids of device lanes, as the Kineto import makes them: 10000 * (device + 1) + stream while both are small.
inline constexpr int kGpuLaneBase = 10000;
inline constexpr int kGpuLaneOverflow = 900000;

FileModel buildFileModel(const NsysFile& file);

}  // namespace tpscope::formats::nsys
