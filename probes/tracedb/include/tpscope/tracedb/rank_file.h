// Edits of a trace file by someone other than its writer, after the writer is gone: the capture launcher records
// its verdict on a rank whose process ended (ranks.exit_reason, meta 'capture_exit') and adds its own meta keys to the
// merged run file. Each call opens the file read-write, applies its change in one transaction and closes it; a
// concurrent reader is waited for up to 2 s. Errors name the file.
#pragma once

#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "tpscope/tracedb/records.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::tracedb {

// Sets ranks.exit_reason of every rank in the file (a rank file holds one) and meta 'capture_exit' to `exitStatus`
// (the raw status as the launcher saw it, "exit 3", "signal SIGKILL").
Status markRankExit(const std::filesystem::path& file, std::string_view exitReason, std::string_view exitStatus);

// Inserts or replaces the meta keys, all or none.
Status addMeta(const std::filesystem::path& file, std::span<const std::pair<std::string, std::string>> keyValues);

// Appends alerts (their ids assigned here), all or none: the launcher's own, e.g. the live stall lines (kind 'stall').
Status addAlerts(const std::filesystem::path& file, std::span<const AlertRow> alerts);

}  // namespace tpscope::tracedb
