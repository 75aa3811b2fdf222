#include "tpscope/tracedb/writer.h"

#include <sqlite3.h>
#include <unistd.h>

#include <string>
#include <system_error>
#include <unordered_map>

#include "schema.h"
#include "sqlite_util.h"
#include "tpscope/version.h"

namespace tpscope::tracedb {

using detail::Stmt;

namespace {
// Spans go in multi-row INSERTs: one statement step per kSpanBatch rows roughly halves SQLite's per-row cost.
// Host spans rarely carry a correlation id: batches without one use a statement that leaves the column out (~5%).
constexpr int kSpanBatch = 32;

std::string spanInsertSql(int rows, bool withCorrelation) {
  std::string sql = withCorrelation
                        ? "INSERT INTO spans(rank, thread, kind, name, begin_ns, dur_ns, step, layer, phase, correlation)"
                        : "INSERT INTO spans(rank, thread, kind, name, begin_ns, dur_ns, step, layer, phase)";
  const char* row = withCorrelation ? "(?,?,?,?,?,?,?,?,?,?)" : "(?,?,?,?,?,?,?,?,?)";
  sql += " VALUES ";
  for (int r = 0; r < rows; ++r) {
    if (r) sql += ',';
    sql += row;
  }
  return sql;
}

void bindSpan(Stmt& s, int base, const SpanRow& r, bool withCorrelation) {
  s.bind(base + 1, r.rank);
  s.bind(base + 2, r.thread);
  s.bind(base + 3, static_cast<int>(r.kind));
  s.bind(base + 4, static_cast<int64_t>(r.name));
  s.bind(base + 5, r.beginNs);
  s.bind(base + 6, r.durNs);
  s.bind(base + 7, r.step);
  s.bind(base + 8, r.layer);
  s.bind(base + 9, static_cast<int>(r.phase));
  if (withCorrelation) s.bind(base + 10, r.correlation);
}

void removeWithSidecars(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  std::filesystem::remove(path.string() + "-wal", ec);
  std::filesystem::remove(path.string() + "-shm", ec);
  std::filesystem::remove(path.string() + "-journal", ec);
}
}  // namespace

struct Writer::Statements {
  explicit Statements(sqlite3* db)
      : internInsert(db, "INSERT INTO strings(value) VALUES (?) ON CONFLICT(value) DO NOTHING"),
        internSelect(db, "SELECT id FROM strings WHERE value = ?"),
        meta(db, "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)"),
        rank(db,
             "INSERT OR REPLACE INTO ranks(rank, host, pid, world_size, local_rank, tp_rank, tp_size, dp_rank, dp_size,"
             " device, clock_offset_ns, clock_uncertainty_ns, start_ns, end_ns, exit_reason)"
             " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"),
        thread(db, "INSERT OR REPLACE INTO threads(rank, thread, kind, name) VALUES (?,?,?,?)"),
        group(db, "INSERT OR REPLACE INTO process_groups(name, ranks, size, backend) VALUES (?,?,?,?)"),
        span1(db, spanInsertSql(1, true).c_str()),
        spanN(db, spanInsertSql(kSpanBatch, true).c_str()),
        spanN9(db, spanInsertSql(kSpanBatch, false).c_str()),
        collective(db,
                   "INSERT INTO collectives(rank, group_name, seq, op, dtype, shape, numel, bytes, callsite, step, layer,"
                   " phase, thread, enqueue_ns, start_ns, end_ns, state) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
                   " ON CONFLICT(rank, group_name, seq) DO UPDATE SET op = excluded.op, dtype = excluded.dtype,"
                   " shape = excluded.shape, numel = excluded.numel, bytes = excluded.bytes,"
                   " callsite = excluded.callsite, step = excluded.step, layer = excluded.layer,"
                   " phase = excluded.phase, thread = excluded.thread, enqueue_ns = excluded.enqueue_ns,"
                   " start_ns = excluded.start_ns, end_ns = excluded.end_ns, state = excluded.state"),
        grad(db,
             "INSERT INTO grad_stats(rank, step, param, layer, l2_norm, max_abs, nan_count, inf_count, numel)"
             " VALUES (?,?,?,?,?,?,?,?,?)"),
        stepStat(db,
                 "INSERT OR REPLACE INTO step_stats(rank, step, loss, lr, grad_norm, loss_scale, tokens, begin_ns,"
                 " end_ns, skipped) VALUES (?,?,?,?,?,?,?,?,?,?)"),
        alert(db,
              "INSERT INTO alerts(rank, step, ts_ns, severity, kind, layer, param, message, evidence)"
              " VALUES (?,?,?,?,?,?,?,?,?)"),
        counter(db, "INSERT INTO counters(rank, name, ts_ns, value) VALUES (?,?,?,?)"),
        recorder(db,
                 "INSERT INTO recorder_stats(rank, ts_ns, spans_written, spans_dropped, records_written,"
                 " records_dropped, flushes, flush_ns_max, flush_ns_total, probe_overhead_ns)"
                 " VALUES (?,?,?,?,?,?,?,?,?,?)") {}

