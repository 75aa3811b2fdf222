// Import of PyTorch profiler (Kineto) traces, and of Chrome Trace Event JSON of any tool, into a tpscope run file.
//
// Design: each input file (one rank, or several ranks named by their processes or threads) is read, inflated and
// interpreted on its own, in parallel: events become thread lanes and spans, collectives are recognised by their
// metadata or the profiler's collective op names (never only by kernel names) and recorded once per rank, counters
// stay counters. The per-file models are then aligned by absolute time and written by the calling thread through
// tracedb::Writer to a temporary file that replaces `output` only on success. Malformed single events are counted,
// not fatal. docs/formats.md has the full mapping table and the pipeline-parallel contract.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <span>
#include <string>

#include "tpscope/tracedb/status.h"

namespace tpscope::formats {

struct KinetoImportStats {
  int files = 0;
  int ranks = 0;
  int64_t inputBytes = 0;      // uncompressed JSON bytes parsed
  int64_t events = 0;          // trace events seen (all phases)
  int64_t spans = 0;           // span rows written
  int64_t collectives = 0;     // collective rows written
  int64_t counters = 0;        // counter rows written
  int64_t threads = 0;         // thread lanes written (CPU threads and GPU streams)
  int64_t flows = 0;           // ac2g flow events that supplied a missing correlation id
  std::map<std::string, int64_t> skipped;  // reason -> count: unknown phases, malformed events (not fatal)
  std::set<std::string> seqByOrder;        // groups numbered by each rank's order (meta collective_seq_by_order)
  int64_t kernelTimedCollectives = 0;      // collectives timed by their NCCL kernel (meta collective_arrival device)
  double seconds = 0;          // wall time of the import
  double parseSeconds = 0;     // reading, inflating and parsing the JSON (summed over files, which may overlap)
  double modelSeconds = 0;     // interpreting events: lanes, nesting, collectives, correlation (summed likewise)
  double writeSeconds = 0;     // writing rows, building indexes, closing the file

  // One or two lines for the CLI, e.g. "imported 2 ranks from 2 files (12.3 MB): 5123 spans, 96 collectives, ...".
  std::string summary() const;
};

// Imports `inputs` (one per rank, or several ranks per file as importChrome below describes) into the run file
// `output`. Meta 'tool' is "tpscope import kineto", 'source' "kineto". docs/formats.md ("Kineto import") has the
// inputs, the mapping of events and collectives, and the time base in full.
// Inputs: plain or gzip JSON (detected by the magic bytes), object or array form; a file's rank comes from
//   distributedInfo.rank, else its name ("rank-N", "rankN", "rank_N"), else the input order; a rank twice is refused.
// Collectives: by their metadata or the profiler's op names (the catalogue, vocabulary/collective_ops.h); the host
//   op carries them, the GPU kernels they launched give start/end, seq is the metadata's or the order of enqueueing.
// Times: Kineto's µs (converted exactly from their text) become ns since the earliest event across all inputs.
// Errors: a file that cannot be read, is not JSON, is a truncated gzip stream, or holds no events is an error naming
//   the file; single malformed events are counted (KinetoImportStats::skipped, meta 'kineto_import_skipped').
// Output: written to a temporary file beside `output`, indexed, then renamed onto it; an existing `output` is replaced
//   only on success, and an output that is one of the inputs is refused.
// Threading: up to 8 files are read and interpreted at once (each needs about 3x its JSON in memory while it is
//   parsed); the output is written by the calling thread. Concurrent calls with different outputs are safe.
tpscope::tracedb::Result<KinetoImportStats> importKineto(std::span<const std::filesystem::path> inputs,
                                                         const std::filesystem::path& output);
// The same import for Chrome Trace Event JSON of any tool; meta 'tool' "tpscope import chrome", 'source' "chrome".
// A file may hold several ranks, one per process or thread whose name carries it ("PP rank 2, TP rank 0", tpscope's
// export "rank 5 ... pp 1/2"); ranks known only by (pp, tp, dp) get Megatron's global rank (TP fastest, then DP,
// then PP). Args "step", "layer", "phase" and a tpscope span-kind "cat" place a span; an event of cat "collective"
// with args group/seq/op is a collective record. Megatron-style timers (forward-compute, backward-send, ...) and
// tpscope's pass names become the pipeline contract of docs/schema.md — pass spans, point-to-point records paired
// per directed pair, meta 'pipeline' — as docs/formats.md "Pipeline-parallel traces" lists; a trace without them
// imports exactly as before. Both imports read files this way (a Kineto trace is a Chrome trace).
tpscope::tracedb::Result<KinetoImportStats> importChrome(std::span<const std::filesystem::path> inputs,
                                                         const std::filesystem::path& output);

}  // namespace tpscope::formats
