// Internal: the straggler findings of diagnose() (stragglers.cpp), from the collectives' straggler report.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "tpscope/analysis/breakdown.h"
#include "tpscope/analysis/collectives.h"
#include "tpscope/analysis/diagnose.h"
#include "tpscope/analysis/finding.h"
#include "tpscope/analysis/run_info.h"
#include "tpscope/tracedb/reader.h"

namespace tpscope::analysis::detail {

// Per rank, its threads' wait for a CPU per step: the recorder's run delay (counter_names::kRunDelay, sampled at each
// step's end) from its first sample to its last, over the steps between them. Ranks with fewer than two samples (an
// older recorder, another tool's trace) are absent.
tracedb::Result<std::map<int, double>> cpuWaitPerStep(tracedb::Reader& reader);

// The median of cpuWaitPerStep over the ranks `keep` accepts: the host's scheduling noise, against which a rank's
// lateness (stragglers) or a stage's extra compute (pipeline) is judged. nullopt when no such rank has the figure.
std::optional<double> medianCpuWait(const std::map<int, double>& cpuWait, const std::function<bool(int)>& keep);

// A finding per rank that others wait on beyond chance (StragglerReport) and by a material share of the step (`b`:
// the mean step time; null: none); a rank that only passes on another's lateness is a victim, not named. Severity
// warning, or info where the host's scheduling explains the lag (oversubscribed, every CPU running a rank, `cpuWait`).
std::vector<Finding> stragglerFindings(const CollectiveAnalysis& ca, const RunInfo& info, const Breakdown* b,
                                       const std::map<int, double>& cpuWait, const DiagnoseOptions& o);

}  // namespace tpscope::analysis::detail
