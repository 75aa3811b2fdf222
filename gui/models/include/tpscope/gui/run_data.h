// Everything the viewer shows about one run, loaded into plain structs: a merged run file (run.db), one rank file, or
// a capture folder (DIR/rank-*.db, a capture in progress; DIR/run.db wins when it exists).
//
// What is read is the opened run's one file (opened_run.h): the run file, a rank file, or the merge of a capture
// folder's rank files that the analysis reads too. Time base: ns, aligned by tracedb::openRunFiles (run_files.h): a
// rank's times move by (its file's epoch - the earliest epoch) + its clock offset, unless the file says
// clock_aligned=1 (a merge's). The file's strings are re-interned into one table (TimelineData::strings).
//
// Threading: loadRun() is blocking and may run on any thread (it opens its own readers); the result is immutable and
// shared between threads. Errors come back as a message naming the file; nothing throws.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tpscope/gui/opened_run.h"
#include "tpscope/gui/timeline_data.h"
#include "tpscope/tracedb/records.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::gui {

// What loadWindow needs to read a window of a run file's spans onto a summary timeline's lanes and time base.
struct SpanWindowSource {
  std::vector<uint32_t> nameMap;  // the file's string id → TimelineData::strings index
  std::map<int, int64_t> shiftNs;  // rank → what moves its file times onto the run's time base
  // rank → the finest bucket of its lane summary rows: a span at least that long is in the summary as itself
  // (tracedb/lane_summary.h), so one that is not, and overlaps a window, began at most this long before it.
  std::map<int, int64_t> reachNs;
};

struct RunData {
  std::filesystem::path source;               // what was opened
  std::vector<std::filesystem::path> files;   // the run's trace files (OpenedRun::files)
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
  bool live = false;    // a capture folder of rank files (OpenedRun::live)
  bool timelineFromCache = false;  // the spans came from the timeline cache (see LoadOptions::useCache)
  // The timeline is the file's lane summary (loadRunSummary), shown while every span is read.
  bool summaryOnly() const { return timeline && timeline->summary(); }
  // A run of more spans than LoadOptions::fullLoadLimit is never read whole: `timeline` stays its lane summary and the
  // viewer reads the spans of the time it shows (loadWindow) when zoomed in.
  bool windowed = false;
  std::shared_ptr<const SpanWindowSource> windowSource;  // set by loadRunSummary

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
  // loadRunSummary marks a run of more spans than this RunData::windowed (when the file has the span index that merge,
  // capture and import create). Reading every span takes about 65 bytes a
  // span at its peak (bench/gui), so 40 M spans stay under 3 GB. The viewer takes TPSCOPE_GUI_FULL_LOAD_LIMIT.
  int64_t fullLoadLimit = kFullLoadLimit;
  static constexpr int64_t kFullLoadLimit = 40'000'000;
};

// Writes the timeline cache of `run` if it is cacheable and has none yet. Returns true if a cache was written.
// Blocking (hundreds of MB for 10 M spans): call it off the UI thread, after the run is shown.
bool writeTimelineCache(const RunData& run);

// Every span and table of the opened run's file.
tracedb::Result<std::shared_ptr<const RunData>> loadRun(const OpenedRun& opened, const LoadOptions& options = {});
// loadRun of openRun(path): a capture folder's merge removed when it has been read.
tracedb::Result<std::shared_ptr<const RunData>> loadRun(const std::filesystem::path& path,
                                                        const LoadOptions& options = {});

// The first frame of a big run (issue #17): the run's tables with the timeline built from the file's lane summary
// (tracedb/lane_summary.h), a few MB whatever the number of spans. nullptr when `path` is not a single run file with
// a current lane summary (a capture folder, a rank file, an older file): then loadRun is the first frame. The caller
// shows it, then calls loadRun with LoadOptions::tablesFrom set to it for every span. Blocking; any thread.
tracedb::Result<std::shared_ptr<const RunData>> loadRunSummary(const OpenedRun& opened,
                                                               const LoadOptions& options = {});
tracedb::Result<std::shared_ptr<const RunData>> loadRunSummary(const std::filesystem::path& path,
                                                               const LoadOptions& options = {});

// Every span of a windowed run (RunData::windowed, from loadRunSummary) that overlaps [fromNs, toNs), read from its
// file by the (rank, begin) index and laid out on the summary's lanes (TimelineData::buildWindow): per rank, the spans
// that begin in [fromNs − reach, toNs) (SpanWindowSource::reachNs), plus the summary's entries that are single spans
// and began earlier but still overlap — together every span that overlaps. Ranks are read on up to `workers`
// threads. The caller bounds the cost with the summary's TimelineData::weightIn(fromNs, toNs). Blocking; any thread.
tracedb::Result<std::shared_ptr<const TimelineData>> loadWindow(const RunData& run, int64_t fromNs, int64_t toNs,
                                                                int workers = 1);

}  // namespace tpscope::gui
