// merge (merge.h): the checks, the temporary output and its rename around the copy of the inputs (merge_inputs.cpp:
// worker threads read the inputs, the calling thread writes them).
#include "tpscope/tracedb/merge.h"

#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "merge_internal.h"
#include "schema.h"
#include "sqlite_util.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/run_files.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::tracedb {

std::vector<std::filesystem::path> rankFiles(const std::filesystem::path& dir) {
  std::vector<std::pair<int, std::filesystem::path>> found;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() < 9 || name.rfind("rank-", 0) != 0 || name.substr(name.size() - 3) != ".db") continue;
    int rank = 0;
    const char* b = name.data() + 5;
    const char* end = name.data() + name.size() - 3;
    auto [p, err] = std::from_chars(b, end, rank);
    if (err == std::errc() && p == end) found.emplace_back(rank, e.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::filesystem::path> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

namespace {

// An error when there is nothing to merge or the output is also an input.
Status checkOutput(std::span<const std::filesystem::path> inputs, const std::filesystem::path& output) {
  if (inputs.empty()) return Status::error(output.string() + ": nothing to merge (no input files)");
  std::error_code ec;
  for (const auto& path : inputs)
    if (std::filesystem::exists(output, ec) && std::filesystem::equivalent(path, output, ec))
      return Status::error(output.string() + ": the output is also an input");
  return Status::ok();
}

// The inputs' run id; an error if two inputs hold the same rank or belong to different runs.
Result<std::string> checkInputs(const RunFiles& run) {
  std::set<int> seenRanks;
  const RunFile* first = nullptr;
  for (const RunFile& in : run.files) {
    for (const RankInfo& r : in.ranks)
      if (!seenRanks.insert(r.rank).second)
        return Status::error(in.path.string() + ": rank " + std::to_string(r.rank) +
                             " is also in another input (merge each rank once)");
    if (first != nullptr && !in.runId.empty() && !first->runId.empty() && in.runId != first->runId)
      return Status::error(in.path.string() + ": belongs to run '" + in.runId + "' but " + first->path.string() +
                           " belongs to run '" + first->runId + "' (refusing to merge files of different runs)");
    if (first == nullptr) first = &in;
  }
  std::string runId;
  for (const RunFile& in : run.files)
    if (runId.empty()) runId = in.runId;
  return runId;
}

// Where a merge writes before the rename: "<output>.tmp-<pid>" (the diagnose command's signal handler knows it).
std::filesystem::path mergeTemporary(const std::filesystem::path& output) {
  return output.string() + ".tmp-" + std::to_string(::getpid());
}

// Removes a temporary output with its -wal and -shm files.
void removeMergeOutput(const std::filesystem::path& tmp) {
  std::error_code ec;
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(tmp.string() + suffix, ec);
}

// The temporary output of a merge of `run` (its run id and epoch), written once and renamed when complete: without a
// journal or syncs while it is written (finishMerge sets the journal back). Nothing is left on failure.
Result<std::unique_ptr<Writer>> createMergeOutput(const RunFiles& run, const std::string& runId,
                                                  const std::filesystem::path& tmp) {
  auto writer = Writer::create(tmp, CreateOptions{true, runId, run.epochUnixNs, "merge"});
  if (!writer) return writer.status();
  constexpr const char* kUnjournaled = "PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF";
  if (Status s = detail::exec(detail::Access::db(**writer), tmp, kUnjournaled); !s) {
    (void)(*writer)->close();
    removeMergeOutput(tmp);
    return s;
  }
  return writer;
}

// Lets SQLite's sorter use `threads` helper threads in the CREATE INDEX statements that follow on `db`.
Status allowSortThreads(sqlite3* db, const std::filesystem::path& path, int threads) {
  return detail::exec(db, path, ("PRAGMA threads = " + std::to_string(std::max(0, threads))).c_str());
}

// A written merge of `run` made a run file: the rollback journal set back, its rank, span and collective counts
// taken, the writer closed and the temporary file renamed to the output. On an error the caller removes the
// temporary file.
Result<MergeStats> finishMerge(Writer& writer, const RunFiles& run, const std::filesystem::path& tmp,
                               const std::filesystem::path& output) {
  sqlite3* db = detail::Access::db(writer);
  // A run file is written once: a rollback journal lets read-only readers open it without leaving -wal/-shm behind.
  if (Status s = detail::exec(db, output, "PRAGMA journal_mode = DELETE"); !s) return s;
  MergeStats stats;
  for (const RunFile& in : run.files) stats.ranks += static_cast<int>(in.ranks.size());
  {
    detail::Stmt count(db, "SELECT (SELECT count(*) FROM spans), (SELECT count(*) FROM collectives)");
    if (count.valid() && count.step() == SQLITE_ROW) {
      stats.spans = count.i64(0);
      stats.collectives = count.i64(1);
    }
  }
  if (Status s = writer.close(); !s) return s;
  std::error_code ec;
  std::filesystem::rename(tmp, output, ec);
  if (ec) return Status::error(output.string() + ": cannot write the merged file: " + ec.message());
  return stats;
}

}  // namespace

Status createQueryIndexes(const std::filesystem::path& file, std::span<const std::string_view> names,
                          int sortThreads) {
  return detail::writeInTransaction(file, "query indexes", [&](sqlite3* db) {
    if (Status s = allowSortThreads(db, file, sortThreads); !s) return s;
    return detail::createIndexes(db, file, names);
  });
}

Result<MergeStats> merge(std::span<const std::filesystem::path> inputs, const std::filesystem::path& output,
                         const MergeOptions& options, const EachInput& each) {
  if (Status s = checkOutput(inputs, output); !s) return s;
  const size_t threads = static_cast<size_t>(
      options.readers > 0 ? options.readers
                          : std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, kMaxMergeReaders));
  auto run = detail::openInputs(inputs, threads + 1);
  if (!run) return run.status();
  auto runId = checkInputs(*run);
  if (!runId) return runId.status();

  const std::filesystem::path tmp = mergeTemporary(output);
  auto writer = createMergeOutput(*run, *runId, tmp);
  if (!writer) return writer.status();
  auto fail = [&](Status s) -> Result<MergeStats> {
    (void)(*writer)->close();
    removeMergeOutput(tmp);
    return s;
  };
  if (Status s = detail::copyInputs(**writer, *run, threads, options.spans, each, output); !s) return fail(s);
  if (Status s = (*writer)->setMeta(meta_keys::kClockAligned, "1"); !s) return fail(s);
  if (options.indexes) {
    // CREATE INDEX sorts: SQLite's sorter may use a helper thread per reader (idle now).
    if (Status s = (*writer)->commit(); !s) return fail(s);
    if (Status s = allowSortThreads(detail::Access::db(**writer), tmp, static_cast<int>(threads)); !s) return fail(s);
    if (Status s = (*writer)->createIndexes(); !s) return fail(s);
  }
  auto stats = finishMerge(**writer, *run, tmp, output);
  if (!stats) return fail(stats.status());
  return stats;
}
}  // namespace tpscope::tracedb
