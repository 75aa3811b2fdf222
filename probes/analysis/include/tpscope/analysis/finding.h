// Findings: the one currency of every analysis. A finding says what is wrong (kind, severity), where (rank, step,
// layer, collective), in one human sentence (message, plus optional detail lines), and cites its evidence: the rows
// of the trace it rests on (table + key columns) and the numbers it computed from them.
//
// The JSON form (json_output.h, docs/diagnosis.md) is a stable contract for automation: kind, severity and the
// evidence field names never change meaning within a major version; new fields may be added.
//
// Plain data: copyable, no references into a Reader, safe to move across threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "tpscope/vocabulary/severity.h"

namespace tpscope::analysis {

// The one severity scale (tpscope/vocabulary/severity.h), ordered most severe first: sorting by the enum value puts
// critical findings on top.
using vocabulary::Severity;
using vocabulary::severityName;   // "critical", "error", "warning", "info"
using vocabulary::parseSeverity;
using vocabulary::storedSeverity;  // an alert's stored name; unknown names grade as warnings

enum class FindingKind : uint8_t {
  NanOrigin,          // first NaN: (step, rank, layer, param/phase), told apart from ranks that only received it
  InfOrigin,          // the same for ±Inf without NaN
  GradSpike,          // a gradient norm far above its robust baseline (median/MAD over previous steps)
  LossSpike,          // a loss far above its robust baseline
  ReplicaDivergence,  // values that must agree across ranks (post-reduction grad norm, DP replicas) do not
  Desync,             // ranks disagree on what one (group, seq) is: op, size, dtype (flight-recorder match states)
  Hang,               // a (group, seq) some members never entered or never completed at the end of the run
  Straggler,          // a rank that arrives last at collectives and makes the others wait
  Crash,              // a rank that exited by crash/signal, or whose records stop early
  CommOverhead,       // exposed (non-overlapped) communication above a threshold of step time
  StageImbalance,     // a pipeline stage computes markedly more per step than the others: the pipeline waits on it
  PipelineHang,       // a hang on a pipeline point-to-point message, named by (src, dst, seq), stage and micro-batch
  SilentCorruption,   // a copy of state that is bitwise identical across ranks by construction differs (SDC)
  Replay,             // `tpscope replay`'s verdict on a step: reproducible (the operator named), transient or clean
};
inline constexpr size_t kFindingKindCount = 14;
std::string_view findingKindName(FindingKind kind);  // "nan_origin", "inf_origin", "grad_spike", ...
std::optional<FindingKind> parseFindingKind(std::string_view name);

// The (group, seq) that joins the ranks' views of one collective.
struct CollectiveRef {
  std::string group;  // process-group name, e.g. "tp-1"
  int64_t seq = -1;   // per-group sequence number
  std::string op;     // "all_reduce", ... ("" when the members disagree or none recorded it)
  bool operator==(const CollectiveRef&) const = default;
};

// A value in evidence: integer (ids, ranks, ns, bytes, counts), real (norms, ratios) or text (names, states).
using EvidenceValue = std::variant<int64_t, double, std::string>;

struct EvidenceField {
  std::string name;  // snake_case; units in the name where they apply: "wait_ns", "bytes", "busbw_gbps"
  EvidenceValue value;
  bool operator==(const EvidenceField&) const = default;
};

// One cited row: the table and the columns that identify it, e.g.
// {"collectives", {rank: 1, group_name: "tp-0", seq: 7}} or {"grad_stats", {rank: 2, step: 5, param: "..."}}.
// Key columns are the table's natural key (never SQLite rowids, which are not stable across merges).
struct EvidenceRow {
  std::string table;
  std::vector<EvidenceField> key;
  bool operator==(const EvidenceRow&) const = default;
};

struct Evidence {
  std::vector<EvidenceRow> rows;       // at most kMaxEvidenceRows, most telling first; `rowsOmitted` counts the rest
  int64_t rowsOmitted = 0;
  std::vector<EvidenceField> numbers;  // the figures the finding computed ("wait_ns", "median", "mad", ...)
  bool operator==(const Evidence&) const = default;
};
inline constexpr size_t kMaxEvidenceRows = 16;

struct Finding {
  FindingKind kind = FindingKind::CommOverhead;
  Severity severity = Severity::Info;
  int rank = -1;   // the rank the finding is about (origin, straggler, missing rank...); -1: the whole run/group
  int step = -1;   // -1: not tied to a step
  int layer = -1;  // -1: not tied to a layer
  std::optional<CollectiveRef> collective;
  std::vector<int> ranks;            // other ranks involved; meaning per kind (docs/diagnosis.md): receivers of a
                                     // NaN, ranks that never entered a hung seq, ranks that waited on a straggler...
  std::string message;               // one line, no trailing newline
  std::vector<std::string> details;  // further lines for humans (spread path, callsites, last spans)
  Evidence evidence;

  // Builders for the evidence (keep analysis code short).
  Finding& cite(std::string table, std::vector<EvidenceField> key);
  Finding& number(std::string name, EvidenceValue value);
};

// Most severe first; ties by kind, step, rank, layer, group, seq, message (a total, deterministic order).
bool findingLess(const Finding& a, const Finding& b);
void sortFindings(std::vector<Finding>& findings);

}  // namespace tpscope::analysis
