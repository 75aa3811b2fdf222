#include "tpscope/tracedb/query.h"

#include <sqlite3.h>

#include <cctype>

#include "sqlite_util.h"

namespace tpscope::tracedb {

namespace {
int denyAttach(void*, int action, const char*, const char*, const char*, const char*) {
  return action == SQLITE_ATTACH || action == SQLITE_DETACH ? SQLITE_DENY : SQLITE_OK;
}
}  // namespace

Query::Query(Reader& reader, std::string_view sql, std::string_view what) : reader_(&reader), what_(what) {
  sqlite3* db = detail::Access::db(reader);
  if (sqlite3_prepare_v2(db, sql.data(), static_cast<int>(sql.size()), &stmt_, nullptr) != SQLITE_OK) {
    sqlite3_finalize(stmt_);
    stmt_ = nullptr;
  }
}

Query::~Query() { sqlite3_finalize(stmt_); }

Query::Query(Query&& other) noexcept : reader_(other.reader_), what_(std::move(other.what_)), stmt_(other.stmt_) {
  other.stmt_ = nullptr;
}

Result<Query> Query::readOnly(Reader& reader, std::string_view sql) {
  sqlite3* db = detail::Access::db(reader);
  const std::string file = reader.path().string();
  Query q(reader, std::string());
  const char* tail = nullptr;
  // The authorizer is consulted while a statement compiles: set for the prepare only.
  sqlite3_set_authorizer(db, denyAttach, nullptr);
  const int rc = sqlite3_prepare_v2(db, sql.data(), static_cast<int>(sql.size()), &q.stmt_, &tail);
  sqlite3_set_authorizer(db, nullptr, nullptr);
  if (rc != SQLITE_OK || q.stmt_ == nullptr) {
    const int code = sqlite3_errcode(db);
    return Status::error(file + ": " +
                         (code == SQLITE_AUTH ? std::string("refused: ATTACH and DETACH of other files are not allowed")
                          : code == SQLITE_OK ? std::string("the query is empty")
                                              : std::string(sqlite3_errmsg(db))));
  }
  for (const char* p = tail; p != nullptr && p < sql.data() + sql.size(); ++p)
    if (!std::isspace(static_cast<unsigned char>(*p)) && *p != ';')
      return Status::error("only one statement is allowed; remove what follows the first ';'");
  if (!sqlite3_stmt_readonly(q.stmt_))
    return Status::error("refused: the statement would modify " + file +
                         "; tpscope sql runs read-only queries only (SELECT, WITH, EXPLAIN, read-only PRAGMA)");
  return Result<Query>(std::move(q));
}

Query& Query::bind(int i, int64_t v) {
  if (stmt_) sqlite3_bind_int64(stmt_, i, v);
  return *this;
}
Query& Query::bind(int i, std::string_view v) {
  if (stmt_) sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  return *this;
}
Query& Query::bind(int i, double v) {
  if (stmt_) sqlite3_bind_double(stmt_, i, v);
  return *this;
}

bool Query::next(Status& failed) {
  if (stmt_ == nullptr) {
    failed = error();
    return false;
  }
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc != SQLITE_DONE) failed = error();
  return false;
}

void Query::rewind() {
  if (stmt_) sqlite3_reset(stmt_);
}

int Query::columnCount() const { return sqlite3_column_count(stmt_); }
std::string Query::columnName(int c) const {
  const char* n = sqlite3_column_name(stmt_, c);
  return n ? n : "";
}
ColumnType Query::type(int c) const {
  switch (sqlite3_column_type(stmt_, c)) {
    case SQLITE_INTEGER: return ColumnType::Integer;
    case SQLITE_FLOAT: return ColumnType::Float;
    case SQLITE_BLOB: return ColumnType::Blob;
    case SQLITE_NULL: return ColumnType::Null;
    default: return ColumnType::Text;
  }
}
int64_t Query::i64(int c) const { return sqlite3_column_int64(stmt_, c); }
int Query::i32(int c) const { return sqlite3_column_int(stmt_, c); }
double Query::f64(int c) const { return sqlite3_column_double(stmt_, c); }
std::string_view Query::view(int c) const {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, c));
  return p ? std::string_view(p, static_cast<size_t>(sqlite3_column_bytes(stmt_, c))) : std::string_view();
}
int64_t Query::bytes(int c) const { return sqlite3_column_bytes(stmt_, c); }

Status Query::error() const {
  sqlite3* db = detail::Access::db(*reader_);
  if (what_.empty()) return Status::error(reader_->path().string() + ": " + sqlite3_errmsg(db));
  return detail::sqliteError(db, reader_->path(), "cannot read " + what_);
}

}  // namespace tpscope::tracedb
