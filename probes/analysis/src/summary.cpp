#include "tpscope/analysis/summary.h"

#include <map>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>

#include "breakdown_internal.h"
#include "intervals.h"
#include "tpscope/tracedb/lane_summary.h"
#include "tpscope/tracedb/query.h"
#include "workers.h"

namespace tpscope::analysis {

namespace {

StepSource parseStepSource(std::string_view name) {
  for (StepSource s : {StepSource::StepSpans, StepSource::StepStats, StepSource::SpanSteps, StepSource::WholeRun})
    if (name == stepSourceName(s)) return s;
  return StepSource::WholeRun;
}

TimeShares sharesOf(const tracedb::StepSummaryRow& r) {
  TimeShares t;
  t.stepNs = r.stepNs;
  t.computeNs = r.computeNs;
  t.commNs = r.commNs;
  t.exposedCommNs = r.exposedCommNs;
  t.otherNs = r.otherNs;
  t.idleNs = r.idleNs;
  t.memcpyNs = r.memcpyNs;
  t.idleHostWaitNs = r.idleHostWaitNs;
  t.idleKernelWaitNs = r.idleKernelWaitNs;
  t.idleOtherNs = r.idleOtherNs;
  return t;
}

tracedb::StepSummaryRow rowOf(const StepBreakdown& s) {
  tracedb::StepSummaryRow r;
  r.rank = s.rank;
  r.step = s.step;
  r.beginNs = s.beginNs;
  r.endNs = s.endNs;
  r.stepNs = s.time.stepNs;
  r.computeNs = s.time.computeNs;
  r.commNs = s.time.commNs;
  r.exposedCommNs = s.time.exposedCommNs;
  r.otherNs = s.time.otherNs;
  r.idleNs = s.time.idleNs;
  r.memcpyNs = s.time.memcpyNs;
  r.idleHostWaitNs = s.time.idleHostWaitNs;
  r.idleKernelWaitNs = s.time.idleKernelWaitNs;
  r.idleOtherNs = s.time.idleOtherNs;
  return r;
}

}  // namespace

Breakdown breakdownFromSummary(const tracedb::RunSummary& summary) {
  Breakdown out;
  std::map<int, RankBreakdown> ranks;
  for (const auto& r : summary.ranks) {
    RankBreakdown& rb = ranks[r.rank];
    rb.rank = r.rank;
    rb.lanes = r.lanes == lanesName(Lanes::Device) ? Lanes::Device : Lanes::Host;
    rb.source = parseStepSource(r.windowSource);
  }
  for (const auto& r : summary.steps) {  // by rank, then step: the order computeBreakdownFromRecords gives
    StepBreakdown sb;
    sb.rank = r.rank;
    sb.step = r.step;
    sb.beginNs = r.beginNs;
    sb.endNs = r.endNs;
    sb.time = sharesOf(r);
    RankBreakdown& rb = ranks[r.rank];
    rb.rank = r.rank;
    rb.time += sb.time;
    ++rb.steps;
    out.steps.push_back(sb);
  }
  for (auto& [rank, rb] : ranks) {
    if (out.ranks.empty()) out.source = rb.source;
    out.run += rb.time;
    out.ranks.push_back(rb);
  }
  return out;
}

tracedb::Result<std::vector<tracedb::PhaseSummaryRow>> phaseBusyFromRecords(tracedb::Reader& reader) {
  // (rank, kind, phase) → intervals; unions so nested spans count once. Steps contain the phases: left out.
  detail::PhaseIntervals byKey;
  const std::string sql = "SELECT rank, kind, phase, begin_ns, dur_ns FROM spans WHERE kind != " +
                          std::to_string(static_cast<int>(tracedb::SpanKind::Step));
  tracedb::Query q(reader, sql, "table 'spans'");
  auto s = q.each([&](tracedb::Query& row) {
    const int64_t b = row.i64(3);
    byKey[{row.i32(0), row.i32(1), row.i32(2)}].emplace_back(b, b + row.i64(4));
  });
  if (!s) return s;
  std::vector<tracedb::PhaseSummaryRow> rows;
  while (!byKey.empty()) detail::takePhaseRows(byKey, std::get<0>(byKey.begin()->first), rows);
  return rows;
}

tracedb::Result<tracedb::RunSummary> summaryFromRecords(tracedb::Reader& reader) {
  std::vector<tracedb::PhaseSummaryRow> phases;  // the phases' busy time from the breakdown's own pass over the spans
  auto b = detail::breakdownAndPhases(reader, &phases);
  if (!b) return b.status();
  tracedb::RunSummary s;
  s.version = kSummaryVersion;
  for (const auto& r : b->ranks) s.ranks.push_back({r.rank, lanesName(r.lanes), stepSourceName(r.source)});
  for (const auto& st : b->steps) s.steps.push_back(rowOf(st));
  s.phases = std::move(phases);
  return s;
}

// The lane summary's pass over the spans runs beside the breakdown's (each only reads, on its own connection; a
// 64-rank import of 422 k spans, where the breakdown has one thread: 1.16 s -> ~1.0 s), then both are written.
tracedb::Status writeRunSummary(const std::filesystem::path& path) {
  std::optional<tracedb::Result<tracedb::LaneSummary>> lanes;
  std::thread laneThread;
  if (detail::workersOn()) laneThread = std::thread([&]() { lanes = tracedb::computeLaneSummary(path); });
  tracedb::Result<tracedb::RunSummary> summary = [&]() -> tracedb::Result<tracedb::RunSummary> {
    auto reader = tracedb::Reader::open(path);
    if (!reader) return reader.status();
    return summaryFromRecords(**reader);
  }();  // the reader is closed before the file is written
  if (laneThread.joinable()) laneThread.join();
  if (!summary) return summary.status();
  if (!lanes) lanes = tracedb::computeLaneSummary(path);
  if (!*lanes) return lanes->status();
  if (tracedb::Status s = tracedb::writeSummary(path, *summary); !s) return s;
  return tracedb::writeLaneSummary(path, **lanes);  // the viewer's first frame (tracedb/lane_summary.h)
}

}  // namespace tpscope::analysis