  bool valid() const {
    for (const Stmt* s : {&internInsert, &internSelect, &meta, &rank, &thread, &group, &span1, &spanN, &spanN9,
                          &collective,
                          &grad, &stepStat, &alert, &counter, &recorder})
      if (!s->valid()) return false;
    return true;
  }

  Stmt internInsert, internSelect, meta, rank, thread, group, span1, spanN, spanN9, collective, grad, stepStat, alert,
      counter, recorder;
  std::unordered_map<std::string, uint32_t> interned;
};

Writer::Writer(std::filesystem::path path, sqlite3* db) : path_(std::move(path)), db_(db) {}

Writer::~Writer() {
  if (db_ != nullptr) (void)close();
}

Result<std::unique_ptr<Writer>> Writer::create(const std::filesystem::path& path, const CreateOptions& options) {
  std::error_code ec;
  const auto parent = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  if (!std::filesystem::is_directory(parent, ec))
    return Status::error(path.string() + ": cannot create the trace file: folder '" + parent.string() +
                         "' does not exist");
  if (::access(parent.c_str(), W_OK) != 0)
    return Status::error(path.string() + ": cannot create the trace file: folder '" + parent.string() +
                         "' is not writable");
  if (std::filesystem::exists(path, ec)) {
    if (!options.overwrite) return Status::error(path.string() + ": cannot create the trace file: it already exists");
    removeWithSidecars(path);
  }

  sqlite3* db = nullptr;
  const int flags =
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE | SQLITE_OPEN_URI;
  if (sqlite3_open_v2(path.c_str(), &db, flags, nullptr) != SQLITE_OK) {
    Status s = detail::sqliteError(db, path, "cannot create the trace file");
    sqlite3_close(db);
    return s;
  }
  // A reader may open the new file the moment it appears (a poll for progress, `tpscope alerts --follow`): setting up
  // WAL and the schema then waits for its shared lock to go, instead of failing with "database is locked".
  sqlite3_busy_timeout(db, 5000);
  std::unique_ptr<Writer> w(new Writer(path, db));
  // A file without its schema and meta is not a trace (a full disk, a size limit): on a failure none is left behind.
  auto abandon = [&](Status s) -> Result<std::unique_ptr<Writer>> {
    w.reset();
    removeWithSidecars(path);
    return s;
  };
  if (Status s = detail::exec(db, path,
                              "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;"
                              " PRAGMA cache_size = -16384; PRAGMA temp_store = MEMORY;"
                              // Checkpoint the WAL every 64 MiB instead of 4 MiB: 5-10% faster ingest.
                              " PRAGMA wal_autocheckpoint = 16384;");
      !s)
    return abandon(s);
  if (Status s = detail::createSchema(db, path); !s) return abandon(s);
  w->stmts_ = std::make_unique<Statements>(db);
  if (!w->stmts_->valid()) return abandon(detail::sqliteError(db, path, "cannot prepare statements"));
  if (Status s = w->setMeta(meta_keys::kRunId, options.runId); !s) return abandon(s);
  if (Status s = w->setMeta(meta_keys::kEpochUnixNs, std::to_string(options.epochUnixNs)); !s) return abandon(s);
  if (Status s = w->setMeta(meta_keys::kSource, options.source); !s) return abandon(s);
  if (Status s = w->setMeta(meta_keys::kTool, tpscope::kToolName); !s) return abandon(s);
  if (Status s = w->commit(); !s) return abandon(s);
  if (options.bulkLoad) {
    if (Status s = detail::exec(db, path,
                                "PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; PRAGMA cache_size = -2000;"
                                " PRAGMA temp_store = FILE");
        !s)
      return abandon(Status::error("cannot configure the file for a bulk load: " + s.message()));
    w->bulkLoad_ = true;
  }
  return w;
}

Status Writer::fail(std::string_view what) { return detail::sqliteError(db_, path_, what); }

Status Writer::begin() {
  if (db_ == nullptr) return Status::error(path_.string() + ": writer is closed");
  if (inTransaction_) return Status::ok();
  if (Status s = detail::exec(db_, path_, "BEGIN"); !s) return s;
  inTransaction_ = true;
  return Status::ok();
}

Status Writer::commit() {
  if (!inTransaction_) return Status::ok();
  inTransaction_ = false;
  if (Status s = detail::exec(db_, path_, "COMMIT"); !s) {
    (void)detail::exec(db_, path_, "ROLLBACK");
    return s;
  }
  return Status::ok();
}

Status Writer::ensureTransaction() { return inTransaction_ ? Status::ok() : begin(); }

Result<uint32_t> Writer::intern(std::string_view value) {
  auto& cache = stmts_->interned;
  if (auto it = cache.find(std::string(value)); it != cache.end()) return it->second;
  if (Status s = ensureTransaction(); !s) return s;
  Stmt& ins = stmts_->internInsert;
  ins.bind(1, value);
  if (Status s = detail::runStmt(ins, db_, path_, "cannot intern a string"); !s) return s;
  uint32_t id = 0;
  if (sqlite3_changes(db_) > 0) {
    id = static_cast<uint32_t>(sqlite3_last_insert_rowid(db_));
  } else {
    Stmt& sel = stmts_->internSelect;
    sel.bind(1, value);
    if (sel.step() != SQLITE_ROW) {
      sel.reset();
      return fail("cannot look up an interned string");
    }
    id = static_cast<uint32_t>(sel.i64(0));
    sel.reset();
  }
  cache.emplace(std::string(value), id);
  return id;
}

Status Writer::setMeta(std::string_view key, std::string_view value) {
  if (Status s = ensureTransaction(); !s) return s;
  Stmt& st = stmts_->meta;
  st.bind(1, key);
  st.bind(2, value);
  return detail::runStmt(st, db_, path_, "cannot write meta");
}

Status Writer::putRank(const RankInfo& r) {
  if (Status s = ensureTransaction(); !s) return s;
  Stmt& st = stmts_->rank;
  st.bind(1, r.rank);
  st.bind(2, r.host);
  st.bind(3, r.pid);
  st.bind(4, r.worldSize);
  st.bind(5, r.localRank);
  st.bind(6, r.tpRank);
  st.bind(7, r.tpSize);
  st.bind(8, r.dpRank);
  st.bind(9, r.dpSize);
  st.bind(10, r.device);
  st.bind(11, r.clockOffsetNs);
  st.bind(12, r.clockUncertaintyNs);
  st.bind(13, r.startNs);
  st.bind(14, r.endNs);
  if (r.exitReason.empty()) st.bindNull(15); else st.bind(15, r.exitReason);
  return detail::runStmt(st, db_, path_, "cannot write table 'ranks'");
}

Status Writer::putThread(const ThreadInfo& t) {
  if (Status s = ensureTransaction(); !s) return s;
  Stmt& st = stmts_->thread;
  st.bind(1, t.rank);
  st.bind(2, t.thread);
  st.bind(3, t.kind);
  st.bind(4, t.name);
  return detail::runStmt(st, db_, path_, "cannot write table 'threads'");
}

Status Writer::putGroup(const GroupInfo& g) {
  if (Status s = ensureTransaction(); !s) return s;
  Stmt& st = stmts_->group;
  st.bind(1, g.name);
  st.bind(2, detail::joinInts(g.ranks));
  st.bind(3, static_cast<int>(g.ranks.size()));
  st.bind(4, g.backend);
  return detail::runStmt(st, db_, path_, "cannot write table 'process_groups'");
}

Status Writer::addSpan(const SpanRow& span) { return addSpans(std::span<const SpanRow>(&span, 1)); }

Status Writer::addSpans(std::span<const SpanRow> spans) {
  if (Status s = ensureTransaction(); !s) return s;
  size_t i = 0;
  for (; i + kSpanBatch <= spans.size(); i += kSpanBatch) {
    bool withCorrelation = false;
    for (int r = 0; r < kSpanBatch; ++r) withCorrelation |= spans[i + r].correlation.has_value();
    Stmt& many = withCorrelation ? stmts_->spanN : stmts_->spanN9;
    const int columns = withCorrelation ? 10 : 9;
    for (int r = 0; r < kSpanBatch; ++r) bindSpan(many, r * columns, spans[i + r], withCorrelation);
    const int rc = many.step();
    sqlite3_reset(many.get());
    if (rc != SQLITE_DONE) return fail("cannot write table 'spans'");
  }
  Stmt& one = stmts_->span1;
  for (; i < spans.size(); ++i) {
    bindSpan(one, 0, spans[i], true);
    const int rc = one.step();
    sqlite3_reset(one.get());
    if (rc != SQLITE_DONE) return fail("cannot write table 'spans'");
  }
  return Status::ok();
}

Status Writer::upsertCollective(const CollectiveRow& c) {
  if (Status s = ensureTransaction(); !s) return s;
  Stmt& st = stmts_->collective;
  st.bind(1, c.rank);
  st.bind(2, c.group);
  st.bind(3, c.seq);
  st.bind(4, c.op);
  st.bind(5, c.dtype);
  st.bind(6, detail::shapeToText(c.shape));
  st.bind(7, c.numel);
  st.bind(8, c.bytes);
  st.bind(9, c.callsite);
  st.bind(10, c.step);
  st.bind(11, c.layer);
  st.bind(12, static_cast<int>(c.phase));
  st.bind(13, c.thread);
  st.bind(14, c.enqueueNs);
  st.bind(15, c.startNs);
  st.bind(16, c.endNs);
  st.bind(17, collectiveStateName(c.state));
  return detail::runStmt(st, db_, path_, "cannot write table 'collectives'");
}

Status Writer::addGradStat(const GradStatRow& g) {
  auto param = intern(g.param);
  if (!param) return param.status();
  Stmt& st = stmts_->grad;
  st.bind(1, g.rank);
  st.bind(2, g.step);
  st.bind(3, static_cast<int64_t>(*param));
  st.bind(4, g.layer);
  st.bind(5, g.l2Norm);
  st.bind(6, g.maxAbs);
  st.bind(7, g.nanCount);
  st.bind(8, g.infCount);
  st.bind(9, g.numel);
  return detail::runStmt(st, db_, path_, "cannot write table 'grad_stats'");
}

Status Writer::putStepStat(const StepStatRow& s) {
  if (Status e = ensureTransaction(); !e) return e;
  Stmt& st = stmts_->stepStat;
  st.bind(1, s.rank);
  st.bind(2, s.step);
  st.bind(3, s.loss);
  st.bind(4, s.lr);
  st.bind(5, s.gradNorm);
  st.bind(6, s.lossScale);
  st.bind(7, s.tokens);
  st.bind(8, s.beginNs);
  st.bind(9, s.endNs);
  st.bind(10, s.skipped ? 1 : 0);
  return detail::runStmt(st, db_, path_, "cannot write table 'step_stats'");
}

Status Writer::addAlert(const AlertRow& a) {
  if (Status s = ensureTransaction(); !s) return s;
  Stmt& st = stmts_->alert;
  st.bind(1, a.rank);
  st.bind(2, a.step);
  st.bind(3, a.tsNs);
  st.bind(4, a.severity);
  st.bind(5, a.kind);
  st.bind(6, a.layer);
  st.bind(7, a.param);
  st.bind(8, a.message);
  st.bind(9, a.evidence.empty() ? std::string_view("{}") : std::string_view(a.evidence));
  return detail::runStmt(st, db_, path_, "cannot write table 'alerts'");
}

Status Writer::addCounter(const CounterRow& c) {
  auto name = intern(c.name);
  if (!name) return name.status();
  Stmt& st = stmts_->counter;
  st.bind(1, c.rank);
  st.bind(2, static_cast<int64_t>(*name));
  st.bind(3, c.tsNs);
  st.bind(4, c.value);
  return detail::runStmt(st, db_, path_, "cannot write table 'counters'");
}

Status Writer::addRecorderStats(const RecorderStatsRow& r) {
  if (Status s = ensureTransaction(); !s) return s;
  Stmt& st = stmts_->recorder;
  st.bind(1, r.rank);
  st.bind(2, r.tsNs);
  st.bind(3, r.spansWritten);
  st.bind(4, r.spansDropped);
  st.bind(5, r.recordsWritten);
  st.bind(6, r.recordsDropped);
  st.bind(7, r.flushes);
  st.bind(8, r.flushNsMax);
  st.bind(9, r.flushNsTotal);
  st.bind(10, r.probeOverheadNs);
  return detail::runStmt(st, db_, path_, "cannot write table 'recorder_stats'");
}

int64_t Writer::lastRowId() const { return sqlite3_last_insert_rowid(db_); }

Status Writer::shiftSpanAndCounterTimes(int64_t deltaNs) {
  if (deltaNs == 0) return Status::ok();
  if (Status s = ensureTransaction(); !s) return s;
  for (const char* sql : {"UPDATE spans SET begin_ns = begin_ns + ?", "UPDATE counters SET ts_ns = ts_ns + ?"}) {
    Stmt st(db_, sql);
    if (!st.valid()) return fail("cannot prepare a time shift");
    st.bind(1, deltaNs);
    if (Status s = detail::runStmt(st, db_, path_, "cannot shift the times of spans and counters"); !s) return s;
  }
  return Status::ok();
}

Status Writer::createIndexes() {
  if (Status s = commit(); !s) return s;
  return detail::createIndexes(db_, path_);
}

Status Writer::close() {
  if (db_ == nullptr) return Status::ok();
  Status s = commit();
  stmts_.reset();
  if (s && bulkLoad_) s = detail::exec(db_, path_, "PRAGMA journal_mode = WAL");
  if (s) s = detail::exec(db_, path_, "PRAGMA wal_checkpoint(TRUNCATE)");
  if (sqlite3_close(db_) != SQLITE_OK && s) s = Status::error(path_.string() + ": cannot close the trace file");
  db_ = nullptr;
  return s;
}

}  // namespace tpscope::tracedb
