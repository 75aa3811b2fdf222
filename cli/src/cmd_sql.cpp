// tpscope sql RUN "SELECT ..." [--json | --tsv] [--limit N]: one read-only SQL statement over the run file.
// Writes are refused before anything runs (tracedb::Query::readOnly): the statement must be read-only, single, and
// may not ATTACH other files; the connection is read-only and query_only besides.
#include <nlohmann/json.hpp>

#include <iostream>

#include "command.h"
#include "text.h"
#include "tpscope/tracedb/query.h"

namespace tpscope::cli {
namespace {

struct SqlArgs {
  std::filesystem::path run;
  std::string query;
  bool json = false;
  bool tsv = false;
  int64_t limit = 1000;
};

using tracedb::ColumnType;
using tracedb::Query;

std::string cellText(const Query& q, int c) {
  switch (q.type(c)) {
    case ColumnType::Null: return "NULL";
    case ColumnType::Blob: return "<blob " + std::to_string(q.bytes(c)) + " bytes>";
    default: return q.text(c);
  }
}

nlohmann::ordered_json cellJson(const Query& q, int c) {
  switch (q.type(c)) {
    case ColumnType::Null: return nullptr;
    case ColumnType::Integer: return q.i64(c);
    case ColumnType::Float: return q.f64(c);
    default: return cellText(q, c);
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
    auto query = Query::readOnly(*reader, args->query);
    if (!query) {
      printError("sql", query.error());
      ctx.exitCode = kExitBadInput;
      return;
    }
    Query& st = *query;
    const int cols = st.columnCount();
    std::vector<std::string> header;
    for (int c = 0; c < cols; ++c) header.emplace_back(st.columnName(c));
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    Table table(header, std::string(header.size(), 'l'));
    int64_t n = 0, omitted = 0;
    if (args->tsv) {
      for (int c = 0; c < cols; ++c) std::cout << (c ? "\t" : "") << header[c];
      std::cout << "\n";
    }
    const tracedb::Status s = st.each([&](Query& q) {
      ++n;
      if (args->tsv) {
        for (int c = 0; c < cols; ++c) std::cout << (c ? "\t" : "") << cellText(q, c);
        std::cout << "\n";
      } else if (args->json) {
        nlohmann::ordered_json row;
        for (int c = 0; c < cols; ++c) row[header[c]] = cellJson(q, c);
        rows.push_back(std::move(row));
      } else if (args->limit <= 0 || n <= args->limit) {
        std::vector<std::string> row;
        for (int c = 0; c < cols; ++c) row.push_back(cellText(q, c));
        table.add(std::move(row));
      } else {
        ++omitted;
      }
    });
    if (!s) {
      printError("sql", s.message());
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
