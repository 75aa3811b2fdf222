#include "sql_query.h"

namespace tpscope::analysis::detail {

Query::Query(tracedb::Reader& reader, std::string_view sql, std::string_view what) : reader_(reader), what_(what) {
  if (sqlite3_prepare_v2(reader.handle(), sql.data(), static_cast<int>(sql.size()), &stmt_, nullptr) != SQLITE_OK) {
    sqlite3_finalize(stmt_);
    stmt_ = nullptr;
  }
}

Query::~Query() { sqlite3_finalize(stmt_); }

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

std::string Query::text(int c) const { return std::string(view(c)); }

std::string_view Query::view(int c) const {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, c));
  return p ? std::string_view(p, static_cast<size_t>(sqlite3_column_bytes(stmt_, c))) : std::string_view();
}

tracedb::Status Query::error() const { return reader_.error("cannot read " + what_); }

void preferMemoryMap(tracedb::Reader& reader) {
  sqlite3_exec(reader.handle(), "PRAGMA mmap_size = 68719476736", nullptr, nullptr, nullptr);
}

bool hasIndex(tracedb::Reader& reader, std::string_view index) {
  Query q(reader, "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = ?", "the schema");
  q.bind(1, index);
  int64_t n = 0;
  (void)q.each([&](Query& r) { n = r.i64(0); });
  return n > 0;
}

}  // namespace tpscope::analysis::detail
