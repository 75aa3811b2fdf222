#include "sqlite_util.h"

#include <charconv>
#include <cstring>
#include <vector>

namespace tpscope::tracedb::detail {

namespace {
// " (No space left on device)" after an error the OS caused; "" otherwise. SQLite often keeps no errno for a failed
// write (EFBIG, EIO): that one is named as what it most likely is.
std::string osReason(sqlite3* db) {
  const int code = sqlite3_extended_errcode(db);
  const int primary = code & 0xff;
  if (primary != SQLITE_IOERR && primary != SQLITE_FULL && primary != SQLITE_CANTOPEN) return {};
  if (const int err = sqlite3_system_errno(db); err != 0) return std::string(" (") + std::strerror(err) + ")";
  if (code == SQLITE_IOERR_WRITE) return " (a write failed: the disk may be full or a file size limit reached)";
  return {};
}
}  // namespace

Status sqliteError(sqlite3* db, const std::filesystem::path& path, std::string_view what) {
  std::string msg = path.string();
  msg += ": ";
  msg += what;
  if (db != nullptr) {
    msg += ": ";
    msg += sqlite3_errmsg(db);
    msg += osReason(db);
  }
  return Status::error(std::move(msg));
}

Status openUntrusted(const std::filesystem::path& path, sqlite3** out) {
  *out = nullptr;
  sqlite3* db = nullptr;
  const int flags = SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE;
  if (sqlite3_open_v2(path.c_str(), &db, flags, nullptr) != SQLITE_OK) {
    Status s = sqliteError(db, path, "cannot open");
    sqlite3_close(db);
    return s;
  }
  sqlite3_db_config(db, SQLITE_DBCONFIG_DEFENSIVE, 1, nullptr);
  sqlite3_db_config(db, SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0, nullptr);
  sqlite3_db_config(db, SQLITE_DBCONFIG_ENABLE_LOAD_EXTENSION, 0, nullptr);
  (void)exec(db, path, "PRAGMA query_only = 1");
  *out = db;
  return Status::ok();
}

Status exec(sqlite3* db, const std::filesystem::path& path, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = path.string() + ": " + (err ? err : "SQL error") + osReason(db);
    sqlite3_free(err);
    return Status::error(std::move(msg));
  }
  return Status::ok();
}

Stmt::Stmt(sqlite3* db, const char* sql) {
  if (sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt_, nullptr) != SQLITE_OK) stmt_ = nullptr;
}

Stmt::~Stmt() { sqlite3_finalize(stmt_); }

Stmt& Stmt::operator=(Stmt&& o) noexcept {
  if (this != &o) {
    sqlite3_finalize(stmt_);
    stmt_ = o.stmt_;
    o.stmt_ = nullptr;
  }
  return *this;
}

Status runStmt(Stmt& stmt, sqlite3* db, const std::filesystem::path& path, std::string_view what) {
  const int rc = stmt.step();
  stmt.reset();
  if (rc != SQLITE_DONE && rc != SQLITE_ROW) return sqliteError(db, path, what);
  return Status::ok();
}

std::string joinInts(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(v[i]);
  }
  return out;
}

namespace {
template <class T>
std::vector<T> parseList(std::string_view s) {
  std::vector<T> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ',' || s[i] == ' ' || s[i] == '[' || s[i] == ']')) ++i;
    size_t j = i;
    while (j < s.size() && s[j] != ',' && s[j] != ']' && s[j] != ' ') ++j;
    if (j > i) {
      T v{};
      auto [p, ec] = std::from_chars(s.data() + i, s.data() + j, v);
      if (ec == std::errc() && p == s.data() + j) out.push_back(v);
    }
    i = j;
  }
  return out;
}
}  // namespace

std::vector<int> splitInts(std::string_view s) { return parseList<int>(s); }

std::string shapeToText(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(v[i]);
  }
  return out + "]";
}

std::vector<int64_t> shapeFromText(std::string_view s) { return parseList<int64_t>(s); }

Status writeInTransaction(const std::filesystem::path& path, std::string_view what,
                          const std::function<Status(sqlite3*)>& body) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    Status s = sqliteError(db, path, "cannot open to write its " + std::string(what));
    sqlite3_close(db);
    return s;
  }
  sqlite3_busy_timeout(db, 2000);
  Status s = exec(db, path, "BEGIN IMMEDIATE");
  if (s) s = body(db);
  if (s) s = exec(db, path, "COMMIT");
  else (void)exec(db, path, "ROLLBACK");
  sqlite3_close(db);
  return s;
}

std::optional<int64_t> metaInt(Reader& reader, const char* key) {
  auto v = reader.metaValue(key);
  if (!v) return std::nullopt;
  try {
    return std::stoll(*v);
  } catch (...) {
    return std::nullopt;
  }
}

Status recordStamp(sqlite3* db, const std::filesystem::path& path, int64_t* spans, int64_t* collectives) {
  Stmt st(db, "SELECT (SELECT coalesce(max(id), 0) FROM spans), (SELECT coalesce(max(id), 0) FROM collectives)");
  if (!st.valid() || st.step() != SQLITE_ROW) return sqliteError(db, path, "cannot read the record ids");
  *spans = st.i64(0);
  *collectives = st.i64(1);
  return Status::ok();
}

}  // namespace tpscope::tracedb::detail
