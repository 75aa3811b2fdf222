// Names in Nsight Systems exports and what they mean for tpscope: NCCL kernel names, NCCL's and PyTorch's NVTX
// range names, rank hints, the globalTid/globalPid encoding. Pure functions, no state; shared with the tests.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tpscope::formats::nsys {

// nsys serialises a thread as globalTid = (hardware/VM id << 48) | (pid << 24) | tid, a process as globalPid, the
// same with tid 0 (docs: "Serialized process and thread identifiers").
inline int64_t pidOf(int64_t globalId) { return (globalId >> 24) & 0xFFFFFF; }
inline int64_t tidOf(int64_t globalId) { return globalId & 0xFFFFFF; }
// The process a globalTid or globalPid belongs to: the id with its tid bits cleared (keeps the VM id).
inline int64_t processKey(int64_t globalId) { return globalId & ~int64_t{0xFFFFFF}; }

// What an NCCL kernel's name says: "ncclDevKernel_AllReduce_Sum_f32_RING_LL" (NCCL >= 2.19),
// "ncclKernel_AllReduce_RING_LL_Sum_float" (older), with or without "void " and a parameter list.
struct NcclKernelName {
  std::string op;     // tpscope's op ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
                      // "send_recv", ...); "" when the name does not say (ncclDevKernel_Generic)
  std::string dtype;  // normalised ("float32", "bfloat16", ...); "" when the name does not say
};
// nullopt when `name` is not an NCCL kernel (does not start with ncclDevKernel_ / ncclKernel_ after "void ").
std::optional<NcclKernelName> parseNcclKernel(std::string_view name);

// The collective op of an NVTX range: PyTorch's record_function names as emit_nvtx writes them
// ("nccl:all_reduce", "c10d::allreduce_", "record_param_comms", with ", seq = N, sizes = ..." after the name) and
// NCCL's own NVTX ranges ("ncclAllReduce", "ncclGroupStart" is not one). "" when the range is not a collective;
// "unknown" for record_param_comms, which names none.
std::string collectiveOfRange(std::string_view text);

// The rank a process announces in an NVTX mark or range: "rank 3", "rank=3", "RANK:3", "global_rank 3" (the whole
// text; case-insensitive). nullopt otherwise.
std::optional<int> rankHint(std::string_view text);

// `text` with invalid UTF-8 sequences replaced by U+FFFD (nsys's StringIds may hold raw bytes of a process's names).
std::string sanitizeUtf8(std::string_view text);

}  // namespace tpscope::formats::nsys
