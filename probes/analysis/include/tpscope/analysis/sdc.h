// Silent data corruption: the live replica check's alerts (kind silent_corruption, raised by each suspect rank;
// core's replica_check.h and replica_vote.h) as findings.
//
// One finding per incident — the alerts of one (first step, tensor), one per suspect rank. rank: the suspect when
// a strict majority of the copies agreed (the rank that disagrees with the majority), else -1; ranks: every suspect
// (both ranks of a pair without majority). step: the first step whose state disagrees (exact for replicated
// tensors, dated by the fingerprint history; for a DP replica of a sharded tensor the check step, the earliest
// possible step in the details and numbers). layer: the tensor's. Severity critical. Evidence: the alert rows, and
// numbers tensor, check_step, earliest_step, copies, majority (0/1), tensors_disagreeing. Without a majority the
// details say what would decide between the copies (a replay from the last checkpoint, a third copy).
//
// Replicas that another fault parted (explainDivergences). The check compares bits: it cannot tell a flipped bit
// from copies that part because one rank's gradients were wrong. The analysis can. A silent_corruption finding whose
// state first disagrees at step S is the consequence of
//   1. a NaN/Inf origin at step S − 1 or S, where a suspect rank held non-finite values by step S (the origin, or a
//      rank the spread reached: NonFiniteReport::firstPerRank): copies computed from non-finite values are not
//      corrupt, and the NaN is the cause; else
//   2. the gradient of exactly one suspect rank standing out at step S − 1 or S — a grad_spike finding on that rank,
//      or a rank jump (anomalies.h: its total norm moved, no other rank's did): that rank is the suspect, and the
//      spike the cause. A rank jump that no grad_spike finding names becomes one (rankJumpFinding).
// Such a finding is marked a consequence: severity error, numbers secondary = 1, cause (the cause's kind name),
// cause_rank, cause_step; its message names the fault, the rank, the step and the tensor, and its evidence cites the
// rows that show the fault on the suspect. The root-cause chain hangs it under that cause (chain.h).
#pragma once

#include <vector>

#include "tpscope/analysis/anomalies.h"
#include "tpscope/analysis/finding.h"
#include "tpscope/analysis/nonfinite.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis {

tracedb::Result<std::vector<Finding>> silentCorruptionFindings(tracedb::Reader& reader);

// Marks the silent_corruption findings in `findings` that a NaN/Inf origin or a rank's gradient spike explains (see
// above) and appends the grad_spike findings of rank jumps that explain one. Either report may be null.
void explainDivergences(std::vector<Finding>& findings, const NonFiniteReport* nonfinite, const AnomalyReport* anomalies,
                        const AnomalyOptions& options = {});

}  // namespace tpscope::analysis
