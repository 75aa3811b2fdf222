#include "tpscope/tracedb/merge.h"

#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <set>
#include <string>
#include <system_error>
#include <tuple>
#include <vector>

#include "merge_internal.h"
#include "sqlite_util.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/run_files.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::tracedb {

namespace {

// Every row of every table, with times shifted per rank by temp.shifts (FileClock::shiftNs, filled by copyAttached)
// and strings remapped by temp.smap. Spans are written in (rank, thread, begin) order: readers that build per-lane
// timelines then need no sort. Their ids are renumbered in that order (temp.idmap) and spans.correlation — a GPU
// record's launching host span, an id within its file — follows its span to the new id. The shift of a rank missing from src.ranks is the plain epoch difference (?1).
constexpr const char* kCopyHeadSql = R"SQL(
INSERT OR IGNORE INTO main.strings(value) SELECT value FROM src.strings;
CREATE TEMP TABLE smap(old INTEGER PRIMARY KEY, new INTEGER NOT NULL);
INSERT INTO temp.smap SELECT s.id, m.id FROM src.strings s JOIN main.strings m ON m.value = s.value;
INSERT OR REPLACE INTO main.ranks SELECT rank, host, pid, world_size, local_rank, tp_rank, tp_size, dp_rank, dp_size,
  device, clock_offset_ns, clock_uncertainty_ns, start_ns + (SELECT shift FROM temp.shifts h WHERE h.rank = r.rank),
  end_ns + (SELECT shift FROM temp.shifts h WHERE h.rank = r.rank), exit_reason FROM src.ranks r;
INSERT OR IGNORE INTO main.threads SELECT rank, thread, kind, name FROM src.threads;
INSERT OR IGNORE INTO main.process_groups SELECT name, ranks, size, backend FROM src.process_groups;
CREATE TEMP TABLE idmap(old INTEGER PRIMARY KEY, new INTEGER NOT NULL);
)SQL";

// The spans to copy, numbered in the order they are written: every one of them...
constexpr const char* kAllSpansSql = R"SQL(
INSERT INTO temp.idmap SELECT s.id, (SELECT coalesce(max(id), 0) FROM main.spans)
  + row_number() OVER (ORDER BY s.rank, s.thread, s.begin_ns, s.id) FROM src.spans s;
)SQL";

// ...or the spans of temp.keep (MergeSpans::Ends: keepEndSpans).
constexpr const char* kKeptSpansSql = R"SQL(
INSERT INTO temp.idmap SELECT s.id, (SELECT coalesce(max(id), 0) FROM main.spans)
  + row_number() OVER (ORDER BY s.rank, s.thread, s.begin_ns, s.id) FROM temp.keep k JOIN src.spans s ON s.id = k.id;
DROP TABLE temp.keep;
)SQL";

constexpr const char* kCopyTailSql = R"SQL(
INSERT INTO main.spans(id, rank, thread, kind, name, begin_ns, dur_ns, step, layer, phase, correlation)
  SELECT o.new, s.rank, s.thread, s.kind, m.new, s.begin_ns + coalesce(h.shift, ?1), s.dur_ns, s.step, s.layer,
         s.phase, c.new
  FROM src.spans s JOIN temp.idmap o ON o.old = s.id JOIN temp.smap m ON m.old = s.name
  LEFT JOIN temp.shifts h ON h.rank = s.rank LEFT JOIN temp.idmap c ON c.old = s.correlation
  ORDER BY o.new;
INSERT OR REPLACE INTO main.collectives(rank, group_name, seq, op, dtype, shape, numel, bytes, callsite, step, layer,
  phase, thread, enqueue_ns, start_ns, end_ns, state)
  SELECT c.rank, group_name, seq, op, dtype, shape, numel, bytes, callsite, step, layer, phase, thread,
         enqueue_ns + coalesce(h.shift, ?1), start_ns + coalesce(h.shift, ?1), end_ns + coalesce(h.shift, ?1), state
  FROM src.collectives c LEFT JOIN temp.shifts h ON h.rank = c.rank;
INSERT INTO main.grad_stats SELECT g.rank, g.step, m.new, g.layer, g.l2_norm, g.max_abs, g.nan_count, g.inf_count,
  g.numel FROM src.grad_stats g JOIN temp.smap m ON m.old = g.param;
INSERT OR REPLACE INTO main.step_stats SELECT st.rank, st.step, loss, lr, grad_norm, loss_scale, tokens,
  begin_ns + coalesce(h.shift, ?1), end_ns + coalesce(h.shift, ?1), skipped
  FROM src.step_stats st LEFT JOIN temp.shifts h ON h.rank = st.rank;
INSERT INTO main.alerts(rank, step, ts_ns, severity, kind, layer, param, message, evidence)
  SELECT a.rank, step, ts_ns + coalesce(h.shift, ?1), severity, kind, layer, param, message, evidence
  FROM src.alerts a LEFT JOIN temp.shifts h ON h.rank = a.rank ORDER BY a.ts_ns, a.id;
INSERT INTO main.counters SELECT c.rank, m.new, c.ts_ns + coalesce(h.shift, ?1), c.value
  FROM src.counters c JOIN temp.smap m ON m.old = c.name LEFT JOIN temp.shifts h ON h.rank = c.rank;
