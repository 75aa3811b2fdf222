// Read-only access to another tool's SQLite file (Nsight Systems' `nsys export --type sqlite`), so that tracedb
// stays the one target that links SQLite. The file is untrusted input: it is opened read-only with SQLite's
// defensive mode, `trusted_schema` off, no extension loading and `query_only`. Nothing SQLite leaks out: tables and
// columns are listed by name, rows are read through ForeignRow.
//
// Errors name the file and what was being read ("<file>: cannot read <what>: <sqlite message>"); a file that is not
// SQLite, is empty or is truncated gives an error here or from the first select, never a crash.
// Threading: one thread at a time per ForeignDb.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tpscope/tracedb/status.h"

struct sqlite3;
struct sqlite3_stmt;

namespace tpscope::tracedb {

// One row of a ForeignDb::select; values are valid until the callback returns. Columns are 0-based.
class ForeignRow {
 public:
  explicit ForeignRow(sqlite3_stmt* stmt) : stmt_(stmt) {}
  bool isNull(int c) const;
  bool isInteger(int c) const;  // stored as an integer (not text, real, blob or NULL)
  int64_t i64(int c) const;
  std::optional<int64_t> optI64(int c) const { return isNull(c) ? std::nullopt : std::optional<int64_t>(i64(c)); }
  std::string_view view(int c) const;  // the raw bytes of a text value (may be invalid UTF-8)

 private:
  sqlite3_stmt* stmt_;
};

class ForeignDb {
 public:
  static Result<std::unique_ptr<ForeignDb>> open(const std::filesystem::path& path);
  ~ForeignDb();
  ForeignDb(const ForeignDb&) = delete;
  ForeignDb& operator=(const ForeignDb&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // The tables of the file (sqlite_master), in no particular order. The first read of the file: a file that is not
  // SQLite fails here.
  Result<std::vector<std::string>> tables();
  // The columns of `table` in their order (PRAGMA table_info); empty if there is no such table.
  Result<std::vector<std::string>> columns(std::string_view table);
  // Runs one SELECT; fn is called per row and returns false to stop.
  Status select(std::string_view sql, std::string_view what, const std::function<bool(const ForeignRow&)>& fn);

 private:
  ForeignDb(std::filesystem::path path, sqlite3* db) : path_(std::move(path)), db_(db) {}
  std::filesystem::path path_;
  sqlite3* db_ = nullptr;
};

}  // namespace tpscope::tracedb
