// Crashed and early-stopped ranks.
//   crash (critical): ranks.exit_reason starts with "crash" (tpscope capture's verdict on a rank that died of a
//                     signal capture did not send, SIGTERM included); never when it starts with "stopped by" (the
//                     ranks capture ended itself). Otherwise: it contains "crash", "signal", "abort", "segfault", "sigsegv", "sigabrt",
//                     "sigbus", "sigfpe", "sigill", "sigkill" or "killed" (case-insensitive) — but a stop signal
//                     (SIGTERM, SIGINT, SIGUSR1, SIGHUP: how a launcher ends a job, e.g. after a hang dump) is not
//                     a crash by itself; such a rank is judged by the early-stop rule below
//   crash (error):    no exit reason "ok", and the rank's records stop early: its last record (span end,
//                     collective enqueue/end, step_stats end) is before the run's last record by more than
//                     max(1 ms, 5 % of the run's extent) and its last step is lower than the highest step recorded
//                     by any other rank.
// Evidence: the ranks row, the rank's last span and last collective.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tpscope/analysis/finding.h"
#include "tpscope/analysis/run_info.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis {

struct RankEnd {
  int rank = 0;
  std::string exitReason;
  int64_t lastRecordNs = 0;  // latest time the rank recorded anything
  int lastStep = -1;         // highest step among its spans, collectives and step_stats
  bool crashed = false;      // by exit reason
  bool stoppedEarly = false;
};

// Whether a rank's exit reason (ranks.exit_reason) says it crashed: the "crash (critical)" rule above. `tpscope
// watch` judges the ranks' ends while the job runs with it.
bool isCrashExitReason(std::string reason);

tracedb::Result<std::vector<RankEnd>> analyzeRankEnds(tracedb::Reader& reader, const RunInfo& info);
tracedb::Result<std::vector<Finding>> crashFindings(tracedb::Reader& reader, const std::vector<RankEnd>& ends,
                                                    const RunInfo& info);

}  // namespace tpscope::analysis
