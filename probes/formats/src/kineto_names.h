// Names in Kineto traces and what they mean for tpscope: collective op names, dtypes, ranks in file names.
// Pure functions, no state; shared by the importer and its tests.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tpscope::formats::kineto {

// The profiler's host-side names of a collective call: record_param_comms, c10d::allreduce_, nccl:all_reduce,
// gloo:all_reduce, ... (never a kernel name: NCCL's kernel names are not an interface).
bool isCollectiveOpName(std::string_view name);
// A process-group backend's own op (gloo:all_reduce, nccl:all_reduce, ucc:, mpi:, xccl:), as opposed to the
// dispatcher's (c10d::allreduce_) and record_param_comms.
bool isBackendOpName(std::string_view name);

// The op a collective name stands for, normalised to tpscope's names ("all_reduce", "all_gather", "reduce_scatter",
// "all_to_all", "broadcast", "reduce", "gather", "scatter", "barrier", "send", "recv", ...). Accepts the
// "Collective name" metadata ("allreduce", "_allgather_base", "allgather_into_tensor_coalesced") and op names
// ("nccl:all_reduce", "c10d::_reduce_scatter_base_", "gloo:all_reduce"). "" for record_param_comms and unknown names.
std::string normalizeCollectiveOp(std::string_view name);

// True for the metadata "Collective name" values that are not collectives (Work::wait, ...).
bool isNonCollectiveCommName(std::string_view collectiveName);

// A dtype as Kineto writes it — metadata "Float", "BFloat16", "Long" or argument types "float", "c10::Half",
// "long int", "unsigned char" — normalised to "float32", "bfloat16", "int64", "uint8", ... ; "" if unknown.
std::string normalizeDtype(std::string_view dtype);
// Bytes per element of a normalised dtype; 0 if unknown.
int dtypeSize(std::string_view normalizedDtype);

// N of the profiler's step annotation "ProfilerStep#N" (Kineto's user annotation, the NVTX range nsys shows);
// nullopt for any other name.
std::optional<int> profilerStep(std::string_view name);

// The rank in a file name: "rank-3", "rank3", "rank_3" (case-insensitive, the last match wins); nullopt if none.
std::optional<int> rankFromFileName(std::string_view fileName);

// The backend in a pg_config "backend_config" ("cuda:nccl", "cpu:gloo,cuda:gloo") or a plain "nccl"; "" if none.
std::string backendFromConfig(std::string_view backendConfig);

}  // namespace tpscope::formats::kineto
