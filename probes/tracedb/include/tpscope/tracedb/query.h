// A prepared SQL statement on a Reader's read-only connection: the one statement wrapper outside tracedb's own
// typed reads. The analyses and the capture poller run their own SELECTs through it; nothing outside tracedb sees an
// SQLite type.
//
// Errors name the file and what was being read: "<file>: cannot read <what>: <sqlite message>". A statement that
// does not compile is reported by the first each() (not by the constructor), so a call site has one error path.
// Bind indexes are 1-based; columns 0-based. Column values are valid until the next row (view() points into SQLite's
// buffer). Threading: as the Reader it was made from (one thread at a time).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

struct sqlite3_stmt;

namespace tpscope::tracedb {

enum class ColumnType : uint8_t { Integer, Float, Text, Blob, Null };

class Query {
 public:
  Query(Reader& reader, std::string_view sql, std::string_view what);
  ~Query();
  Query(Query&& other) noexcept;
  Query& operator=(Query&&) = delete;
  Query(const Query&) = delete;
  Query& operator=(const Query&) = delete;

  // One statement that `tpscope sql` may run for a user: read-only (SQLite's own judgement, before it runs), single
  // (only whitespace and ';' may follow it), and without ATTACH/DETACH of other files. Refusals say why in words a
  // user acts on; errors while stepping read "<file>: <sqlite message>".
  static Result<Query> readOnly(Reader& reader, std::string_view sql);

  Query& bind(int i, int64_t v);
  Query& bind(int i, std::string_view v);
  Query& bind(int i, double v);

  // Calls fn(*this) for each row; fn returns void or bool (false stops). The statement is reset afterwards and can be
  // bound and run again.
  template <class Fn>
  Status each(Fn&& fn) {
    Status failed;
    while (next(failed)) {
      if constexpr (std::is_same_v<decltype(fn(*this)), bool>) {
        if (!fn(*this)) break;
      } else {
        fn(*this);
      }
    }
    rewind();
    return failed;
  }

  int columnCount() const;
  std::string columnName(int c) const;
  ColumnType type(int c) const;
  int64_t i64(int c) const;
  int i32(int c) const;
  double f64(int c) const;
  bool isNull(int c) const { return type(c) == ColumnType::Null; }
  std::optional<int64_t> optI64(int c) const { return isNull(c) ? std::nullopt : std::optional<int64_t>(i64(c)); }
  std::optional<double> optF64(int c) const { return isNull(c) ? std::nullopt : std::optional<double>(f64(c)); }
  std::string text(int c) const { return std::string(view(c)); }
  std::string_view view(int c) const;
  int64_t bytes(int c) const;  // of a text or blob value

 private:
  Query(Reader& reader, std::string what) : reader_(&reader), what_(std::move(what)) {}
  // Steps to the next row: true on a row; false when done or failed (then `failed` holds the error).
  bool next(Status& failed);
  void rewind();
  Status error() const;

  Reader* reader_;
  std::string what_;  // "" for readOnly(): errors are "<file>: <sqlite message>"
  sqlite3_stmt* stmt_ = nullptr;
};

}  // namespace tpscope::tracedb
