// Internal: what merge() (merge.cpp) and mergeInParallel() (merge_parallel.cpp) share.
#pragma once

#include <filesystem>
#include <memory>
#include <span>
#include <string>

#include "tpscope/tracedb/merge.h"
#include "tpscope/tracedb/run_files.h"
#include "tpscope/tracedb/status.h"
#include "tpscope/tracedb/writer.h"

struct sqlite3;

namespace tpscope::tracedb::detail {

// An error when there is nothing to merge or the output is also an input.
Status checkOutput(std::span<const std::filesystem::path> inputs, const std::filesystem::path& output);
// The inputs' run id; an error if two inputs hold the same rank or belong to different runs.
Result<std::string> checkInputs(const RunFiles& run);
// Where a merge writes before the rename: "<output>.tmp-<pid>" (the diagnose command's signal handler knows it).
std::filesystem::path mergeTemporary(const std::filesystem::path& output);
// Removes a temporary output with its -wal and -shm files.
void removeMergeOutput(const std::filesystem::path& tmp);
// The temporary output of a merge of `run` (its run id and epoch), written once and renamed when complete: without a
// journal or syncs while it is written (finishMerge sets the journal back). Nothing is left on failure.
Result<std::unique_ptr<Writer>> createMergeOutput(const RunFiles& run, const std::string& runId,
                                                  const std::filesystem::path& tmp);
// Lets SQLite's sorter use `threads` helper threads in the CREATE INDEX statements that follow on `db`.
Status allowSortThreads(sqlite3* db, const std::filesystem::path& path, int threads);
// A written merge of `run` made a run file: the rollback journal set back, its rank, span and collective counts
// taken, the writer closed and the temporary file renamed to the output. On an error the caller removes the
// temporary file.
Result<MergeStats> finishMerge(Writer& writer, const RunFiles& run, const std::filesystem::path& tmp,
                               const std::filesystem::path& output);

}  // namespace tpscope::tracedb::detail
