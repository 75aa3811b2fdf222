// Import of Nsight Systems SQLite exports (`nsys export --type sqlite`, export schema 2.x and 3.x) into a tpscope
// run file.
//
// Inputs: one file per rank, or one file holding several processes; every process with CUDA or NVTX activity is a
// rank. Tables are read by name, columns by name (PRAGMA table_info); optional tables may be missing. Strings come
// from StringIds (an integer column) or the column's own text, sanitised to UTF-8.
// Ranks: a process's NVTX mark or range "rank N" (also "rank=N", "global_rank N") gives its rank; else, for a file
// of one process, the file name ("rank-3.sqlite"); else the lowest ranks not taken, in input order and, within a
// file, by pid. Two processes with the same rank are refused with both files named.
// Mapping (docs/formats.md "Nsight Systems exports"): CUPTI_ACTIVITY_KIND_KERNEL/_MEMCPY/_MEMSET -> spans on device
//   lanes (kind cuda-stream, thread 10000 * (device + 1) + stream, as the Kineto import); kernels named
//   ncclDevKernel_* / ncclKernel_* -> nccl_kernel (communication), their op and dtype parsed from the name;
//   CUPTI_ACTIVITY_KIND_RUNTIME -> host spans (other; *Synchronize* -> wait) on the thread of its globalTid;
//   NVTX_EVENTS push/pop and start/end ranges -> host spans (ProfilerStep#N -> step, collective op names -> comm,
//   else compute), named "<domain>:<text>" in a named domain. spans.correlation = CUPTI's correlationId on both the
//   runtime call and the GPU work, as the Kineto import writes it.
// Collectives: the NCCL kernels launched (correlationId) inside one collective NVTX range — PyTorch's
//   nccl:all_reduce / c10d::allreduce_ ranges, NCCL's own ncclAllReduce ranges — are one collective of group
//   "default_pg", numbered by enqueue order per rank; NCCL kernels outside such a range are one collective each,
//   group "nccl-stream-K" (the K-th stream of the rank to carry NCCL kernels), numbered in order on that stream.
// Times: nsys's ns since the session start, made absolute with TARGET_INFO_SESSION_START_TIME.utcEpochNs when the
// file has it; the run's time 0 is the earliest record of all inputs (meta epoch_unix_ns).
// Errors: a file that is not SQLite, is truncated or damaged, or has none of the activity tables is an error naming
// the file; no output is left behind (a temporary file beside `output`, renamed on success). Rows that cannot be
// used are counted per reason in NsysImportStats::skipped and meta 'nsys_import_skipped'.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>

#include "tpscope/tracedb/status.h"

namespace tpscope::formats {

struct NsysImportStats {
  int files = 0;
  int ranks = 0;
  int64_t inputBytes = 0;
  int64_t spans = 0;
  int64_t kernels = 0;       // kernel rows (NCCL kernels included)
  int64_t ncclKernels = 0;
  int64_t pairedByRange = 0; // NCCL kernels joined to a collective through an enclosing NVTX range
  int64_t kernelTimed = 0;   // collectives timed by their NCCL kernels (meta collective_arrival = device: all of them)
  int64_t collectives = 0;
  int64_t threads = 0;       // host threads and GPU streams
  std::map<std::string, int64_t> skipped;  // reason -> rows not imported (not fatal)
  double seconds = 0;

  std::string summary() const;  // one or two lines for the CLI
};

// Imports `inputs` into the run file `output` (contract above). Meta 'tool' "tpscope import nsys", 'source' "nsys".
tpscope::tracedb::Result<NsysImportStats> importNsys(std::span<const std::filesystem::path> inputs,
                                                     const std::filesystem::path& output);

}  // namespace tpscope::formats
