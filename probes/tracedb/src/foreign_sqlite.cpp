#include "tpscope/tracedb/foreign_sqlite.h"

#include <sqlite3.h>

#include "sqlite_util.h"

namespace tpscope::tracedb {

bool ForeignRow::isNull(int c) const { return sqlite3_column_type(stmt_, c) == SQLITE_NULL; }

bool ForeignRow::isInteger(int c) const { return sqlite3_column_type(stmt_, c) == SQLITE_INTEGER; }

int64_t ForeignRow::i64(int c) const { return sqlite3_column_int64(stmt_, c); }

std::string_view ForeignRow::view(int c) const {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, c));
  return p ? std::string_view(p, static_cast<size_t>(sqlite3_column_bytes(stmt_, c))) : std::string_view();
}

Result<std::unique_ptr<ForeignDb>> ForeignDb::open(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return Status::error(path.string() + ": no such file");
  if (std::filesystem::file_size(path, ec) == 0 || ec)
    return Status::error(path.string() + ": the file is empty (not an SQLite database)");
  sqlite3* db = nullptr;
  if (Status s = detail::openUntrusted(path, &db); !s) return s;
  return std::unique_ptr<ForeignDb>(new ForeignDb(path, db));
}

ForeignDb::~ForeignDb() { sqlite3_close(db_); }

Status ForeignDb::select(std::string_view sql, std::string_view what,
                         const std::function<bool(const ForeignRow&)>& fn) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &stmt, nullptr) != SQLITE_OK) {
    sqlite3_finalize(stmt);
    return detail::sqliteError(db_, path_, "cannot read " + std::string(what));
  }
  ForeignRow row(stmt);
  int rc = SQLITE_ROW;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW)
    if (!fn(row)) {
      rc = SQLITE_DONE;
      break;
    }
  Status s = rc == SQLITE_DONE ? Status::ok() : detail::sqliteError(db_, path_, "cannot read " + std::string(what));
  sqlite3_finalize(stmt);
  return s;
}

Result<std::vector<std::string>> ForeignDb::tables() {
  std::vector<std::string> out;
  Status s = select("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')", "its list of tables",
                    [&](const ForeignRow& r) {
                      out.emplace_back(r.view(0));
                      return true;
                    });
  if (!s) return s;
  return out;
}

Result<std::vector<std::string>> ForeignDb::columns(std::string_view table) {
  std::string sql = "SELECT name FROM pragma_table_info('";
  for (char c : table) {
    if (c == '\'') sql += '\'';
    sql += c;
  }
  sql += "') ORDER BY cid";
  std::vector<std::string> out;
  Status s = select(sql, "the columns of table " + std::string(table), [&](const ForeignRow& r) {
    out.emplace_back(r.view(0));
    return true;
  });
  if (!s) return s;
  return out;
}

}  // namespace tpscope::tracedb
