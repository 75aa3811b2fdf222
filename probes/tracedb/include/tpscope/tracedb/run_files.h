// Several trace files of one run opened together, on one time base: the one definition of clock alignment, used by
// merge (merge.h) and by the viewer when it reads a capture folder's rank files directly.
//
// Time 0 of the run is the earliest input epoch (meta 'epoch_unix_ns'); times are on rank 0's clock. A time t of
// rank r in file f moves to  t + (epoch_f - epoch_run) + clock_offset_ns(r),  the offset left out when the file is
// already aligned (meta 'clock_aligned' = 1, a merged file) and taken as 0 for a rank the file's 'ranks' table lacks.
// (docs/schema.md, "Conventions".)
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/records.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::tracedb {

struct FileClock {
  int64_t epochUnixNs = 0;               // the file's meta 'epoch_unix_ns'
  bool aligned = false;                  // meta 'clock_aligned' = 1: the ranks' offsets are already applied
  int64_t epochShiftNs = 0;              // epochUnixNs - the run's epoch
  std::map<int, int64_t> clockOffsetNs;  // rank -> ranks.clock_offset_ns

  // ns to add to a time of `rank` in this file to put it on the run's time base.
  int64_t shiftNs(int rank) const;
};

struct RunFile {
  std::filesystem::path path;
  std::unique_ptr<Reader> reader;  // null when opened with keepReaders = false
  std::string runId;            // meta 'run_id' ("" if unset)
  std::vector<RankInfo> ranks;  // as stored: times on the file's own base
  FileClock clock;
};

struct RunFiles {
  int64_t epochUnixNs = 0;  // time 0 of the run: the earliest input epoch
  std::vector<RunFile> files;
};

// Opens every file (Reader::open's checks), reads its epoch, alignment and ranks, and sets each file's shift.
// Refuses nothing else: merge adds its own refusals (different runs, a rank in two files). With keepReaders false
// each file is closed once read (merge of thousands of rank files holds one descriptor at a time).
Result<RunFiles> openRunFiles(std::span<const std::filesystem::path> paths, bool keepReaders = true);

}  // namespace tpscope::tracedb
