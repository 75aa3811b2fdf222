// Reader for a trace file: validates it on open and answers typed queries.
//
// open() refuses, with a message naming the file: a missing or empty file, a file that is not SQLite, an SQLite file
// that is not a tpscope trace, a trace of a newer format version. A truncated or corrupted file that passes open()
// makes the query that reaches the damage return an error naming the file — never a crash.
// Untrusted files are opened read-only with SQLite's defensive settings, no extension loading, trusted_schema off.
//
// Threading: one Reader per thread (SQLite connections are not shared); open a second Reader for a worker thread.
//
// The Reader is the only way into a trace file for reading: typed rows here, the caller's own SELECTs through
// tracedb::Query (query.h), several files of one run with their clocks aligned through openRunFiles (run_files.h).
// No SQLite handle is handed out.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tpscope/tracedb/records.h"
#include "tpscope/tracedb/status.h"

struct sqlite3;

namespace tpscope::tracedb {

namespace detail {
struct Access;
}

struct SpanQuery {
  std::optional<int> rank;
  std::optional<int> thread;
  std::optional<int64_t> fromNs;  // spans that end after fromNs...
  std::optional<int64_t> toNs;    // ...and begin before toNs
  std::optional<int> step;
  std::optional<SpanKind> kind;
};

struct CollectiveQuery {
  std::optional<int> rank;
  std::optional<std::string> group;
  std::optional<int> step;
};

struct GradQuery {
  std::optional<int> rank;
  std::optional<int> step;
};

struct TimeRange {
  int64_t beginNs = 0;
  int64_t endNs = 0;
};

// Row ids of a table, both ends included.
struct IdRange {
  int64_t first = 0;
  int64_t last = -1;
  bool empty() const { return last < first; }
};

// The newest row ids of the tables a live rank file grows in (0: none yet). A reader polling a file under recording
// sees progress when they grow.
struct LatestIds {
  int64_t span = 0;
  int64_t collective = 0;
};

// A span with its name (the strings table read at the time of the query).
struct NamedSpan {
  SpanRow span;
  std::string name;
};

class Reader {
 public:
  static Result<std::unique_ptr<Reader>> open(const std::filesystem::path& path);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const std::filesystem::path& path() const { return path_; }
  int formatVersion() const { return version_; }

  Result<std::map<std::string, std::string>> meta();
  std::optional<std::string> metaValue(std::string_view key);

  Result<std::vector<RankInfo>> ranks();
  Result<std::vector<ThreadInfo>> threads();
  Result<std::vector<GroupInfo>> groups();
  // The string with id `id`; "" for an unknown id. Loads the strings table once.
  const std::string& string(uint32_t id);
  std::optional<uint32_t> stringId(std::string_view value);

  // Streams spans ordered by (rank, begin_ns) without materialising them. The callback returns false to stop.
  Status forEachSpan(const SpanQuery& query, const std::function<bool(const SpanRow&)>& callback);
  Result<std::vector<SpanRow>> spans(const SpanQuery& query = {});
  // Spans with id in [fromId, toId), in id order (the order they were written; in a merged file (rank, thread,
  // begin)). Cheaper than forEachSpan for a parallel scan of a whole file: no sort, one B-tree range per worker.
  Status forEachSpanInIdRange(int64_t fromId, int64_t toId, const std::function<bool(const SpanRow&)>& callback);
  Result<IdRange> spanIdRange();        // empty if there are no spans
  Result<IdRange> collectiveIdRange();  // the same for the collectives
  Result<int64_t> spanCount();
  Result<TimeRange> timeRange();  // over spans and collectives

  Result<std::vector<CollectiveRow>> collectives(const CollectiveQuery& query = {});  // by group, seq, rank
  Result<std::vector<GradStatRow>> gradStats(const GradQuery& query = {});            // by step, rank, layer
  Result<std::vector<StepStatRow>> stepStats();                                       // by step, rank
  Result<std::vector<AlertRow>> alerts();                                             // by time
  Result<std::vector<AlertRow>> alertsSince(int64_t id);                              // id > `id`, by id
  Result<std::vector<StepStatRow>> latestStepStats(int n);                            // n newest steps, newest first
  Result<LatestIds> latestIds();
  // A live rank file's frontier, for a watcher: per process group (by name), `rank`'s collective of the highest seq,
  // then, when one of its 15 seqs before is not completed, the first such (async collectives still in flight); and
  // the span it wrote last (by id), none when it wrote none. Cheap at any table size (index probes).
  Result<std::vector<CollectiveRow>> newestCollectives(int rank);
  Result<std::optional<NamedSpan>> newestSpan(int rank);
  Result<std::vector<CounterRow>> counters();                                         // by name, rank, time
  Result<std::vector<RecorderStatsRow>> recorderStats();

  // Every interned string with its id, in id order.
  Status forEachString(const std::function<void(uint32_t id, std::string_view value)>& callback);
  // True when the index exists (the query indexes of indexes.sql: merged and imported files have them).
  bool hasIndex(std::string_view index);

  // Lets SQLite read the file through a memory map (no copy per page read): the viewer's random reads and the merge's.
  // Harmless where mmap is unavailable (SQLite falls back to read()). The batch analyses (report, diagnose, the
  // summaries) read through SQLite's page cache instead: a one-pass scan costs the same or ~3 % more (1.3 M spans:
  // 0.67 s against 0.70 s), and the process does not hold the file's pages (44 MB of its 95 MB resident there).
  void preferMemoryMap();
  // How long a read waits for a writer's lock before it fails (open() sets 2 s). A poller of a live rank file sets a
  // short one and tries again at its next poll.
  void setBusyTimeout(int ms);

  // Formats an SQLite failure as "<file>: <what>: <sqlite message>".
  Status error(std::string_view what) const;

 private:
  friend struct detail::Access;
  Reader(std::filesystem::path path, sqlite3* db, int version);
  Status loadStrings();

  std::filesystem::path path_;
  sqlite3* db_ = nullptr;
  int version_ = 0;
  bool stringsLoaded_ = false;
  std::vector<std::string> strings_;  // index = id
};

}  // namespace tpscope::tracedb
