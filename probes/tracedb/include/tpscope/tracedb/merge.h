// Merge of per-rank files into one run file.
//
// Times in the output are ns since the earliest input epoch, on rank 0's clock: for each input rank,
// t_out = t_in + (epoch_in - epoch_out) + clock_offset_ns (unless the input is already aligned, meta clock_aligned=1).
// The output is written to a temporary file beside it and renamed on success: it is either complete or absent.
// Refuses: inputs of different runs (meta run_id), two inputs holding the same rank, unreadable inputs.
// Spans are stored in (rank, thread, begin_ns) order. Idempotent: merging the same inputs again yields the same content.
#pragma once

#include <filesystem>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/run_files.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::tracedb {

struct MergeStats {
  int ranks = 0;
  int64_t spans = 0;
  int64_t collectives = 0;
};

// What a merge copies of the spans.
enum class MergeSpans {
  All,   // every span: a run file
  Ends,  // each rank's first span and its last kEndSpans spans by begin time, and every span of an input with a
         // pipeline layout (meta 'pipeline'): what `diagnose` reads of the spans beside the summaries, which stand
         // for the rest (a diagnosis file: analysis/diagnose.h, writeDiagnosisFile)
};
inline constexpr int kEndSpans = 256;

struct MergeOptions {
  MergeSpans spans = MergeSpans::All;
  bool indexes = true;  // false: without the query indexes (a part of a larger merge that creates them)
  int readers = 0;      // threads reading the inputs while the calling thread writes; 0: one per core, at most
                        // kMaxMergeReaders. Each holds at most 4 inputs in memory ahead of the writer, and the
                        // inputs held come from at most 1 GiB of files (past that, only the next input is read).
};
inline constexpr int kMaxMergeReaders = 16;

// `each`, when given, runs on a reader thread with each input open and its clock on the run's time base, before its
// records are read (the diagnosis file's summaries: analysis/diagnose.h); an error it returns fails the merge.
using EachInput = std::function<Status(size_t index, Reader& reader, const FileClock& clock)>;

// The one merge: each input opened and read by a reader thread, the records written in input order by the calling
// thread through statements prepared once (merge_inputs.cpp). The output does not depend on `readers`.
Result<MergeStats> merge(std::span<const std::filesystem::path> inputs, const std::filesystem::path& output,
                         const MergeOptions& options = {}, const EachInput& each = {});

// The query indexes a merged file gets (indexes.sql), by name.
namespace query_indexes {
inline constexpr std::string_view kSpansRankBegin = "spans_rank_begin";
inline constexpr std::string_view kSpansStep = "spans_step";
inline constexpr std::string_view kCollectivesGroupSeq = "collectives_group_seq";
inline constexpr std::string_view kGradStatsStep = "grad_stats_step";
inline constexpr std::string_view kCountersName = "counters_name";
inline constexpr std::string_view kAlertsTs = "alerts_ts";
}  // namespace query_indexes

// Creates those of the query indexes named in `names` in a file written without them (MergeOptions::indexes false),
// letting SQLite's sorter use `sortThreads` helper threads.
Status createQueryIndexes(const std::filesystem::path& file, std::span<const std::string_view> names,
                          int sortThreads = 0);

// The rank files of a capture folder: DIR/rank-*.db in rank order.
std::vector<std::filesystem::path> rankFiles(const std::filesystem::path& dir);

}  // namespace tpscope::tracedb