INSERT INTO main.recorder_stats SELECT r.rank, r.ts_ns + coalesce(h.shift, ?1), spans_written, spans_dropped,
  records_written, records_dropped, flushes, flush_ns_max, flush_ns_total, probe_overhead_ns
  FROM src.recorder_stats r LEFT JOIN temp.shifts h ON h.rank = r.rank;
INSERT OR IGNORE INTO main.meta SELECT key, value FROM src.meta
  WHERE key NOT IN ('format', 'run_id', 'epoch_unix_ns', 'source', 'tool', 'clock_aligned');
DROP TABLE temp.shifts;
DROP TABLE temp.smap;
DROP TABLE temp.idmap;
)SQL";

// temp.keep: the ids of the spans a diagnosis file keeps of the attached input (MergeSpans::Ends). Each rank's first
// span and its newest kEndSpans, in the order the run file's ids give them (rank, thread, begin, then the input's
// id), so that a query for a rank's first or newest spans through the spans_rank_begin index finds the same spans in
// both files; every span of an input with a pipeline layout. Chosen here rather than by a window query: three
// sorts of every span cost more than copying the rest of the input.
Status keepEndSpans(sqlite3* db, const RunFile& in, const std::string& what) {
  auto run = [&](const char* sql) { return detail::exec(db, in.path, sql); };
  if (Status s = run("CREATE TEMP TABLE keep(id INTEGER PRIMARY KEY)"); !s) return s;
  {
    detail::Stmt pipeline(db, "SELECT 1 FROM src.meta WHERE key = ?");
    if (!pipeline.valid()) return detail::sqliteError(db, in.path, what);
    pipeline.bind(1, meta_keys::kPipeline);
    if (pipeline.step() == SQLITE_ROW) return run("INSERT INTO temp.keep SELECT id FROM src.spans");
  }
  struct Key {
    int thread;
    int64_t begin, id;
    bool operator<(const Key& o) const { return std::tie(begin, thread, id) < std::tie(o.begin, o.thread, o.id); }
  };
  std::map<int, std::vector<Key>> byRank;
  {
    detail::Stmt scan(db, "SELECT rank, thread, begin_ns, id FROM src.spans");
    if (!scan.valid()) return detail::sqliteError(db, in.path, what);
    int rc;
    while ((rc = scan.step()) == SQLITE_ROW) byRank[scan.i32(0)].push_back({scan.i32(1), scan.i64(2), scan.i64(3)});
    if (rc != SQLITE_DONE) return detail::sqliteError(db, in.path, what);
  }
  detail::Stmt keep(db, "INSERT OR IGNORE INTO temp.keep VALUES (?)");
  if (!keep.valid()) return detail::sqliteError(db, in.path, what);
  auto add = [&](const Key& k) {
    keep.bind(1, k.id);
    return detail::runStmt(keep, db, in.path, what);
  };
  for (auto& [rank, keys] : byRank) {
    const auto newest = keys.size() > static_cast<size_t>(kEndSpans) ? keys.end() - kEndSpans : keys.begin();
    std::nth_element(keys.begin(), newest, keys.end());
    for (auto it = newest; it != keys.end(); ++it)
      if (Status s = add(*it); !s) return s;
    if (newest != keys.begin())
      if (Status s = add(*std::min_element(keys.begin(), newest)); !s) return s;
  }
  return Status::ok();
}

// Fills temp.shifts with each rank's shift, then runs the copy statement by statement (kCopyHeadSql, the choice of
// spans, kCopyTailSql), binding the epoch shift (?1) where it appears. Errors name both files: a damaged input and
// a full disk under the output fail the same statements.
Status copyAttached(sqlite3* db, const RunFile& in, const std::filesystem::path& output, MergeSpans spans) {
  const std::string what = "cannot merge it into " + output.string();
  const int64_t epochShift = in.clock.epochShiftNs;
  constexpr const char* kShifts = "CREATE TEMP TABLE shifts(rank INTEGER PRIMARY KEY, shift INTEGER NOT NULL)";
  if (Status s = detail::exec(db, in.path, kShifts); !s) return s;
  detail::Stmt shift(db, "INSERT INTO temp.shifts VALUES (?, ?)");
  if (!shift.valid()) return detail::sqliteError(db, in.path, what);
  for (const RankInfo& r : in.ranks) {
    shift.bind(1, r.rank);
    shift.bind(2, in.clock.shiftNs(r.rank));
    if (Status s = detail::runStmt(shift, db, in.path, what); !s) return s;
  }
  shift = detail::Stmt();
  if (spans == MergeSpans::Ends)
    if (Status s = keepEndSpans(db, in, what); !s) return s;
  for (const char* sql : {kCopyHeadSql, spans == MergeSpans::All ? kAllSpansSql : kKeptSpansSql, kCopyTailSql})
    while (*sql != '\0') {
      sqlite3_stmt* st = nullptr;
      const char* tail = nullptr;
      if (sqlite3_prepare_v2(db, sql, -1, &st, &tail) != SQLITE_OK) return detail::sqliteError(db, in.path, what);
      if (st == nullptr) break;  // only whitespace left
      if (sqlite3_bind_parameter_count(st) >= 1) sqlite3_bind_int64(st, 1, epochShift);
      const int rc = sqlite3_step(st);
      sqlite3_finalize(st);
      if (rc != SQLITE_DONE && rc != SQLITE_ROW) return detail::sqliteError(db, in.path, what);
      sql = tail;
    }
  return Status::ok();
}

