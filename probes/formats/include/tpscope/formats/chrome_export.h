// Export of a tpscope run file as Chrome Trace Event JSON (opens in Perfetto UI and chrome://tracing).
//
// Layout: {"displayTimeUnit": "ns", "otherData": {...}, "traceEvents": [...]}.
//   - one process per rank (pid = rank + 1; "process_name" "rank N", "process_sort_index" N metadata);
//   - one thread per thread lane (tid = thread id; "thread_name"; CUDA streams named "stream N"), plus a
//     "collectives" thread per rank (tid kCollectivesTid) and an "alerts" thread;
//   - spans as "X" events: ts/dur in µs (fractional, ns precision), cat = span kind, args {step, layer, phase};
//   - collectives as "X" events on the collectives thread: args {group, seq, op, dtype, bytes, shape, state};
//     the ranks of one (group, seq) are linked with flow events "s" (first rank by start time) → "t" ... → "f"
//     (bp "e"), one flow id per (group, seq), unique in the file;
//   - counters as "C" events: "loss" and "grad_norm" (and lr, loss_scale) from step_stats, every counters row;
//   - alerts as instant events ("i", scope "p") with args {severity, kind, step, layer, param, message}.
// Written streaming (no in-memory DOM) to a temporary file beside `output`, then renamed: complete or absent.
// Output is deterministic for a given run file (no timestamps of the export itself, rows in a stable order).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "tpscope/tracedb/status.h"

namespace tpscope::formats {

inline constexpr int kCollectivesTid = 1000000;  // tid of the per-rank "collectives" lane
inline constexpr int kAlertsTid = 1000001;       // tid of the per-rank "alerts" lane

struct ChromeExportStats {
  int ranks = 0;
  int64_t spans = 0;
  int64_t collectives = 0;
  int64_t flows = 0;         // (group, seq) chains linked across ranks
  int64_t counters = 0;      // "C" events
  int64_t alerts = 0;
  int64_t bytesWritten = 0;  // size of the output file
  double seconds = 0;

  std::string summary() const;
};

// Exports the run (or rank) file `run` to `output`. Errors name the file: unreadable run, unwritable output.
tpscope::tracedb::Result<ChromeExportStats> exportChrome(const std::filesystem::path& run,
                                                         const std::filesystem::path& output);

}  // namespace tpscope::formats
