// The live stall lines' journal: DIR/stalls.jsonl, written by capture's watcher and `tpscope watch` into the folder
// of rank files they follow, and read back by merge (`tpscope merge`, capture's own merge) into the run file's
// alerts table (kind 'stall') and by the viewer when it opens or follows the folder.
//
// Format: JSON Lines, one alert per line: {"rank", "step", "ts_unix_ns", "severity", "kind", "layer", "param",
// "message", "evidence": {...}} (docs/schema.md, "The stall journal"). Times are Unix times: the reader puts them on
// the run's time base (its epoch, meta 'epoch_unix_ns'). The writer replaces the whole file each time (a temporary
// file renamed over it): a reader never sees a half-written line, and a watcher that is killed leaves the lines it
// had written.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

#include "tpscope/tracedb/records.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis {

inline constexpr std::string_view kStallJournalName = "stalls.jsonl";

// The journal of a watcher of `dir`: stalls.jsonl for the whole folder's ranks; stalls-rank<K>.jsonl for a watcher
// of one node's ranks from global rank K on (`tpscope watch --nproc`, the node's folder shared with other nodes).
std::filesystem::path stallJournalPath(const std::filesystem::path& dir, int firstRank = -1);
// The journals in `dir`, sorted by name (none: empty).
std::vector<std::filesystem::path> stallJournalsIn(const std::filesystem::path& dir);

// Writes `alerts` (times on the base whose Unix epoch is `epochUnixNs`) as `file`, replacing it atomically.
tracedb::Status writeStallJournal(const std::filesystem::path& file, std::span<const tracedb::AlertRow> alerts,
                                  int64_t epochUnixNs);

// The journal's alerts, their times on the base whose Unix epoch is `epochUnixNs`. A line that is not a journal
// alert is an error naming the file and the line.
tracedb::Result<std::vector<tracedb::AlertRow>> readStallJournal(const std::filesystem::path& file,
                                                                 int64_t epochUnixNs);

// Appends the alerts of `dir`'s journals (stallJournalsIn) to the run file `run` (on the run's epoch, read from
// it); the number appended (0 without a journal).
tracedb::Result<size_t> addStallJournal(const std::filesystem::path& dir, const std::filesystem::path& run);

}  // namespace tpscope::analysis
