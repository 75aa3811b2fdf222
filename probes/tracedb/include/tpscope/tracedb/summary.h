// Summaries written beside a run file's records (issue #17: compute at write time, read at open time). `tpscope
// merge`, capture's end and `tpscope import` write them once; the analyses read them instead of scanning every span.
// They are derived data: a file without them (older tpscope, a rank file, a file whose records changed since) is
// read by computing the same figures from the spans, so results never depend on whether they exist.
//
// Tables (docs/schema.md): rank_summary (one row per rank of the time breakdown: which lanes and step windows it was
// read on), step_summary (one row per rank and step window: the breakdown's time shares), phase_summary (per rank,
// span kind and phase: the union of those spans' time). Meta `summary.version` is the definition the producer
// computed them with (the analysis's kSummaryVersion: a reader with another definition ignores them),
// `summary.span_max_id` / `summary.collective_max_id` the records they were computed from.
//
// tracedb stores and loads the rows; what they mean is probes/analysis's (breakdown.h, report.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::tracedb {

struct RankSummaryRow {
  int rank = 0;
  std::string lanes;         // "host" | "device"
  std::string windowSource;  // "step_spans" | "step_stats" | "span_steps" | "whole_run"
};

struct StepSummaryRow {
  int rank = 0;
  int step = -1;
  int64_t beginNs = 0, endNs = 0;
  int64_t stepNs = 0, computeNs = 0, commNs = 0, exposedCommNs = 0, otherNs = 0, idleNs = 0, memcpyNs = 0;
  int64_t idleHostWaitNs = 0, idleKernelWaitNs = 0, idleOtherNs = 0;
};

struct PhaseSummaryRow {
  int rank = 0;
  int kind = 0;   // spans.kind
  int phase = 0;  // spans.phase
  int64_t busyNs = 0;  // |∪ of that rank's spans of this kind and phase|
};

struct RunSummary {
  int version = 0;
  std::vector<RankSummaryRow> ranks;   // by rank
  std::vector<StepSummaryRow> steps;   // by rank, step
  std::vector<PhaseSummaryRow> phases; // by rank, kind, phase
};

// Replaces the summaries of the run file at `path` (one transaction; the records are untouched) and stamps them
// with the file's current span and collective ids. Error: the file cannot be opened for writing or is not a trace.
Status writeSummary(const std::filesystem::path& path, const RunSummary& summary);

// The file's summaries when present, computed with definition `version`, and stamped with the records the file
// holds now; nullopt otherwise (the caller computes the figures itself). An error only for a damaged file.
Result<std::optional<RunSummary>> readSummary(Reader& reader, int version);

}  // namespace tpscope::tracedb
