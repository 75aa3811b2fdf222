#include "tpscope/tracedb/summary.h"

#include <sqlite3.h>

#include <string>

#include "sqlite_util.h"

namespace tpscope::tracedb {

namespace {

constexpr const char* kVersionKey = "summary.version";
constexpr const char* kSpanKey = "summary.span_max_id";
constexpr const char* kCollectiveKey = "summary.collective_max_id";

constexpr const char* kSchema = R"SQL(
DROP TABLE IF EXISTS rank_summary;
DROP TABLE IF EXISTS step_summary;
DROP TABLE IF EXISTS phase_summary;
CREATE TABLE rank_summary(
  rank          INTEGER PRIMARY KEY,
  lanes         TEXT NOT NULL,
  window_source TEXT NOT NULL
);
CREATE TABLE step_summary(
  rank                INTEGER NOT NULL,
  step                INTEGER NOT NULL,
  begin_ns            INTEGER NOT NULL,
  end_ns              INTEGER NOT NULL,
  step_ns             INTEGER NOT NULL,
  compute_ns          INTEGER NOT NULL,
  comm_ns             INTEGER NOT NULL,
  exposed_comm_ns     INTEGER NOT NULL,
  other_ns            INTEGER NOT NULL,
  idle_ns             INTEGER NOT NULL,
  memcpy_ns           INTEGER NOT NULL,
  idle_host_wait_ns   INTEGER NOT NULL,
  idle_kernel_wait_ns INTEGER NOT NULL,
  idle_other_ns       INTEGER NOT NULL,
  PRIMARY KEY(rank, step)
) WITHOUT ROWID;
CREATE TABLE phase_summary(
  rank    INTEGER NOT NULL,
  kind    INTEGER NOT NULL,
  phase   INTEGER NOT NULL,
  busy_ns INTEGER NOT NULL,
  PRIMARY KEY(rank, kind, phase)
) WITHOUT ROWID;
)SQL";

Status fill(sqlite3* db, const std::filesystem::path& path, const RunSummary& s) {
  {
    detail::Stmt st(db, "INSERT INTO rank_summary VALUES (?, ?, ?)");
    for (const auto& r : s.ranks) {
      st.bind(1, r.rank);
      st.bind(2, std::string_view(r.lanes));
      st.bind(3, std::string_view(r.windowSource));
      if (st.step() != SQLITE_DONE) return detail::sqliteError(db, path, "cannot write rank_summary");
      st.reset();
    }
  }
  {
    detail::Stmt st(db, "INSERT INTO step_summary VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    for (const auto& r : s.steps) {
      const int64_t v[] = {r.beginNs, r.endNs,   r.stepNs,   r.computeNs,      r.commNs,           r.exposedCommNs,
                           r.otherNs, r.idleNs,  r.memcpyNs, r.idleHostWaitNs, r.idleKernelWaitNs, r.idleOtherNs};
      st.bind(1, r.rank);
      st.bind(2, r.step);
      for (int i = 0; i < 12; ++i) st.bind(3 + i, v[i]);
      if (st.step() != SQLITE_DONE) return detail::sqliteError(db, path, "cannot write step_summary");
      st.reset();
    }
  }
  {
    detail::Stmt st(db, "INSERT INTO phase_summary VALUES (?, ?, ?, ?)");
    for (const auto& r : s.phases) {
      st.bind(1, r.rank);
      st.bind(2, r.kind);
      st.bind(3, r.phase);
      st.bind(4, r.busyNs);
      if (st.step() != SQLITE_DONE) return detail::sqliteError(db, path, "cannot write phase_summary");
      st.reset();
    }
  }
  int64_t spans = 0, collectives = 0;
  if (Status st = detail::recordStamp(db, path, &spans, &collectives); !st) return st;
  detail::Stmt meta(db, "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)");
  const std::pair<const char*, std::string> stamps[] = {
      {kVersionKey, std::to_string(s.version)}, {kSpanKey, std::to_string(spans)},
      {kCollectiveKey, std::to_string(collectives)}};
  for (const auto& [key, value] : stamps) {
    meta.bind(1, std::string_view(key));
    meta.bind(2, std::string_view(value));
    if (meta.step() != SQLITE_DONE) return detail::sqliteError(db, path, "cannot write meta");
    meta.reset();
  }
  return Status::ok();
}

}  // namespace

Status writeSummary(const std::filesystem::path& path, const RunSummary& summary) {
  return detail::writeInTransaction(path, "summaries", [&](sqlite3* db) {
    Status s = detail::exec(db, path, kSchema);
    return s ? fill(db, path, summary) : s;
  });
}

Result<std::optional<RunSummary>> readSummary(Reader& reader, int version) {
  sqlite3* db = detail::Access::db(reader);
  const auto stamp = [&](const char* key) { return detail::metaInt(reader, key); };
  const auto v = stamp(kVersionKey), spanStamp = stamp(kSpanKey), collStamp = stamp(kCollectiveKey);
  if (!v || *v != version || !spanStamp || !collStamp) return std::optional<RunSummary>();
  int64_t spans = 0, collectives = 0;
  if (Status s = detail::recordStamp(db, reader.path(), &spans, &collectives); !s) return s;
  if (spans != *spanStamp || collectives != *collStamp) return std::optional<RunSummary>();  // records changed since

  RunSummary out;
  out.version = version;
  {
    detail::Stmt st(db, "SELECT rank, lanes, window_source FROM rank_summary ORDER BY rank");
    if (!st.valid()) return std::optional<RunSummary>();  // stamped but no tables: compute instead
    int rc;
    while ((rc = st.step()) == SQLITE_ROW) out.ranks.push_back({st.i32(0), st.text(1), st.text(2)});
    if (rc != SQLITE_DONE) return detail::sqliteError(db, reader.path(), "cannot read rank_summary");
  }
  {
    detail::Stmt st(db,
                    "SELECT rank, step, begin_ns, end_ns, step_ns, compute_ns, comm_ns, exposed_comm_ns, other_ns, "
                    "idle_ns, memcpy_ns, idle_host_wait_ns, idle_kernel_wait_ns, idle_other_ns FROM step_summary "
                    "ORDER BY rank, step");
    if (!st.valid()) return std::optional<RunSummary>();
    int rc;
    while ((rc = st.step()) == SQLITE_ROW) {
      StepSummaryRow r;
      r.rank = st.i32(0);
      r.step = st.i32(1);
      int64_t* v[] = {&r.beginNs, &r.endNs,  &r.stepNs,   &r.computeNs,      &r.commNs,           &r.exposedCommNs,
                      &r.otherNs, &r.idleNs, &r.memcpyNs, &r.idleHostWaitNs, &r.idleKernelWaitNs, &r.idleOtherNs};
      for (int i = 0; i < 12; ++i) *v[i] = st.i64(2 + i);
      out.steps.push_back(r);
    }
    if (rc != SQLITE_DONE) return detail::sqliteError(db, reader.path(), "cannot read step_summary");
  }
  {
    detail::Stmt st(db, "SELECT rank, kind, phase, busy_ns FROM phase_summary ORDER BY rank, kind, phase");
    if (!st.valid()) return std::optional<RunSummary>();
    int rc;
    while ((rc = st.step()) == SQLITE_ROW) out.phases.push_back({st.i32(0), st.i32(1), st.i32(2), st.i64(3)});
    if (rc != SQLITE_DONE) return detail::sqliteError(db, reader.path(), "cannot read phase_summary");
  }
  return std::optional<RunSummary>(std::move(out));
}

}  // namespace tpscope::tracedb
