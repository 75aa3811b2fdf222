// Desync and deadlock analysis over the flight-recorder records (collectives table), after PyTorch's
// flight-recorder analyzer (torch/distributed/flight_recorder): per process group (members R: process_groups.ranks,
// else the ranks seen in its records), each member's progress, the stuck sequence number, the members that never
// entered it, and a match state per (group, seq).
//
// A type/size/dtype mismatch is a desync; a stuck seq is a hang, or a consequence of another group's hang when every
// missing rank is held there. Ranks of an imported Flight Recorder folder that left no dump
// (RunInfo::missingRankDumps) are not judged; one warning (kind crash) names them and the groups in which only the
// others were compared. docs/diagnosis.md ("Desync and hang") has the rules in full.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tpscope/analysis/finding.h"
#include "tpscope/analysis/run_info.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/records.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis {

// Match state of one (group, seq), comparing the members' records in this order: type, size, dtype, state,
// undecided, else fully matched.
enum class MatchState : uint8_t {
  FullyMatched,
  CollectiveTypeMismatch,  // ops differ
  // input numel (or shape) differ (all_gather/reduce_scatter: input numel must agree too; all_to_all is exempt from
  // size and dtype checks: uneven splits are legitimate)
  SizeMismatch,
  StateMismatch,  // some members completed it and others did not (or timed out / failed)
  DtypeMismatch,  // dtypes differ
  Undecided,      // fewer than two members recorded it, so nothing can be compared
};
// "fully_matched", "collective_type_mismatch", "size_mismatch", "state_mismatch", "dtype_mismatch", "undecided"
const char* matchStateName(MatchState state);

// One member's view of one (group, seq), or of its progress.
struct MemberRecord {
  int rank = 0;
  std::string op, dtype, callsite, state;  // state: "scheduled", "started", "completed", "timed_out", "failed"
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t bytes = 0;
  int step = -1, layer = -1;
  int64_t enqueueNs = 0;
  std::optional<int64_t> startNs, endNs;
  // Records of a mismatched seq only: numel of the same rank's first record of the same call site a step before (which
  // of two disagreeing ranks changed its size).
  std::optional<int64_t> previousNumel;
};

// The last span a rank recorded (what a rank that never entered a collective was doing).
struct LastSpan {
  std::string name, kind, phase;
  int step = -1, layer = -1;
  int64_t beginNs = 0, endNs = 0;
};

struct MemberProgress {
  int rank = 0;
  int64_t lastEnqueued = 0;   // max seq of its records; 0: no record in this group
  int64_t lastStarted = 0;    // max seq with state ≥ started (or start_ns set)
  int64_t lastCompleted = 0;  // max seq with state completed (or end_ns set)
  std::optional<MemberRecord> lastRecord;  // its record of lastEnqueued
  std::optional<LastSpan> lastSpan;        // filled for missing ranks of a stuck seq
  // For a missing rank: when (its own clock) it entered the stuck seq's call site in the step before the stuck one —
  // where that collective lies in its program order, to tell which of two stuck groups it would have reached first.
  std::optional<int64_t> previousStepEnqueueNs;
};

// The match state of one (group, seq) from its members' records (the order above).
MatchState classifyRecords(const std::vector<MemberRecord>& records);

struct SeqMismatch {
  int64_t seq = 0;
  MatchState state = MatchState::FullyMatched;
  std::vector<MemberRecord> records;  // by rank
  std::vector<MemberRecord> next;     // the records of seq + 1, by rank: a rank whose seq + 1 is what the others
                                      // issued at seq issued one collective more than they did (an extra call)
};

struct GroupDesync {
  std::string group;
  std::vector<int> members;
  std::vector<MemberProgress> progress;  // by rank
  // The smallest seq ≤ max last_enqueued that some member has not completed; none when every member completed every
  // seq it recorded and all members reached the same last seq.
  std::optional<int64_t> stuckSeq;
  MatchState stuckState = MatchState::FullyMatched;  // match state of the stuck seq among those that entered it
  std::vector<int> missingRanks;   // never entered the stuck seq
  std::vector<int> waitingRanks;   // entered it, did not complete
  std::vector<MemberRecord> stuckRecords;  // the records of the stuck seq, by rank
  std::vector<SeqMismatch> mismatches;     // every (group, seq) whose state is a type/size/dtype mismatch, by seq
                                           // (at most 100 kept; `mismatchCount` counts all)
  int64_t mismatchCount = 0;
  bool healthy() const { return !stuckSeq && mismatches.empty(); }
};

struct DesyncReport {
  std::vector<GroupDesync> groups;  // by name
};

tracedb::Result<DesyncReport> analyzeDesync(tracedb::Reader& reader, const RunInfo& info);
// Findings from the report: desync (per mismatched seq, first few per group) and hang (per stuck group).
// A desync is an error, critical when it is also the stuck seq. Its odd ranks: the minority; a rank whose record of
// seq + 1 equals the others' record of seq while theirs of seq + 1 differs from it (it issued one collective more,
// and the rest of its sequence is shifted by one); else, on a tie, those whose size changed since the step before,
// else all but the first variant.
// A hang is critical — unless every missing rank is itself waiting in another group's stuck seq, or is missing from
// another stuck seq that comes earlier (in the missing rank's own program order, when it entered both call sites in
// the step before, by its own clock; else by its peers' arrival): then it is a consequence of that hang (error,
// evidence "secondary" = 1). Evidence: the collectives rows of the stuck seq and each missing rank's last collective
// and last span. On a point-to-point pair (p2p-<src>-<dst>) whose missing rank waits in a transfer of the same
// direction with a third rank, the hang says so: the peers disagree (evidence "p2p_peer_mismatch" = 1).
std::vector<Finding> desyncFindings(const DesyncReport& report, const RunInfo& info);

}  // namespace tpscope::analysis
