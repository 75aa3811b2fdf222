// Internal: what merge() (merge.cpp) and mergeInParallel() (merge_parallel.cpp) share.
#pragma once

#include <filesystem>
#include <span>
#include <string>

#include "tpscope/tracedb/merge.h"
#include "tpscope/tracedb/run_files.h"
#include "tpscope/tracedb/status.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::tracedb::detail {

// An error when there is nothing to merge or the output is also an input.
Status checkOutput(std::span<const std::filesystem::path> inputs, const std::filesystem::path& output);
// The inputs' run id; an error if two inputs hold the same rank or belong to different runs.
Result<std::string> checkInputs(const RunFiles& run);
// Where a merge writes before the rename: "<output>.tmp-<pid>" (the diagnose command's signal handler knows it).
std::filesystem::path mergeTemporary(const std::filesystem::path& output);
// Removes a temporary output with its -wal and -shm files.
void removeMergeOutput(const std::filesystem::path& tmp);
// A written merge made a run file: the rollback journal set back, its span and collective counts read, the writer
// closed and the temporary file renamed to the output. On an error the caller removes the temporary file.
Result<MergeStats> finishMerge(Writer& writer, const std::filesystem::path& tmp, const std::filesystem::path& output);

}  // namespace tpscope::tracedb::detail
