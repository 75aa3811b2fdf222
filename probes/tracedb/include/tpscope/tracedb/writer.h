// Writer for one trace file (a rank's file while recording, or a run file built by merge/import).
//
// Batched: rows are inserted with cached prepared statements inside an explicit transaction that the caller opens
// with begin() and closes with commit() (the recorder commits once per flush). Any add*/put* outside a transaction
// opens one; the destructor commits it. WAL mode with synchronous=NORMAL: every committed transaction survives the
// death of the process (SIGKILL), so a reader sees everything flushed before a kill.
//
// Threading: one Writer is used by one thread at a time. Names are interned once (cache in memory).
#pragma once

#include <filesystem>
#include <memory>
#include <span>
#include <string_view>

#include "tpscope/tracedb/records.h"
#include "tpscope/tracedb/status.h"

struct sqlite3;

namespace tpscope::tracedb {

namespace detail {
struct Access;
}

struct CreateOptions {
  bool overwrite = false;       // replace an existing file (else: error if it exists)
  std::string runId;            // meta 'run_id'
  int64_t epochUnixNs = 0;      // meta 'epoch_unix_ns'
  std::string source = "capture";
  // A file written once into a temporary path and renamed when complete (an import): no journal and no syncs while
  // writing (a crash leaves the temporary file, never a damaged trace). close() restores WAL mode, as in every trace
  // file. SQLite's default 2 MB page cache, and the index sorts in temporary files: as fast here as a 32 MB cache
  // with the sorts in memory (a 64-rank import of 1.3 M spans: 3.0-3.3 s either way; its indexes built alone, 0.86 s
  // against 0.92 s, in 19 MB instead of 109 MB).
  bool bulkLoad = false;
};

class Writer {
 public:
  // Creates the file with schema version kFormatVersion. Error if the folder is missing or not writable, or the file
  // exists and !overwrite.
  static Result<std::unique_ptr<Writer>> create(const std::filesystem::path& path, const CreateOptions& options);
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  const std::filesystem::path& path() const { return path_; }

  Status begin();
  Status commit();
  bool inTransaction() const { return inTransaction_; }

  // Returns the id of `value` in the strings table (inserted once; cached).
  Result<uint32_t> intern(std::string_view value);

  Status setMeta(std::string_view key, std::string_view value);
  Status putRank(const RankInfo& rank);        // insert or replace
  Status putThread(const ThreadInfo& thread);  // insert or replace
  Status putGroup(const GroupInfo& group);     // insert or replace
  Status addSpan(const SpanRow& span);
  Status addSpans(std::span<const SpanRow> spans);
  Status upsertCollective(const CollectiveRow& c);  // (rank, group, seq) replaces the earlier state
  Status addGradStat(const GradStatRow& g);
  Status putStepStat(const StepStatRow& s);  // (rank, step) replaces
  Status addAlert(const AlertRow& a);
  Status addCounter(const CounterRow& c);
  Status addRecorderStats(const RecorderStatsRow& r);
  // The row id of the last row inserted. After addSpans the batch's ids are consecutive and end here, so a caller
  // can refer to the spans it just wrote (the recorder's host-span references for GPU correlation).
  int64_t lastRowId() const;

  // Adds `deltaNs` to the times of the spans and counters written so far: an import that writes them as it reads
  // its inputs learns the run's epoch only after the last one. Rows written later are not touched.
  Status shiftSpanAndCounterTimes(int64_t deltaNs);

  // Creates the query indexes (merge and import call it; the recorder does not, to keep ingest fast).
  Status createIndexes();
  // Commits, checkpoints the WAL into the main file and closes. Further calls fail.
  Status close();

 private:
  friend struct detail::Access;
  struct Statements;
  Writer(std::filesystem::path path, sqlite3* db);
  Status ensureTransaction();
  Status fail(std::string_view what);

  std::filesystem::path path_;
  sqlite3* db_ = nullptr;
  std::unique_ptr<Statements> stmts_;
  bool inTransaction_ = false;
  bool bulkLoad_ = false;
};

}  // namespace tpscope::tracedb
