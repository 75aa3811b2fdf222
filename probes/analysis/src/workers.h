// Internal: worker threads for the analyses' large scans. A worker reads through its own Reader of the same file
// (reader.h: one SQLite connection per thread), so a scan is split by row id, never by sharing a connection.
#pragma once

#include <cstdint>
#include <functional>

#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis::detail {

// Threads for `rows` rows of work: 1 below 500 k rows (a thread and a connection cost more than they save there),
// else the cores, at most 4. TPSCOPE_ANALYSIS_THREADS overrides the count (1: no worker threads).
unsigned workerCount(int64_t rows);

// Splits the row ids [first, last] into `parts` consecutive ranges and calls scan(reader, from, to, part) for each
// (from and to included): part 0 on `reader` in the calling thread, the others in worker threads, each on its own
// Reader of reader.path(). Returns the first failure in part order. `scan` runs concurrently: it writes only its
// part's output.
using IdRangeScan = std::function<tracedb::Status(tracedb::Reader& reader, int64_t from, int64_t to, unsigned part)>;
tracedb::Status scanIdRanges(tracedb::Reader& reader, int64_t first, int64_t last, unsigned parts,
                             const IdRangeScan& scan);

}  // namespace tpscope::analysis::detail
