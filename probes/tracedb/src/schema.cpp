#include "schema.h"

#include <algorithm>
#include <string>

#include "schema_sql.h"
#include "sqlite_util.h"
#include "tpscope/tracedb/records.h"

namespace tpscope::tracedb::detail {

Status createSchema(sqlite3* db, const std::filesystem::path& path) {
  std::string sql = "BEGIN;";
  sql += kSchemaSql;
  sql += "INSERT INTO meta(key, value) VALUES ('format', '";
  sql += kFormatName;
  sql += "');PRAGMA user_version = " + std::to_string(kFormatVersion) + ";COMMIT;";
  return exec(db, path, sql.c_str());
}

Status createIndexes(sqlite3* db, const std::filesystem::path& path) { return exec(db, path, kIndexesSql); }

Status createIndexes(sqlite3* db, const std::filesystem::path& path, std::span<const std::string_view> names) {
  const std::string_view all = kIndexesSql;
  constexpr std::string_view kCreate = "CREATE INDEX IF NOT EXISTS ";
  for (size_t at = all.find(kCreate); at != std::string_view::npos; at = all.find(kCreate, at + 1)) {
    const std::string_view statement = all.substr(at, all.find(';', at) - at);
    const std::string_view name = statement.substr(kCreate.size(), statement.find(' ', kCreate.size()) - kCreate.size());
    if (std::find(names.begin(), names.end(), name) == names.end()) continue;
    if (Status s = exec(db, path, std::string(statement).c_str()); !s) return s;
  }
  return Status::ok();
}

Result<int> checkSchema(sqlite3* db, const std::filesystem::path& path) {
  Stmt version(db, "PRAGMA user_version");
  if (!version.valid()) return sqliteError(db, path, "cannot read the file as SQLite");
  const int rc = version.step();
  if (rc != SQLITE_ROW) return sqliteError(db, path, "cannot read the file as SQLite");
  const int userVersion = version.i32(0);

  Stmt hasMeta(db, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'");
  if (!hasMeta.valid() || hasMeta.step() != SQLITE_ROW) return sqliteError(db, path, "cannot read the schema");
  if (hasMeta.i64(0) == 0) return Status::error(path.string() + ": not a tpscope trace (it has no 'meta' table)");

  Stmt format(db, "SELECT value FROM meta WHERE key = 'format'");
  if (!format.valid()) return sqliteError(db, path, "cannot read table 'meta'");
  const int frc = format.step();
  if (frc != SQLITE_ROW && frc != SQLITE_DONE) return sqliteError(db, path, "cannot read table 'meta'");
  const std::string name = frc == SQLITE_ROW ? format.text(0) : std::string();
  if (name != kFormatName)
    return Status::error(path.string() + ": not a tpscope trace (meta 'format' is '" + name + "', expected '" +
                         std::string(kFormatName) + "')");
  if (userVersion > kFormatVersion)
    return Status::error(path.string() + ": written by a newer tpscope (trace format version " +
                         std::to_string(userVersion) + "; this build reads versions up to " +
                         std::to_string(kFormatVersion) + ")");
  if (userVersion < 1)
    return Status::error(path.string() + ": not a valid tpscope trace (format version " +
                         std::to_string(userVersion) + ")");
  return userVersion;
}

}  // namespace tpscope::tracedb::detail