std::string fileUri(const std::filesystem::path& p) {
  std::string uri = "file:";
  for (const char c : std::filesystem::absolute(p).string()) {
    if (c == '%' || c == '?' || c == '#') {
      static constexpr char kHex[] = "0123456789ABCDEF";
      uri += '%';
      uri += kHex[(static_cast<unsigned char>(c) >> 4) & 0xF];
      uri += kHex[static_cast<unsigned char>(c) & 0xF];
    } else {
      uri += c;
    }
  }
  return uri + "?mode=ro";
}

}  // namespace

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

namespace detail {

Status checkOutput(std::span<const std::filesystem::path> inputs, const std::filesystem::path& output) {
  if (inputs.empty()) return Status::error(output.string() + ": nothing to merge (no input files)");
  std::error_code ec;
  for (const auto& path : inputs)
    if (std::filesystem::exists(output, ec) && std::filesystem::equivalent(path, output, ec))
      return Status::error(output.string() + ": the output is also an input");
  return Status::ok();
}

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

std::filesystem::path mergeTemporary(const std::filesystem::path& output) {
  return output.string() + ".tmp-" + std::to_string(::getpid());
}

void removeMergeOutput(const std::filesystem::path& tmp) {
  std::error_code ec;
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(tmp.string() + suffix, ec);
}

Result<std::unique_ptr<Writer>> createMergeOutput(const RunFiles& run, const std::string& runId,
                                                  const std::filesystem::path& tmp) {
  auto writer = Writer::create(tmp, CreateOptions{true, runId, run.epochUnixNs, "merge"});
  if (!writer) return writer.status();
  if (Status s = exec(Access::db(**writer), tmp, "PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF"); !s) {
    (void)(*writer)->close();
    removeMergeOutput(tmp);
    return s;
  }
  return writer;
}

Status allowSortThreads(sqlite3* db, const std::filesystem::path& path, int threads) {
  return exec(db, path, ("PRAGMA threads = " + std::to_string(std::max(0, threads))).c_str());
}

Result<MergeStats> finishMerge(Writer& writer, const RunFiles& run, const std::filesystem::path& tmp,
                               const std::filesystem::path& output) {
  sqlite3* db = Access::db(writer);
  // A run file is written once: a rollback journal lets read-only readers open it without leaving -wal/-shm behind.
  if (Status s = exec(db, output, "PRAGMA journal_mode = DELETE"); !s) return s;
  MergeStats stats;
  for (const RunFile& in : run.files) stats.ranks += static_cast<int>(in.ranks.size());
  {
    Stmt count(db, "SELECT (SELECT count(*) FROM spans), (SELECT count(*) FROM collectives)");
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

}  // namespace detail

Result<MergeStats> merge(std::span<const std::filesystem::path> inputs, const std::filesystem::path& output,
                         const MergeOptions& options) {
  if (Status s = detail::checkOutput(inputs, output); !s) return s;
  auto run = openRunFiles(inputs, /*keepReaders=*/false);
  if (!run) return run.status();
  auto runId = detail::checkInputs(*run);
  if (!runId) return runId.status();

  const std::filesystem::path tmp = detail::mergeTemporary(output);
  auto writer = detail::createMergeOutput(*run, *runId, tmp);
  if (!writer) return writer.status();
  sqlite3* db = detail::Access::db(**writer);
  auto cleanup = [&](Status s) -> Result<MergeStats> {
    (void)(*writer)->close();
    detail::removeMergeOutput(tmp);
    return s;
  };

  for (const RunFile& in : run->files) {
    if (Status s = (*writer)->commit(); !s) return cleanup(s);
    detail::Stmt attach(db, "ATTACH DATABASE ? AS src");
    attach.bind(1, fileUri(in.path));
    if (attach.step() != SQLITE_DONE) return cleanup(detail::sqliteError(db, in.path, "cannot attach for merge"));
    attach = detail::Stmt();
    Status s = detail::exec(db, in.path, "BEGIN");
    if (s) s = copyAttached(db, in, output, options.spans);
    if (s) s = detail::exec(db, output, "COMMIT");
    else (void)detail::exec(db, in.path, "ROLLBACK");
    (void)detail::exec(db, in.path, "DETACH DATABASE src");
    if (!s) return cleanup(s);
  }
  if (Status s = (*writer)->setMeta(meta_keys::kClockAligned, "1"); !s) return cleanup(s);
  if (options.indexes)
    if (Status s = (*writer)->createIndexes(); !s) return cleanup(s);
  auto stats = detail::finishMerge(**writer, *run, tmp, output);
  if (!stats) return cleanup(stats.status());
  return stats;
}

}  // namespace tpscope::tracedb
