#include "tpscope/tracedb/reader.h"

#include <sqlite3.h>

#include <algorithm>
#include <limits>
#include <string>
#include <system_error>
#include <tuple>
#include <variant>

#include "schema.h"
#include "sqlite_util.h"

namespace tpscope::tracedb {

using detail::Stmt;

namespace {
// Appends " AND <cond>" clauses and remembers the values to bind, in order.
struct Where {
  std::string sql;
  std::vector<std::variant<int64_t, std::string>> values;
  void add(const char* cond, int64_t v) {
    sql += sql.empty() ? " WHERE " : " AND ";
    sql += cond;
    values.emplace_back(v);
  }
  void add(const char* cond, std::string v) {
    sql += sql.empty() ? " WHERE " : " AND ";
    sql += cond;
    values.emplace_back(std::move(v));
  }
  void bind(Stmt& st) const {
    for (size_t i = 0; i < values.size(); ++i) {
      if (const auto* n = std::get_if<int64_t>(&values[i]))
        st.bind(static_cast<int>(i) + 1, *n);
      else
        st.bind(static_cast<int>(i) + 1, std::get<std::string>(values[i]));
    }
  }
};

constexpr const char* kSpanColumns =
    "SELECT rank, thread, kind, name, begin_ns, dur_ns, step, layer, phase, correlation FROM spans";

// The current row of a kSpanColumns statement.
void readSpan(Stmt& st, SpanRow& r) {
  r.rank = st.i32(0);
  r.thread = st.i32(1);
  r.kind = static_cast<SpanKind>(st.i32(2));
  r.name = static_cast<uint32_t>(st.i64(3));
  r.beginNs = st.i64(4);
  r.durNs = st.i64(5);
  r.step = st.i32(6);
  r.layer = st.i32(7);
  r.phase = static_cast<Phase>(st.i32(8));
  r.correlation = st.optI64(9);
}

// Runs `sql` and calls `row` for each result row. Any SQLite failure becomes an error naming the file.
template <class RowFn>
Status query(sqlite3* db, const std::filesystem::path& path, const std::string& sql, const Where* where, RowFn&& row,
             std::string_view what) {
  Stmt st(db, sql.c_str());
  if (!st.valid()) return detail::sqliteError(db, path, std::string("cannot read ") + std::string(what));
  if (where) where->bind(st);
  int rc;
  while ((rc = st.step()) == SQLITE_ROW) {
    if (!row(st)) return Status::ok();
  }
  if (rc != SQLITE_DONE) return detail::sqliteError(db, path, std::string("cannot read ") + std::string(what));
  return Status::ok();
}

// The first and last row id of `table` (a table with an `id INTEGER PRIMARY KEY`).
Result<IdRange> idRangeOf(sqlite3* db, const std::filesystem::path& path, const std::string& table) {
  // Two queries: SQLite answers min(id) and max(id) from the rowid b-tree only when each stands alone (together they
  // scan a whole index).
  IdRange range;
  auto one = [&](const char* aggregate, int64_t& end) {
    return query(
        db, path, std::string("SELECT ") + aggregate + "(id) FROM " + table, nullptr,
        [&](Stmt& st) {
          if (!st.isNull(0)) end = st.i64(0);
          return false;
        },
        "table '" + table + "'");
  };
  if (Status s = one("min", range.first); !s) return s;
  if (Status s = one("max", range.last); !s) return s;
  if (range.last < range.first) return IdRange{};
  return range;
}

// query() collecting one T per row; `make` turns the current row into a T.
template <class T, class MakeFn>
Result<std::vector<T>> collect(sqlite3* db, const std::filesystem::path& path, const std::string& sql,
                               const Where* where, MakeFn&& make, std::string_view what) {
  std::vector<T> out;
  Status s = query(
      db, path, sql, where,
      [&](Stmt& st) {
        out.push_back(make(st));
        return true;
      },
      what);
  if (!s) return s;
  return out;
}
}  // namespace

Reader::Reader(std::filesystem::path path, sqlite3* db, int version)
    : path_(std::move(path)), db_(db), version_(version) {}

Reader::~Reader() {
  sqlite3_close(db_);
}

Result<std::unique_ptr<Reader>> Reader::open(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return Status::error(path.string() + ": no such file");
  if (std::filesystem::is_directory(path, ec))
    return Status::error(path.string() +
                         ": is a folder, not a trace file (merge a capture folder with 'tpscope merge')");
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return Status::error(path.string() + ": cannot read: " + ec.message());
  if (size == 0) return Status::error(path.string() + ": the file is empty (not a tpscope trace)");

  sqlite3* db = nullptr;
  if (Status s = detail::openUntrusted(path, &db); !s) return s;
  sqlite3_busy_timeout(db, 2000);
  auto version = detail::checkSchema(db, path);
  if (!version) {
    sqlite3_close(db);
    return version.status();
  }
  return std::unique_ptr<Reader>(new Reader(path, db, *version));
}

Status Reader::error(std::string_view what) const {
  return detail::sqliteError(db_, path_, what);
}

void Reader::preferMemoryMap() { (void)detail::exec(db_, path_, "PRAGMA mmap_size = 68719476736"); }

void Reader::setBusyTimeout(int ms) { sqlite3_busy_timeout(db_, ms); }

bool Reader::hasIndex(std::string_view index) {
  Stmt st(db_, "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = ?");
  if (!st.valid()) return false;
  st.bind(1, index);
  return st.step() == SQLITE_ROW && st.i64(0) > 0;
}

Status Reader::forEachString(const std::function<void(uint32_t id, std::string_view value)>& callback) {
  return query(
      db_, path_, "SELECT id, value FROM strings ORDER BY id", nullptr,
      [&](Stmt& st) {
        const int64_t id = st.i64(0);
        if (id >= 0 && id <= (int64_t{1} << 31)) callback(static_cast<uint32_t>(id), st.view(1));
        return true;
      },
      "table 'strings'");
}

Result<std::map<std::string, std::string>> Reader::meta() {
  std::map<std::string, std::string> out;
  Status s = query(
      db_, path_, "SELECT key, value FROM meta", nullptr,
      [&](Stmt& st) {
        out.emplace(st.text(0), st.text(1));
        return true;
      },
      "table 'meta'");
  if (!s) return s;
  return out;
}

std::optional<std::string> Reader::metaValue(std::string_view key) {
  Stmt st(db_, "SELECT value FROM meta WHERE key = ?");
  if (!st.valid()) return std::nullopt;
  st.bind(1, key);
  if (st.step() != SQLITE_ROW) return std::nullopt;
  return st.text(0);
}

Result<std::vector<RankInfo>> Reader::ranks() {
  return collect<RankInfo>(
      db_, path_,
      "SELECT rank, host, pid, world_size, local_rank, tp_rank, tp_size, dp_rank, dp_size, device,"
      " clock_offset_ns, clock_uncertainty_ns, start_ns, end_ns, exit_reason FROM ranks ORDER BY rank",
      nullptr,
      [&](Stmt& st) {
        RankInfo r;
        r.rank = st.i32(0);
        r.host = st.text(1);
        r.pid = st.i64(2);
        r.worldSize = st.i32(3);
        r.localRank = st.i32(4);
        r.tpRank = st.i32(5);
        r.tpSize = st.i32(6);
        r.dpRank = st.i32(7);
        r.dpSize = st.i32(8);
        r.device = st.text(9);
        r.clockOffsetNs = st.i64(10);
        r.clockUncertaintyNs = st.i64(11);
        r.startNs = st.optI64(12);
        r.endNs = st.optI64(13);
        r.exitReason = st.text(14);
        return r;
      },
      "table 'ranks'");
}

Result<std::vector<ThreadInfo>> Reader::threads() {
  return collect<ThreadInfo>(
      db_, path_, "SELECT rank, thread, kind, name FROM threads ORDER BY rank, thread", nullptr,
      [&](Stmt& st) {
        return ThreadInfo{st.i32(0), st.i32(1), st.text(2), st.text(3)};
      },
      "table 'threads'");
}

Result<std::vector<GroupInfo>> Reader::groups() {
  return collect<GroupInfo>(
      db_, path_, "SELECT name, ranks, backend FROM process_groups ORDER BY name", nullptr,
      [&](Stmt& st) {
        return GroupInfo{st.text(0), detail::splitInts(st.text(1)), st.text(2)};
      },
      "table 'process_groups'");
}

Status Reader::loadStrings() {
  if (stringsLoaded_) return Status::ok();
  strings_.clear();
  Status s = query(
      db_, path_, "SELECT id, value FROM strings", nullptr,
      [&](Stmt& st) {
        const int64_t id = st.i64(0);
        if (id < 0 || id > (int64_t{1} << 31)) return true;
        if (static_cast<size_t>(id) >= strings_.size()) strings_.resize(static_cast<size_t>(id) + 1);
        strings_[static_cast<size_t>(id)] = st.text(1);
        return true;
      },
      "table 'strings'");
  stringsLoaded_ = true;
  return s;
}

const std::string& Reader::string(uint32_t id) {
  static const std::string kEmpty;
  (void)loadStrings();
  return id < strings_.size() ? strings_[id] : kEmpty;
}

std::optional<uint32_t> Reader::stringId(std::string_view value) {
  Stmt st(db_, "SELECT id FROM strings WHERE value = ?");
  if (!st.valid()) return std::nullopt;
  st.bind(1, value);
  if (st.step() != SQLITE_ROW) return std::nullopt;
  return static_cast<uint32_t>(st.i64(0));
}

Status Reader::forEachSpan(const SpanQuery& q, const std::function<bool(const SpanRow&)>& callback) {
  Where w;
  if (q.rank) w.add("rank = ?", *q.rank);
  if (q.thread) w.add("thread = ?", *q.thread);
  if (q.fromNs) w.add("begin_ns + dur_ns > ?", *q.fromNs);
  if (q.toNs) w.add("begin_ns < ?", *q.toNs);
  if (q.step) w.add("step = ?", *q.step);
  if (q.kind) w.add("kind = ?", static_cast<int64_t>(*q.kind));
  const std::string sql = std::string(kSpanColumns) + w.sql + " ORDER BY rank, begin_ns";
  SpanRow r;
  return query(
      db_, path_, sql, &w,
      [&](Stmt& st) {
        readSpan(st, r);
        return callback(r);
      },
      "table 'spans'");
}

Status Reader::forEachSpanInIdRange(int64_t fromId, int64_t toId, const std::function<bool(const SpanRow&)>& callback) {
  Where w;
  w.add("id >= ?", fromId);
  w.add("id < ?", toId);
  SpanRow r;
  return query(
      db_, path_, std::string(kSpanColumns) + w.sql, &w,
      [&](Stmt& st) {
        readSpan(st, r);
        return callback(r);
      },
      "table 'spans'");
}

Result<IdRange> Reader::spanIdRange() { return idRangeOf(db_, path_, "spans"); }
Result<IdRange> Reader::collectiveIdRange() { return idRangeOf(db_, path_, "collectives"); }

Result<std::vector<SpanRow>> Reader::spans(const SpanQuery& q) {
  std::vector<SpanRow> out;
  Status s = forEachSpan(q, [&](const SpanRow& r) {
    out.push_back(r);
    return true;
  });
  if (!s) return s;
  return out;
}

Result<int64_t> Reader::spanCount() {
  int64_t n = 0;
  Status s = query(
      db_, path_, "SELECT count(*) FROM spans", nullptr,
      [&](Stmt& st) {
        n = st.i64(0);
        return false;
      },
      "table 'spans'");
  if (!s) return s;
  return n;
}

Result<TimeRange> Reader::timeRange() {
  TimeRange r;
  bool any = false;
  auto take = [&](Stmt& st) {
    if (st.isNull(0)) return false;
    const int64_t b = st.i64(0), e = st.i64(1);
    r.beginNs = any ? std::min(r.beginNs, b) : b;
    r.endNs = any ? std::max(r.endNs, e) : e;
    any = true;
    return false;
  };
  if (Status s =
          query(db_, path_, "SELECT min(begin_ns), max(begin_ns + dur_ns) FROM spans", nullptr, take, "table 'spans'");
      !s)
    return s;
  if (Status s =
          query(db_, path_, "SELECT min(enqueue_ns), max(coalesce(end_ns, start_ns, enqueue_ns)) FROM collectives",
                nullptr, take, "table 'collectives'");
      !s)
    return s;
  return r;
}

namespace {
constexpr const char* kCollectiveColumns =
    "SELECT rank, group_name, seq, op, dtype, shape, numel, bytes, callsite, step, layer, phase, thread, enqueue_ns,"
    " start_ns, end_ns, state FROM collectives";

CollectiveRow readCollective(Stmt& st) {
  CollectiveRow c;
  c.rank = st.i32(0);
  c.group = st.text(1);
  c.seq = st.i64(2);
  c.op = st.text(3);
  c.dtype = st.text(4);
  c.shape = detail::shapeFromText(st.text(5));
  c.numel = st.i64(6);
  c.bytes = st.i64(7);
  c.callsite = st.text(8);
  c.step = st.i32(9);
  c.layer = st.i32(10);
  c.phase = static_cast<Phase>(st.i32(11));
  c.thread = st.i32(12);
  c.enqueueNs = st.i64(13);
  c.startNs = st.optI64(14);
  c.endNs = st.optI64(15);
  c.state = parseCollectiveState(st.text(16)).value_or(CollectiveState::Scheduled);
  return c;
}
}  // namespace

Result<std::vector<CollectiveRow>> Reader::collectives(const CollectiveQuery& q) {
  Where w;
  if (q.rank) w.add("rank = ?", *q.rank);
  if (q.group) w.add("group_name = ?", *q.group);
  if (q.step) w.add("step = ?", *q.step);
  const std::string sql = kCollectiveColumns + w.sql + " ORDER BY group_name, seq, rank";
  return collect<CollectiveRow>(db_, path_, sql, &w, readCollective, "table 'collectives'");
}

Result<std::vector<CollectiveRow>> Reader::newestCollectives(int rank) {
  auto groups = this->groups();
  if (!groups) return groups.status();
  std::vector<CollectiveRow> out;
  for (const GroupInfo& g : *groups) {
    // One probe of the (rank, group_name, seq) unique index per group, whatever the table's size.
    Where w;
    w.add("rank = ?", int64_t{rank});
    w.add("group_name = ?", g.name);
    auto rows = collect<CollectiveRow>(db_, path_, kCollectiveColumns + w.sql + " ORDER BY seq DESC LIMIT 1", &w,
                                       readCollective, "table 'collectives'");
    if (!rows) return rows.status();
    if (rows->empty()) continue;
    const int64_t newestSeq = rows->front().seq;
    out.push_back(std::move(rows->front()));
    // The earliest it has not completed among its last 16 (async collectives in flight: the first is the one its
    // peers may be missing from). A bounded range of the same index.
    Where open;
    open.add("rank = ?", int64_t{rank});
    open.add("group_name = ?", g.name);
    open.add("seq >= ?", newestSeq - 15);
    open.add("seq < ?", newestSeq);
    auto first = collect<CollectiveRow>(
        db_, path_, kCollectiveColumns + open.sql + " AND end_ns IS NULL AND state <> 'completed' ORDER BY seq LIMIT 1",
        &open, readCollective, "table 'collectives'");
    if (!first) return first.status();
    for (CollectiveRow& r : *first) out.push_back(std::move(r));
  }
  return out;
}

Result<std::optional<NamedSpan>> Reader::newestSpan(int rank) {
  std::optional<NamedSpan> out;
  Where w;
  w.add("s.rank = ?", int64_t{rank});
  // The newest span by id is the last one the recorder flushed; its name through the strings table as it is now
  // (a live file interns names after this Reader loaded them).
  Status s = query(
      db_, path_,
      "SELECT s.rank, s.thread, s.kind, s.name, s.begin_ns, s.dur_ns, s.step, s.layer, s.phase, s.correlation,"
      " coalesce(n.value, '') FROM spans s LEFT JOIN strings n ON n.id = s.name" + w.sql + " ORDER BY s.id DESC LIMIT 1",
      &w,
      [&](Stmt& st) {
        NamedSpan n;
        readSpan(st, n.span);
        n.name = st.text(10);
        out = std::move(n);
        return false;
      },
      "table 'spans'");
  if (!s) return s;
  return out;
}

Result<std::vector<GradStatRow>> Reader::gradStats(const GradQuery& q) {
  Where w;
  if (q.rank) w.add("g.rank = ?", *q.rank);
  if (q.step) w.add("g.step = ?", *q.step);
  const std::string sql =
      "SELECT g.rank, g.step, s.value, g.layer, g.l2_norm, g.max_abs, g.nan_count, g.inf_count, g.numel"
      " FROM grad_stats g LEFT JOIN strings s ON s.id = g.param" +
      w.sql + " ORDER BY g.step, g.rank, g.layer, s.value";
  return collect<GradStatRow>(
      db_, path_, sql, &w,
      [&](Stmt& st) {
        // SQLite stores NaN as NULL: a NULL norm is the NaN the recorder measured.
        constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
        return GradStatRow{
            st.i32(0), st.i32(1), st.text(2), st.i32(3), st.optF64(4).value_or(kNaN), st.optF64(5).value_or(kNaN),
            st.i64(6), st.i64(7), st.i64(8)};
      },
      "table 'grad_stats'");
}

namespace {
constexpr const char* kStepStatColumns =
    "SELECT rank, step, loss, lr, grad_norm, loss_scale, tokens, begin_ns, end_ns, skipped FROM step_stats";

StepStatRow readStepStat(Stmt& st) {
  StepStatRow r;
  r.rank = st.i32(0);
  r.step = st.i32(1);
  r.loss = st.optF64(2);
  r.lr = st.optF64(3);
  r.gradNorm = st.optF64(4);
  r.lossScale = st.optF64(5);
  r.tokens = st.optI64(6);
  r.beginNs = st.optI64(7);
  r.endNs = st.optI64(8);
  r.skipped = st.i64(9) != 0;
  return r;
}
}  // namespace

Result<std::vector<StepStatRow>> Reader::stepStats() {
  // Sorted here: SQLite's ORDER BY sorts the whole table through a temporary B-tree, several times slower (the
  // primary key orders by rank first). (rank, step) is unique: the order is the same.
  auto rows = collect<StepStatRow>(db_, path_, kStepStatColumns, nullptr, readStepStat, "table 'step_stats'");
  if (rows)
    std::stable_sort(rows->begin(), rows->end(), [](const StepStatRow& a, const StepStatRow& b) {
      return std::tie(a.step, a.rank) < std::tie(b.step, b.rank);
    });
  return rows;
}

Result<std::vector<StepStatRow>> Reader::latestStepStats(int n) {
  return collect<StepStatRow>(db_, path_,
                              std::string(kStepStatColumns) + " ORDER BY step DESC LIMIT " + std::to_string(n),
                              nullptr, readStepStat, "table 'step_stats'");
}

Result<LatestIds> Reader::latestIds() {
  LatestIds ids;
  Status s = query(
      db_, path_,
      "SELECT (SELECT coalesce(max(id), 0) FROM spans), (SELECT coalesce(max(id), 0) FROM collectives)", nullptr,
      [&](Stmt& st) {
        ids = LatestIds{st.i64(0), st.i64(1)};
        return false;
      },
      "tables 'spans' and 'collectives'");
  if (!s) return s;
  return ids;
}

namespace {
constexpr const char* kAlertColumns =
    "SELECT id, rank, step, ts_ns, severity, kind, layer, param, message, evidence FROM alerts";

AlertRow readAlert(Stmt& st) {
  AlertRow a;
  a.id = st.i64(0);
  a.rank = st.i32(1);
  a.step = st.i32(2);
  a.tsNs = st.i64(3);
  a.severity = st.text(4);
  a.kind = st.text(5);
  a.layer = st.i32(6);
  a.param = st.text(7);
  a.message = st.text(8);
  a.evidence = st.text(9);
  return a;
}
}  // namespace

Result<std::vector<AlertRow>> Reader::alerts() {
  return collect<AlertRow>(db_, path_, std::string(kAlertColumns) + " ORDER BY ts_ns, id", nullptr, readAlert,
                           "table 'alerts'");
}

Result<std::vector<AlertRow>> Reader::alertsSince(int64_t id) {
  Where w;
  w.add("id > ?", id);
  return collect<AlertRow>(db_, path_, std::string(kAlertColumns) + w.sql + " ORDER BY id", &w, readAlert,
                           "table 'alerts'");
}

Result<std::vector<CounterRow>> Reader::counters() {
  return collect<CounterRow>(
      db_, path_,
      "SELECT c.rank, s.value, c.ts_ns, c.value FROM counters c LEFT JOIN strings s ON s.id = c.name"
      " ORDER BY s.value, c.rank, c.ts_ns",
      nullptr,
      [&](Stmt& st) {
        return CounterRow{st.i32(0), st.text(1), st.i64(2), st.f64(3)};
      },
      "table 'counters'");
}

Result<std::vector<RecorderStatsRow>> Reader::recorderStats() {
  return collect<RecorderStatsRow>(
      db_, path_,
      "SELECT rank, ts_ns, spans_written, spans_dropped, records_written, records_dropped, flushes,"
      " flush_ns_max, flush_ns_total, probe_overhead_ns FROM recorder_stats ORDER BY rank, ts_ns",
      nullptr,
      [&](Stmt& st) {
        return RecorderStatsRow{st.i32(0), st.i64(1), st.i64(2), st.i64(3), st.i64(4),
                                st.i64(5), st.i64(6), st.i64(7), st.i64(8), st.i64(9)};
      },
      "table 'recorder_stats'");
}

}  // namespace tpscope::tracedb
