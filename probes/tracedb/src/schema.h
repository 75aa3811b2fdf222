// Internal: creating and checking the schema of a trace file.
#pragma once

#include <filesystem>
#include <span>
#include <string_view>

#include "tpscope/tracedb/status.h"

struct sqlite3;

namespace tpscope::tracedb::detail {

// Creates every table and view of format version kFormatVersion and sets PRAGMA user_version. In a transaction.
Status createSchema(sqlite3* db, const std::filesystem::path& path);
Status createIndexes(sqlite3* db, const std::filesystem::path& path);
// Those of indexes.sql named in `names` (the others are not created).
Status createIndexes(sqlite3* db, const std::filesystem::path& path, std::span<const std::string_view> names);
// Checks that `db` holds a tpscope trace this library can read; returns its version.
Result<int> checkSchema(sqlite3* db, const std::filesystem::path& path);

}  // namespace tpscope::tracedb::detail
