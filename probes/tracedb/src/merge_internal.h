// Internal: what merge() (merge.cpp) takes of the copy of its inputs (merge_inputs.cpp).
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>

#include "tpscope/tracedb/merge.h"
#include "tpscope/tracedb/run_files.h"
#include "tpscope/tracedb/status.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::tracedb::detail {

// Every input's epoch, alignment and ranks (openRunFiles), read on `threads` threads, on the run's time base.
Result<RunFiles> openInputs(std::span<const std::filesystem::path> inputs, size_t threads);

// Every input's records into the writer's file, in input order, read on `threads` worker threads while the calling
// thread writes; `each` (merge.h) runs on the worker with each input open.
Status copyInputs(Writer& writer, const RunFiles& run, size_t threads, MergeSpans which, const EachInput& each,
                  const std::filesystem::path& output);

}  // namespace tpscope::tracedb::detail
