// Silent data corruption: the live replica check's alerts (kind silent_corruption, raised by each suspect rank;
// core's replica_check.h and replica_vote.h) as findings.
//
// One finding per incident — the alerts of one (first step, tensor), one per suspect rank. rank: the suspect when
// a strict majority of the copies agreed (the rank that disagrees with the majority), else -1; ranks: every suspect
// (both ranks of a pair without majority). step: the first step whose state disagrees (exact for replicated
// tensors, dated by the fingerprint history; for a DP replica of a sharded tensor the check step, the earliest
// possible step in the details and numbers). layer: the tensor's. Severity critical. Evidence: the alert rows, and
// numbers tensor, check_step, earliest_step, copies, majority (0/1), tensors_disagreeing.
#pragma once

#include <vector>

#include "tpscope/analysis/finding.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis {

tracedb::Result<std::vector<Finding>> silentCorruptionFindings(tracedb::Reader& reader);

}  // namespace tpscope::analysis
