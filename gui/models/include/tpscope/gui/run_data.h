// Everything the viewer shows about one run, loaded into plain structs: a merged run file (run.db), one rank file, or
// a capture folder (DIR/rank-*.db, a capture in progress; DIR/run.db wins when it exists).
//
// Time base: ns. Rank files of a folder are aligned by tracedb::openRunFiles, the function `tpscope merge` uses
// (run_files.h): a rank's times move by (its file's epoch - the earliest epoch) + its clock offset, unless the file
// says clock_aligned=1. Strings of several files are re-interned into one table (TimelineData::strings).
//
// Threading: loadRun() is blocking and may run on any thread (it opens its own readers); the result is immutable and
// shared between threads. Errors come back as a message naming the file; nothing throws.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tpscope/gui/timeline_data.h"
#include "tpscope/tracedb/records.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::gui {

struct RunData {
  std::filesystem::path source;               // what was opened
  std::vector<std::filesystem::path> files;   // the trace files read
  std::map<std::string, std::string> meta;    // of the first file
  std::vector<tracedb::RankInfo> ranks;
  std::vector<tracedb::ThreadInfo> threads;
  std::vector<tracedb::GroupInfo> groups;
  std::vector<tracedb::CollectiveRow> collectives;  // by group, seq, rank
  std::vector<tracedb::GradStatRow> gradStats;      // by step, rank, layer
  std::vector<tracedb::StepStatRow> stepStats;      // by step, rank
  std::vector<tracedb::AlertRow> alerts;            // by time
  std::shared_ptr<const TimelineData> timeline;
  int64_t beginNs = 0;  // over spans and collectives
  int64_t endNs = 0;
  bool live = false;    // read from rank files of a capture folder
  bool timelineFromCache = false;  // the spans came from the timeline cache (see LoadOptions::useCache)
  // The timeline is the file's lane summary (loadRunSummary), shown while every span is read.
  bool summaryOnly() const { return timeline && timeline->summary(); }

  std::vector<int> rankIds() const;  // sorted, from ranks, spans and collectives
  // [begin, end) of (rank, step) from step stats, else from its spans; false if unknown.
  bool stepWindow(int rank, int step, int64_t& beginNs, int64_t& endNs) const;
};

// Where the time of a load went (ms), for the benchmark.
struct LoadTimings {
  double tablesMs = 0;  // ranks, collectives, grad/step stats, alerts, strings
  double spansMs = 0;   // reading the spans table
  double buildMs = 0;   // lanes: sort, depth rows, summaries
};

// Timeline cache: a single run file's built timeline is kept in "<file>.tpscope-gui-cache" beside it (or, when that
// folder is not writable, in $XDG_CACHE_HOME/tpscope-gui or ~/.cache/tpscope-gui), keyed by the file's size and
// modification time. Files with a non-empty -wal (still being written) and capture folders are never cached.
struct LoadOptions {
  int workers = 2;                 // threads for reading and sorting spans
  LoadTimings* timings = nullptr;  // filled when set
  bool useCache = true;            // read the timeline cache when it is valid
  // A run loadRunSummary() returned for the same path: its tables are taken instead of read again.
  std::shared_ptr<const RunData> tablesFrom;
};

// Writes the timeline cache of `run` if it is cacheable and has none yet. Returns true if a cache was written.
// Blocking (hundreds of MB for 10 M spans): call it off the UI thread, after the run is shown.
bool writeTimelineCache(const RunData& run);

// What loadRun would read for `path`: the run file, or the rank files of a folder. Empty if nothing readable is there.
std::vector<std::filesystem::path> traceFilesOf(const std::filesystem::path& path);

tracedb::Result<std::shared_ptr<const RunData>> loadRun(const std::filesystem::path& path,
                                                        const LoadOptions& options = {});

// The first frame of a big run (issue #17): the run's tables with the timeline built from the file's lane summary
// (tracedb/lane_summary.h), a few MB whatever the number of spans. nullptr when `path` is not a single run file with
// a current lane summary (a capture folder, a rank file, an older file): then loadRun is the first frame. The caller
// shows it, then calls loadRun with LoadOptions::tablesFrom set to it for every span. Blocking; any thread.
tracedb::Result<std::shared_ptr<const RunData>> loadRunSummary(const std::filesystem::path& path,
                                                               const LoadOptions& options = {});

}  // namespace tpscope::gui
