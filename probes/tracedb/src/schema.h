// Internal: creating and checking the schema of a trace file.
#pragma once

#include <filesystem>

#include "tpscope/tracedb/status.h"

struct sqlite3;

namespace tpscope::tracedb::detail {

// Creates every table and view of format version kFormatVersion and sets PRAGMA user_version. In a transaction.
Status createSchema(sqlite3* db, const std::filesystem::path& path);
Status createIndexes(sqlite3* db, const std::filesystem::path& path);
// Checks that `db` holds a tpscope trace this library can read; returns its version.
Result<int> checkSchema(sqlite3* db, const std::filesystem::path& path);

}  // namespace tpscope::tracedb::detail
