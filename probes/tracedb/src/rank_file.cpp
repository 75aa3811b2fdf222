#include "tpscope/tracedb/rank_file.h"

#include <sqlite3.h>

#include <functional>
#include <initializer_list>

#include "sqlite_util.h"
#include "tpscope/tracedb/records.h"

namespace tpscope::tracedb {

namespace {
// Opens `file` (which must be a trace), runs `edit` in one transaction, commits or rolls back, closes.
Status editTrace(const std::filesystem::path& file, const std::function<Status(sqlite3*)>& edit) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(file.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_EXRESCODE, nullptr) != SQLITE_OK) {
    Status s = detail::sqliteError(db, file, "cannot open");
    sqlite3_close(db);
    return s;
  }
  sqlite3_busy_timeout(db, 2000);
  Status s = detail::exec(db, file, "BEGIN");
  if (s) {
    s = edit(db);
    (void)detail::exec(db, file, s ? "COMMIT" : "ROLLBACK");
  }
  sqlite3_close(db);
  return s;
}

Status run(sqlite3* db, const std::filesystem::path& file, const char* sql,
           std::initializer_list<std::string_view> values, std::string_view what) {
  detail::Stmt st(db, sql);
  if (!st.valid()) return detail::sqliteError(db, file, what);
  int i = 0;
  for (std::string_view v : values) st.bind(++i, v);
  return detail::runStmt(st, db, file, what);
}

constexpr const char* kPutMeta = "INSERT OR REPLACE INTO meta(key, value) VALUES(?1, ?2)";
}  // namespace

Status markRankExit(const std::filesystem::path& file, std::string_view exitReason, std::string_view exitStatus) {
  return editTrace(file, [&](sqlite3* db) {
    constexpr std::string_view kWhat = "cannot record the rank's exit";
    if (Status s = run(db, file, "UPDATE ranks SET exit_reason = ?1", {exitReason}, kWhat); !s) return s;
    return run(db, file, kPutMeta, {meta_keys::kCaptureExit, exitStatus}, kWhat);
  });
}

Status addMeta(const std::filesystem::path& file, std::span<const std::pair<std::string, std::string>> keyValues) {
  return editTrace(file, [&](sqlite3* db) {
    for (const auto& [key, value] : keyValues)
      if (Status s = run(db, file, kPutMeta, {key, value}, "cannot write meta"); !s) return s;
    return Status::ok();
  });
}

Status addAlerts(const std::filesystem::path& file, std::span<const AlertRow> alerts) {
  if (alerts.empty()) return Status::ok();
  return editTrace(file, [&](sqlite3* db) {
    constexpr std::string_view kWhat = "cannot write an alert";
    for (const AlertRow& a : alerts) {
      detail::Stmt st(db,
                      "INSERT INTO alerts(rank, step, ts_ns, severity, kind, layer, param, message, evidence)"
                      " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)");
      if (!st.valid()) return detail::sqliteError(db, file, kWhat);
      st.bind(1, int64_t{a.rank});
      st.bind(2, int64_t{a.step});
      st.bind(3, a.tsNs);
      st.bind(4, std::string_view(a.severity));
      st.bind(5, std::string_view(a.kind));
      st.bind(6, int64_t{a.layer});
      st.bind(7, std::string_view(a.param));
      st.bind(8, std::string_view(a.message));
      st.bind(9, std::string_view(a.evidence));
      if (Status s = detail::runStmt(st, db, file, kWhat); !s) return s;
    }
    return Status::ok();
  });
}

}  // namespace tpscope::tracedb
