// tpscope sql RUN "SELECT ..." [--json | --tsv] [--limit N]: one read-only SQL statement over the run file.
// Writes are refused before anything runs: the statement must be read-only (sqlite3_stmt_readonly), single, and
// may not ATTACH other files; the connection is read-only and query_only besides.
#include <sqlite3.h>

#include <nlohmann/json.hpp>

#include <cctype>
#include <iostream>

#include "command.h"
#include "text.h"

namespace tpscope::cli {
namespace {

struct SqlArgs {
  std::filesystem::path run;
  std::string query;
  bool json = false;
  bool tsv = false;
  int64_t limit = 1000;
};

int denyAttach(void*, int action, const char*, const char*, const char*, const char*) {
  return action == SQLITE_ATTACH || action == SQLITE_DETACH ? SQLITE_DENY : SQLITE_OK;
}

std::string cellText(sqlite3_stmt* st, int c) {
  switch (sqlite3_column_type(st, c)) {
    case SQLITE_NULL: return "NULL";
    case SQLITE_BLOB: return "<blob " + std::to_string(sqlite3_column_bytes(st, c)) + " bytes>";
    default: {
      const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(st, c));
      return p ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(st, c))) : std::string();
    }
  }
}

nlohmann::ordered_json cellJson(sqlite3_stmt* st, int c) {
  switch (sqlite3_column_type(st, c)) {
    case SQLITE_NULL: return nullptr;
    case SQLITE_INTEGER: return sqlite3_column_int64(st, c);
    case SQLITE_FLOAT: return sqlite3_column_double(st, c);
    default: return cellText(st, c);
  }
}

void addSql(CLI::App& app, Context& ctx) {
  auto args = std::make_shared<SqlArgs>();
  auto* cmd = app.add_subcommand("sql", "Run one read-only SQL query over a run file (tables in docs/schema.md)");
  cmd->add_option("run", args->run, "Run file")->required();
  cmd->add_option("query", args->query, "One SELECT (or WITH/EXPLAIN/read-only PRAGMA) statement")->required();
  auto* json = cmd->add_flag("--json", args->json, "Print a JSON list of row objects");
  cmd->add_flag("--tsv", args->tsv, "Print tab-separated values with a header line (streamed, no row limit)")
      ->excludes(json);
  cmd->add_option("--limit", args->limit, "At most this many rows in the table output (default 1000; 0: no limit)");
  cmd->callback([args, &ctx]() {
    auto reader = openRun(args->run);
    if (!reader) {
      ctx.exitCode = kExitBadInput;
      return;
    }
    sqlite3* db = reader->handle();
    sqlite3_set_authorizer(db, denyAttach, nullptr);
    sqlite3_stmt* st = nullptr;
    const char* tail = nullptr;
    if (sqlite3_prepare_v2(db, args->query.c_str(), -1, &st, &tail) != SQLITE_OK || st == nullptr) {
      const int code = sqlite3_errcode(db);
      const std::string msg = code == SQLITE_AUTH  ? "refused: ATTACH and DETACH of other files are not allowed"
                              : code == SQLITE_OK ? "the query is empty"
                                                  : sqlite3_errmsg(db);
      printError("sql", args->run.string() + ": " + msg);
      sqlite3_finalize(st);
      ctx.exitCode = kExitBadInput;
      return;
    }
    std::unique_ptr<sqlite3_stmt, int (*)(sqlite3_stmt*)> guard(st, sqlite3_finalize);
    for (const char* p = tail; p && *p; ++p) {
      if (!std::isspace(static_cast<unsigned char>(*p)) && *p != ';') {
        printError("sql", "only one statement is allowed; remove what follows the first ';'");
        ctx.exitCode = kExitBadInput;
        return;
      }
    }
    if (!sqlite3_stmt_readonly(st)) {
      printError("sql", "refused: the statement would modify " + args->run.string() +
                            "; tpscope sql runs read-only queries only (SELECT, WITH, EXPLAIN, read-only PRAGMA)");
      ctx.exitCode = kExitBadInput;
      return;
    }
    const int cols = sqlite3_column_count(st);
    std::vector<std::string> header;
    for (int c = 0; c < cols; ++c) header.emplace_back(sqlite3_column_name(st, c));
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    Table table(header, std::string(header.size(), 'l'));
    int64_t n = 0, omitted = 0;
    if (args->tsv) {
      for (int c = 0; c < cols; ++c) std::cout << (c ? "\t" : "") << header[c];
      std::cout << "\n";
    }
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      ++n;
      if (args->tsv) {
        for (int c = 0; c < cols; ++c) std::cout << (c ? "\t" : "") << cellText(st, c);
        std::cout << "\n";
      } else if (args->json) {
        nlohmann::ordered_json row;
        for (int c = 0; c < cols; ++c) row[header[c]] = cellJson(st, c);
        rows.push_back(std::move(row));
      } else if (args->limit <= 0 || n <= args->limit) {
        std::vector<std::string> row;
        for (int c = 0; c < cols; ++c) row.push_back(cellText(st, c));
        table.add(std::move(row));
      } else {
        ++omitted;
      }
    }
    if (rc != SQLITE_DONE) {
      printError("sql", args->run.string() + ": " + sqlite3_errmsg(db));
      ctx.exitCode = kExitBadInput;
      return;
    }
    if (args->json) {
      std::cout << rows.dump(2) << "\n";
    } else if (!args->tsv) {
      table.print(std::cout);
      std::cout << "(" << n << " row" << (n == 1 ? "" : "s");
      if (omitted > 0) std::cout << "; " << omitted << " not shown, see --limit or --tsv";
      std::cout << ")\n";
    }
  });
}

TPS_REGISTER_COMMAND(70, addSql);

}  // namespace
}  // namespace tpscope::cli
