// Live stall diagnosis: the culprit of a hang named while the job still runs, from the ranks' flight-recorder records
// alone (capture's watcher and `tpscope watch` read them from the live rank files, a few times a second).
//
// Input, per rank: its newest collective of each process group (tracedb::Reader::newestCollectives), the span it
// wrote last, how long its records have not grown, and whether its process has exited. Definitions:
//   blocked in (G, s)  a rank whose records have not grown for `after`, whose latest-entered incomplete collective
//                      (over its groups) is in G, entered at least `after` ago, and s is its first incomplete seq of G
//                      (an async collective still in flight before the one it waits in is the one peers may lack)
//   missing from (G, s) a member of G whose newest seq in G is below s: it has not entered the collective its peers
//                      wait in. Its context: its own newest collective of G (what it did last there), whether it is
//                      itself blocked elsewhere (then the wait is a consequence: its own stall names the cause), the
//                      span it wrote last and how long it has been silent, or that its process exited; and where
//                      it is now: the span open on it (meta open_spans, written by its recorder at every flush) —
//                      stuck in compute where that is a compute span open for ≥ `after` and ≥ 10 × its median step
//                      (stuck in data loading, stuck inside <span> for the other kinds), "entering it" where no span
//                      of its own is open (it is between operations: on its way into the collective, or in code
//                      tpscope does not record)
// Kinds, per (G, s) some rank is blocked in:
//   waiting    some member is missing from it (a hang, or a rank merely late: the line goes when it enters)
//   desync     every member entered it, their records disagree on op, size or dtype (desync.h's match states)
//   stuck      every member entered it, records agree, none completed (a collective that does not finish)
// Not a stall either: a wait whose every missing rank is inside its own work for less than two of its median steps
// (a pipeline stage in a long pass: the work, not a hang; named once it lasts longer), or inside a collective of its
// own it is not yet seen blocked in (the next polls say whether this wait is that one's consequence).
// No stall while any rank is still recording (a long step every rank takes together blocks no one in a collective;
// a rank that is late only delays the others less than `after`). A group member no rank file was read for is left
// out (another node's rank): `unwatched` counts them.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tpscope/analysis/desync.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/records.h"

namespace tpscope::analysis {

// A span open on a rank's thread (meta open_spans: probes' ThreadBuffer::open).
struct OpenSpanInfo {
  int thread = 0;
  std::string name;
  int kind = 0;     // probes::SpanKind
  int layer = -1;
  int64_t beginNs = 0;
};
// Parses meta open_spans ("[]" or absent: none; malformed: none).
std::vector<OpenSpanInfo> parseOpenSpans(std::string_view json);

struct LiveRankState {
  int rank = 0;
  bool seen = false;    // its file has been read
  bool exited = false;  // its process ended (known to the launcher only)
  std::vector<tracedb::CollectiveRow> newest;    // per group, its collective of the highest seq and its first
                                                 // incomplete one (Reader::newestCollectives)
  std::optional<tracedb::NamedSpan> lastSpan;    // the span it wrote last
  int64_t quietNs = 0;                           // how long its records have not grown
  std::vector<OpenSpanInfo> open;                // spans open on its threads at its last flush, outermost first
  bool openKnown = false;                        // its file publishes them (meta open_spans)
  int64_t medianStepNs = 0;                      // median of its recent steps' durations (0: none finished yet)
};

struct LiveGroup {
  std::string name;
  std::vector<int> ranks;
};

enum class StallKind : uint8_t { Waiting, Desync, Stuck };
const char* stallKindName(StallKind kind);  // "waiting", "desync", "stuck"

struct StalledRank {
  int rank = 0;
  int64_t blockedNs = 0;  // since it entered the collective
};

// Where a rank that has not entered the collective is: stuck in compute (or data loading, or inside another span of
// its own), entering it (no span of its own open), blocked elsewhere, exited.
// Unknown: its file does not say which spans are open (a recorder before open_spans, a Python program's spans).
enum class MissingState : uint8_t { Unknown, Entering, Compute, Data, Inside, Blocked, Exited };
// "unknown", "entering", "compute", "data", "inside", "blocked", "exited"
const char* missingStateName(MissingState state);

struct MissingRank {
  int rank = 0;
  MissingState state = MissingState::Unknown;
  std::optional<OpenSpanInfo> inside;  // the innermost span of its own open on it (not the step's, not a wait)
  int64_t insideNs = 0;                // for how long
  int64_t medianStepNs = 0;
  bool stuck = false;                  // inside it for ≥ `after` and ≥ 10 × its median step
  bool openKnown = false;              // its file says which spans are open
  bool inCollective = false;           // its innermost open span is a collective's or a wait's
  std::optional<tracedb::CollectiveRow> last;    // its newest collective of the group
  std::optional<tracedb::CollectiveRow> blockedIn;  // where it is itself blocked, if it is
  std::optional<tracedb::NamedSpan> lastSpan;
  int64_t quietNs = 0;
  bool exited = false;
};

struct LiveStall {
  StallKind kind = StallKind::Waiting;
  std::string group;
  int64_t seq = 0;
  tracedb::CollectiveRow record;        // the first blocked rank's record of (group, seq)
  std::vector<StalledRank> blocked;     // by rank
  std::vector<MissingRank> missing;     // by rank (waiting)
  MatchState match = MatchState::FullyMatched;  // desync: how the members' records disagree
  std::vector<tracedb::CollectiveRow> records;  // desync: every member's record of (group, seq)
  int64_t blockedNs = 0;  // since the last blocked rank entered (how long the whole wait has lasted)
  int unwatched = 0;      // members without a watched rank file
  bool secondary() const;  // waiting only on ranks that are themselves blocked elsewhere
  // Identity of the situation: kind, group, seq, blocked and missing ranks. A new key is a change worth a line.
  std::string key() const;
};

struct LiveStallOptions {
  int64_t afterNs = 1'500'000'000;  // blocked at least this long (and silent as long) before a stall is named
};

// Stalls ordered by cause first: those waiting on a rank that is not itself blocked, then the consequences; then by
// group, seq.
std::vector<LiveStall> detectStalls(std::span<const LiveGroup> groups, std::span<const LiveRankState> ranks,
                                    int64_t nowNs, const LiveStallOptions& options = {});

// One line, e.g. "WAITING  tp-0 seq 53 (embedding VocabParallel forward all-reduce, step 5): rank 0 blocked 1.7 s;
// rank 1 has not entered it (last: seq 52 gradient global norm over TP optimizer all-reduce, step 4; span "data
// loading" step 5, silent 1.3 s)".
std::string stallLine(const LiveStall& stall);
// The line said when a stall's situation ends: "RESUMED  tp-0 seq 53 after 3.4 s: ..." (what changed, from `now`:
// the ranks that were missing and are not any more, or the job that moves).
std::string resumedLine(const LiveStall& before, double blockedS);

}  // namespace tpscope::analysis
