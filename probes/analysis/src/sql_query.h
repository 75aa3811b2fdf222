// Internal: a prepared statement on a Reader's read-only connection, with errors that name the file.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis::detail {

class Query {
 public:
  Query(tracedb::Reader& reader, std::string_view sql, std::string_view what);
  ~Query();
  Query(const Query&) = delete;
  Query& operator=(const Query&) = delete;

  Query& bind(int i, int64_t v);
  Query& bind(int i, std::string_view v);
  Query& bind(int i, double v);

  // Calls fn(*this) for each row; fn returns void or bool (false stops). Errors name the file and `what`.
  template <class Fn>
  tracedb::Status each(Fn&& fn) {
    if (stmt_ == nullptr) return error();
    int rc;
    while ((rc = sqlite3_step(stmt_)) == SQLITE_ROW) {
      if constexpr (std::is_same_v<decltype(fn(*this)), bool>) {
        if (!fn(*this)) break;
      } else {
        fn(*this);
      }
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return error();
    sqlite3_reset(stmt_);
    return tracedb::Status::ok();
  }

  int64_t i64(int c) const { return sqlite3_column_int64(stmt_, c); }
  int i32(int c) const { return sqlite3_column_int(stmt_, c); }
  double f64(int c) const { return sqlite3_column_double(stmt_, c); }
  bool isNull(int c) const { return sqlite3_column_type(stmt_, c) == SQLITE_NULL; }
  std::optional<int64_t> optI64(int c) const { return isNull(c) ? std::nullopt : std::optional<int64_t>(i64(c)); }
  std::optional<double> optF64(int c) const { return isNull(c) ? std::nullopt : std::optional<double>(f64(c)); }
  std::string text(int c) const;
  std::string_view view(int c) const;

 private:
  tracedb::Status error() const;
  tracedb::Reader& reader_;
  std::string what_;
  sqlite3_stmt* stmt_ = nullptr;
};

// Lets SQLite read the file through a memory map (no copy per page read) on this read-only connection. Large
// scans are ~10 % cheaper. Harmless where mmap is unavailable (SQLite falls back to read()).
void preferMemoryMap(tracedb::Reader& reader);

// True when the table exists and the named index exists (the query indexes of indexes.sql).
bool hasIndex(tracedb::Reader& reader, std::string_view index);

}  // namespace tpscope::analysis::detail
