// diagnose(): every analysis over one run file, as findings sorted most severe first (findingLess).
//
// Runs: crash, desync/hang, NaN/Inf origin, gradient and loss anomalies, stragglers, communication overhead.
//   straggler (warning): a rank arrives last at ≥ stragglerLastPct % of the decided collectives of the run
//                        (≥ stragglerMinCollectives of them) or caused ≥ stragglerDominantWaitPct % of all the
//                        waiting at them (a rank slow once per step is last only at its slow collectives: among four
//                        ranks, or with few steps, that is well below half) — and the others' waiting it caused is
//                        ≥ stragglerMinWaitPct % of the run's total communication time, and it caused at least
//                        75 % of the waiting the worst straggler caused (ranks delayed by the straggler arrive late
//                        at their next collective too; they are victims, not causes).
//   comm_overhead (warning above commOverheadWarnPct, info above commOverheadInfoPct): per rank, from the breakdown;
//                        one run-wide finding (rank −1) carries the run's figure.
// A failing analysis (e.g. a damaged table) does not stop the others: its error is returned in `errors`, named.
// Threading: uses `reader` from the calling thread only.
#pragma once

#include <string>
#include <vector>

#include "tpscope/analysis/anomalies.h"
#include "tpscope/analysis/finding.h"
#include "tpscope/tracedb/reader.h"

namespace tpscope::analysis {

struct DiagnoseOptions {
  AnomalyOptions anomalies;
  double stragglerLastPct = 50.0;
  double stragglerDominantWaitPct = 50.0;
  int stragglerMinCollectives = 4;
  double stragglerMinWaitPct = 5.0;
  double commOverheadWarnPct = 30.0;
  double commOverheadInfoPct = 10.0;
  int maxFindingsPerKind = 20;  // the rest of a kind are counted in DiagnoseResult::omitted
};

struct DiagnoseResult {
  std::vector<Finding> findings;    // sorted, most severe first
  std::vector<std::string> errors;  // analyses that failed, "<analysis>: <message naming the file>"
  std::vector<std::pair<std::string, int64_t>> omitted;  // kind name → findings left out by maxFindingsPerKind
};

DiagnoseResult diagnose(tracedb::Reader& reader, const DiagnoseOptions& options = {});

}  // namespace tpscope::analysis
