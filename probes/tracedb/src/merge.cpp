#include "tpscope/tracedb/merge.h"

#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <set>
#include <string>
#include <system_error>

#include "sqlite_util.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::tracedb {

namespace {

struct InputInfo {
  std::filesystem::path path;
  std::string runId;
  int64_t epochNs = 0;
  bool aligned = false;
  std::vector<int> ranks;
};

int64_t parseI64(const std::optional<std::string>& s) {
  int64_t v = 0;
  if (s) std::from_chars(s->data(), s->data() + s->size(), v);
  return v;
}

// Every row of every table, with times shifted per rank by temp.shifts and strings remapped by temp.smap.
// Spans are written in (rank, thread, begin) order: readers that build per-lane timelines then need no sort.
// The shift of a rank missing from src.ranks is the plain epoch difference (?1).
constexpr const char* kCopySql = R"SQL(
CREATE TEMP TABLE shifts(rank INTEGER PRIMARY KEY, shift INTEGER NOT NULL);
INSERT INTO temp.shifts SELECT rank, ?1 + CASE WHEN ?2 THEN 0 ELSE clock_offset_ns END FROM src.ranks;
INSERT OR IGNORE INTO main.strings(value) SELECT value FROM src.strings;
CREATE TEMP TABLE smap(old INTEGER PRIMARY KEY, new INTEGER NOT NULL);
INSERT INTO temp.smap SELECT s.id, m.id FROM src.strings s JOIN main.strings m ON m.value = s.value;
INSERT OR REPLACE INTO main.ranks SELECT rank, host, pid, world_size, local_rank, tp_rank, tp_size, dp_rank, dp_size,
  device, clock_offset_ns, clock_uncertainty_ns, start_ns + (SELECT shift FROM temp.shifts h WHERE h.rank = r.rank),
  end_ns + (SELECT shift FROM temp.shifts h WHERE h.rank = r.rank), exit_reason FROM src.ranks r;
INSERT OR IGNORE INTO main.threads SELECT rank, thread, kind, name FROM src.threads;
INSERT OR IGNORE INTO main.process_groups SELECT name, ranks, size, backend FROM src.process_groups;
INSERT INTO main.spans(rank, thread, kind, name, begin_ns, dur_ns, step, layer, phase, correlation)
  SELECT s.rank, s.thread, s.kind, m.new, s.begin_ns + coalesce(h.shift, ?1), s.dur_ns, s.step, s.layer, s.phase,
         s.correlation
  FROM src.spans s JOIN temp.smap m ON m.old = s.name LEFT JOIN temp.shifts h ON h.rank = s.rank
  ORDER BY s.rank, s.thread, s.begin_ns;
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
)SQL";

