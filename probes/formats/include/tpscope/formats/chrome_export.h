// Export of a tpscope run file as Chrome Trace Event JSON (opens in Perfetto UI and chrome://tracing).
//
// Layout: {"displayTimeUnit": "ns", "otherData": {...}, "traceEvents": [...]}.
//   - one process per rank (pid = rank + 1; "process_name" "rank N (host) tp a/b dp c/d", "process_sort_index" N);
//   - one thread per thread lane (tid = thread id; "thread_name" from the threads table, else "thread N"/"stream N");
//   - spans as "X" events: ts/dur in µs (fractional, ns precision), cat = span kind, args {step, layer, phase};
//   - collectives as "X" events named by op on the rank's "collectives" lane (tid kCollectivesTid; where a rank's
//     collectives overlap in time, the overlapping ones go to further lanes kCollectivesTid + 2, + 4, ... since
//     slices on one lane must nest), args {group, seq, op, dtype, bytes, shape, state, enqueue_ns, step, layer,
//     phase, callsite}; an unfinished collective (no end) lasts to the end of the run;
//   - the ranks of one (group, seq) linked by one flow: "s" on the first rank to start, "t" on the next ones, "f"
//     (bp "e") on the last; one flow id per (group, seq), numbered from 1 in (group, seq) order;
//   - counters as "C" events, args {value}: "loss", "grad_norm", "lr", "loss_scale" from step_stats at the step's
//     end (else its begin, else the end of its last span), and every counters row under its own name;
//   - alerts as instant events ("i", thread scope) on the rank's "alerts" lane (tid kAlertsTid), args {severity,
//     kind, step, layer, param, message, evidence}.
// Written streaming (no DOM; spans are streamed from the database, the other tables read as rows) to a temporary
// file beside `output`, then renamed: complete or absent.
// Output is deterministic for a given run file (no timestamps of the export itself, rows in a stable order).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "tpscope/tracedb/status.h"

namespace tpscope::formats {

inline constexpr int kCollectivesTid = 1000000;  // tid of the per-rank "collectives" lane (+2k for overlaps)
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
