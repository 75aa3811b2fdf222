// Internal: thin RAII helpers over the SQLite C API shared by the writer, the reader and merge.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::tracedb::detail {

// The connection behind a Reader or Writer, for tracedb's own code (query.cpp, merge.cpp, rank_file.cpp). Public
// headers hand out no SQLite handle.
struct Access {
  static sqlite3* db(Reader& r) { return r.db_; }
  static sqlite3* db(Writer& w) { return w.db_; }
};

// "<file>: <what>: <sqlite message>", with the OS's reason after an I/O error, a full disk or a file that cannot
// be opened ("unable to open database file (Permission denied)"): SQLite's own words do not say which.
Status sqliteError(sqlite3* db, const std::filesystem::path& path, std::string_view what);
// Runs one or more statements without results.
Status exec(sqlite3* db, const std::filesystem::path& path, const char* sql);
// Opens an untrusted file read-only: defensive mode, no schema-borne functions, no extensions, no writes. On failure
// *out is null and the status names the file.
Status openUntrusted(const std::filesystem::path& path, sqlite3** out);
// Opens the trace at `path` for writing and runs `body` in one IMMEDIATE transaction: committed when it returns ok,
// rolled back otherwise. `what` names the writing in the error ("cannot open to write its <what>").
Status writeInTransaction(const std::filesystem::path& path, std::string_view what,
                          const std::function<Status(sqlite3*)>& body);
// A meta value read as an integer; nullopt when absent or not a number.
std::optional<int64_t> metaInt(Reader& reader, const char* key);
// The newest span and collective ids the file holds (0: none): what derived tables (summary.h, lane_summary.h) are
// stamped with, so a reader can tell records added since they were computed.
Status recordStamp(sqlite3* db, const std::filesystem::path& path, int64_t* spans, int64_t* collectives);

// A prepared statement; reset after each step loop. Bind indexes are 1-based.
class Stmt {
 public:
  Stmt() = default;
  Stmt(sqlite3* db, const char* sql);
  ~Stmt();
  Stmt(Stmt&& o) noexcept : stmt_(o.stmt_) { o.stmt_ = nullptr; }
  Stmt& operator=(Stmt&& o) noexcept;
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  bool valid() const { return stmt_ != nullptr; }
  sqlite3_stmt* get() { return stmt_; }

  void bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  void bind(int i, int v) { sqlite3_bind_int64(stmt_, i, v); }
  void bind(int i, double v) { sqlite3_bind_double(stmt_, i, v); }
  void bind(int i, std::string_view v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  void bindNull(int i) { sqlite3_bind_null(stmt_, i); }
  template <class T>
  void bind(int i, const std::optional<T>& v) {
    if (v) bind(i, *v); else bindNull(i);
  }

  // SQLITE_ROW, SQLITE_DONE or an error code.
  int step() { return sqlite3_step(stmt_); }
  void reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }

  int64_t i64(int col) { return sqlite3_column_int64(stmt_, col); }
  int i32(int col) { return sqlite3_column_int(stmt_, col); }
  double f64(int col) { return sqlite3_column_double(stmt_, col); }
  bool isNull(int col) { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  std::string_view view(int col) {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, col));
    return p ? std::string_view(p, static_cast<size_t>(sqlite3_column_bytes(stmt_, col))) : std::string_view();
  }
  std::string text(int col) {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, col));
    return p ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(stmt_, col))) : std::string();
  }
  std::optional<int64_t> optI64(int col) { return isNull(col) ? std::nullopt : std::optional<int64_t>(i64(col)); }
  std::optional<double> optF64(int col) { return isNull(col) ? std::nullopt : std::optional<double>(f64(col)); }

 private:
  sqlite3_stmt* stmt_ = nullptr;
};

// Runs a statement expected to finish (INSERT/UPDATE) and resets it.
Status runStmt(Stmt& stmt, sqlite3* db, const std::filesystem::path& path, std::string_view what);

std::string joinInts(const std::vector<int>& v);          // "0,1,2"
std::vector<int> splitInts(std::string_view s);           // "0,1,2" → {0,1,2}; bad items skipped
std::string shapeToText(const std::vector<int64_t>& v);   // "[4,128,256]"
std::vector<int64_t> shapeFromText(std::string_view s);

}  // namespace tpscope::tracedb::detail
