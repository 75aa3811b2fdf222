// Import of a folder of PyTorch Flight Recorder dumps (one file per rank) into a tpscope run file, so that
// `tpscope desync`, `diagnose` and the HTML report read a job's last collectives as they read a captured run.
//
// Inputs: the files directly in `dir` whose name ends in the rank, optionally followed by .json, .pkl or
// .pickle: "nccl_trace_rank_3" (the watchdog's default, TORCH_FR_DUMP_TEMP_FILE + rank), "fr_rank_3.json", ...
// Each is a pickle (torch._C._distributed_c10d._dump_nccl_trace / _dump_fr_trace, the watchdog's file) or JSON
// (_dump_nccl_trace_json / _dump_fr_trace_json), told apart by their first bytes, never by the name; the pickle
// is read by tpscope's own strict reader of plain values (no Python). Other files are ignored (counted); two files
// of one rank are refused. Format versions 2.3 to 2.10 are read by key; later ones are read the same way.
// Mapping (docs/formats.md "Flight Recorder dumps"): groups "<pg_name>:<desc>" with their members; one collectives
// row per (rank, group, collective_seq_id) — a coalesced group is one row; P2P sends and receives in the
// pseudo-groups "p2p-<src>-<dst>"; states, times (ns since the earliest time_created_ns; meta epoch_unix_ns) and
// the innermost user stack frame as the callsite. Ranks below the highest one dumped or named that left no dump are in
// meta 'flight_recorder_missing_ranks' (tracedb::meta_keys::kMissingRankDumps) and have no `ranks` row.
// Errors: a folder without dumps, a file that cannot be read, is truncated, is not a pickle of plain values or
// JSON, or is not a Flight Recorder dump fails the import with a message naming the file; no output is left.
// Output: written to a temporary file beside `output` and renamed onto it when complete (as importKineto).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tpscope/tracedb/status.h"

namespace tpscope::formats {

struct FlightRecorderImportStats {
  int files = 0;                     // dumps read
  std::vector<int> ranks;            // ranks imported
  std::vector<int> missingRanks;     // ranks 0 .. the highest rank dumped or named in a pg_config without a dump
  std::map<std::string, int> forms;  // "pickle" / "json" -> files
  std::vector<std::string> versions; // distinct format versions
  int64_t entries = 0;               // Flight Recorder entries read
  int64_t collectives = 0;           // collectives rows written
  int64_t groups = 0;                // process_groups rows written
  std::map<std::string, int64_t> skipped;  // not imported or merged: reason -> count
  double seconds = 0;

  // "imported 3 ranks from 3 Flight Recorder dumps (pickle, version 2.10): 21 entries → 18 collectives in 2 groups"
  // and, where there are some, lines for the missing ranks and the skipped entries.
  std::string summary() const;
};

tracedb::Result<FlightRecorderImportStats> importFlightRecorder(const std::filesystem::path& dir,
                                                                const std::filesystem::path& output);

}  // namespace tpscope::formats
