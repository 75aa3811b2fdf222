#include "hostile_names.h"

#include <sqlite3.h>

#include <string>

namespace tpscope::testing {

tracedb::Status makeNamesHostile(const std::filesystem::path& run) {
  // Span names stay unique (strings.value is UNIQUE): the id is appended.
  static const char* kSql = R"SQL(
UPDATE strings SET value = '</script><script>document.body.dataset.pwned=1</script>pwn' || id;
UPDATE threads SET name = '<img src=x onerror="document.body.dataset.pwned=2">pwn';
UPDATE ranks SET host = '"><svg onload="document.body.dataset.pwned=3">pwn';
UPDATE collectives SET group_name = '<b onmouseover=alert(1)>tp</b>pwn' WHERE group_name = 'tp-0';
UPDATE process_groups SET name = '<b onmouseover=alert(1)>tp</b>pwn' WHERE name = 'tp-0';
)SQL";
  sqlite3* db = nullptr;
  if (sqlite3_open(run.c_str(), &db) != SQLITE_OK) {
    sqlite3_close(db);
    return tracedb::Status::error(run.string() + ": cannot open");
  }
  char* err = nullptr;
  const int rc = sqlite3_exec(db, kSql, nullptr, nullptr, &err);
  std::string message = err ? err : "";
  sqlite3_free(err);
  sqlite3_close(db);
  if (rc != SQLITE_OK) return tracedb::Status::error(run.string() + ": " + message);
  return tracedb::Status::ok();
}

}  // namespace tpscope::testing
