// The kernels of a run's device lanes (report --json "kernels"): how many GPU kernels ran on the ranks' GPU streams,
// their summed time, and the kernels that took the most of it. Kernels are spans of kind kernel and nccl_kernel on
// threads of kind thread_kinds::kCudaStream, grouped by name over all ranks; memcpy/memset are not kernels.
// Times are span durations summed (ns): kernels that overlap on two streams count twice, unlike the breakdown's
// interval unions. Cost: one grouped scan of the spans; buildReport runs it only for a run with device lanes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis {

inline constexpr int kTopKernels = 10;

struct KernelStat {
  std::string name;
  int64_t count = 0;
  int64_t totalNs = 0;
};

struct KernelSummary {
  bool present = false;   // the run has kernels on device lanes
  int64_t count = 0;      // kernel spans
  int64_t totalNs = 0;    // their summed duration
  std::vector<KernelStat> top;  // up to `limit` names by totalNs (desc), then name
};

tracedb::Result<KernelSummary> summarizeKernels(tracedb::Reader& reader, int limit = kTopKernels);

}  // namespace tpscope::analysis