// Runs kCopySql statement by statement, binding the epoch shift and the aligned flag where they appear. Errors name
// both files: a damaged input and a full disk under the output fail the same statements.
Status copyAttached(sqlite3* db, const InputInfo& in, const std::filesystem::path& output, int64_t epochShift) {
  const std::string what = "cannot merge it into " + output.string();
  const char* sql = kCopySql;
  while (*sql != '\0') {
    sqlite3_stmt* st = nullptr;
    const char* tail = nullptr;
    if (sqlite3_prepare_v2(db, sql, -1, &st, &tail) != SQLITE_OK) return detail::sqliteError(db, in.path, what);
    if (st == nullptr) break;  // only whitespace left
    if (sqlite3_bind_parameter_count(st) >= 1) sqlite3_bind_int64(st, 1, epochShift);
    if (sqlite3_bind_parameter_count(st) >= 2) sqlite3_bind_int(st, 2, in.aligned ? 1 : 0);
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

Result<MergeStats> merge(std::span<const std::filesystem::path> inputs, const std::filesystem::path& output) {
  if (inputs.empty()) return Status::error(output.string() + ": nothing to merge (no input files)");
  std::error_code ec;
  std::vector<InputInfo> infos;
  std::set<int> seenRanks;
  for (const auto& path : inputs) {
    if (std::filesystem::exists(output, ec) && std::filesystem::equivalent(path, output, ec))
      return Status::error(output.string() + ": the output is also an input");
    auto reader = Reader::open(path);
    if (!reader) return reader.status();
    InputInfo info;
    info.path = path;
    info.runId = (*reader)->metaValue(meta_keys::kRunId).value_or("");
    info.epochNs = parseI64((*reader)->metaValue(meta_keys::kEpochUnixNs));
    info.aligned = (*reader)->metaValue(meta_keys::kClockAligned).value_or("") == "1";
    auto ranks = (*reader)->ranks();
    if (!ranks) return ranks.status();
    for (const auto& r : *ranks) {
      if (!seenRanks.insert(r.rank).second)
        return Status::error(path.string() + ": rank " + std::to_string(r.rank) +
                             " is also in another input (merge each rank once)");
      info.ranks.push_back(r.rank);
    }
    if (!infos.empty() && !info.runId.empty() && !infos.front().runId.empty() && info.runId != infos.front().runId)
      return Status::error(path.string() + ": belongs to run '" + info.runId + "' but " +
                           infos.front().path.string() + " belongs to run '" + infos.front().runId +
                           "' (refusing to merge files of different runs)");
    infos.push_back(std::move(info));
  }

  int64_t epoch = infos.front().epochNs;
  std::string runId;
  for (const auto& in : infos) {
    epoch = std::min(epoch, in.epochNs);
    if (runId.empty()) runId = in.runId;
  }

  const std::filesystem::path tmp = output.string() + ".tmp-" + std::to_string(::getpid());
  auto writer = Writer::create(tmp, CreateOptions{true, runId, epoch, "merge"});
  if (!writer) return writer.status();
  sqlite3* db = (*writer)->handle();
  auto cleanup = [&](Status s) -> Result<MergeStats> {
    (void)(*writer)->close();
    std::filesystem::remove(tmp, ec);
    std::filesystem::remove(tmp.string() + "-wal", ec);
    std::filesystem::remove(tmp.string() + "-shm", ec);
    return s;
  };

  for (const auto& in : infos) {
    if (Status s = (*writer)->commit(); !s) return cleanup(s);
    detail::Stmt attach(db, "ATTACH DATABASE ? AS src");
    attach.bind(1, fileUri(in.path));
    if (attach.step() != SQLITE_DONE) return cleanup(detail::sqliteError(db, in.path, "cannot attach for merge"));
    attach = detail::Stmt();
    Status s = detail::exec(db, in.path, "BEGIN");
    if (s) s = copyAttached(db, in, output, in.epochNs - epoch);
    if (s) s = detail::exec(db, output, "COMMIT");
    else (void)detail::exec(db, in.path, "ROLLBACK");
    (void)detail::exec(db, in.path, "DETACH DATABASE src");
    if (!s) return cleanup(s);
  }
  if (Status s = (*writer)->setMeta(meta_keys::kClockAligned, "1"); !s) return cleanup(s);
  if (Status s = (*writer)->createIndexes(); !s) return cleanup(s);
  // A run file is written once: a rollback journal lets read-only readers open it without leaving -wal/-shm behind.
  if (Status s = detail::exec(db, output, "PRAGMA journal_mode = DELETE"); !s) return cleanup(s);

  MergeStats stats;
  stats.ranks = static_cast<int>(seenRanks.size());
  {
    detail::Stmt count(db, "SELECT (SELECT count(*) FROM spans), (SELECT count(*) FROM collectives)");
    if (count.valid() && count.step() == SQLITE_ROW) {
      stats.spans = count.i64(0);
      stats.collectives = count.i64(1);
    }
  }
  if (Status s = (*writer)->close(); !s) return cleanup(s);
  std::filesystem::rename(tmp, output, ec);
  if (ec) return cleanup(Status::error(output.string() + ": cannot write the merged file: " + ec.message()));
  return stats;
}

}  // namespace tpscope::tracedb
