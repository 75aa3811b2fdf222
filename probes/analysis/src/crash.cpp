#include "tpscope/analysis/crash.h"

#include <algorithm>
#include <cctype>
#include <map>

#include "analysis_internal.h"
#include "evidence_util.h"
#include "tpscope/tracedb/query.h"

namespace tpscope::analysis {

using tracedb::Query;

bool isCrashExitReason(std::string reason) {
  std::transform(reason.begin(), reason.end(), reason.begin(), [](unsigned char c) { return std::tolower(c); });
  // A launcher's verdict decides where there is one: `tpscope capture` writes "crash: ..." for a rank that died of a
  // signal it did not send (a SIGTERM from outside too), and "stopped by capture (...)" for the ranks it ended.
  if (reason.starts_with("crash")) return true;
  if (reason.starts_with("stopped by")) return false;
  // Stop signals are how a launcher ends a job (after a hang dump, on Ctrl-C): not a crash by themselves.
  for (const char* stop : {"sigterm", "sigint", "sigusr1", "sighup"})
    if (reason.find(stop) != std::string::npos) return false;
  for (const char* word : {"crash", "signal", "abort", "segfault", "sigsegv", "sigabrt", "sigbus", "sigfpe", "sigill",
                           "sigkill", "killed"})
    if (reason.find(word) != std::string::npos) return true;
  return false;
}

namespace {

using detail::field;

// analyzeRankEnds, with the collectives from `table` where given, else from a scan of the file.
tracedb::Result<std::vector<RankEnd>> rankEnds(tracedb::Reader& reader, const RunInfo& info,
                                               const detail::CollectiveTable* table) {
  std::map<int, RankEnd> ends;
  for (const auto& r : info.ranks) {
    RankEnd& e = ends[r.rank];
    e.rank = r.rank;
    e.exitReason = r.exitReason;
    e.crashed = isCrashExitReason(r.exitReason);
    e.lastRecordNs = INT64_MIN;
  }
  auto take = [&](int rank, int64_t t, int step) {
    RankEnd& e = ends[rank];
    e.rank = rank;
    e.lastRecordNs = std::max(e.lastRecordNs, t);
    e.lastStep = std::max(e.lastStep, step);
  };
  for (const RankExtent& x : info.spanExtents) take(x.rank, x.lastNs, x.lastStep);
  // Plain scans aggregated here: a GROUP BY would sort the table first.
  if (table) {
    for (const detail::CollectiveRecord& c : table->rows) take(c.rank, c.lastNs(), c.step);
  } else {
    Query q(reader, "SELECT rank, coalesce(end_ns, start_ns, enqueue_ns), step FROM collectives",
            "table 'collectives'");
    if (auto s = q.each([&](Query& r) { take(r.i32(0), r.i64(1), r.i32(2)); }); !s) return s;
  }
  {
    Query q(reader, "SELECT rank, coalesce(end_ns, begin_ns, 0), step FROM step_stats", "table 'step_stats'");
    if (auto s = q.each([&](Query& r) { take(r.i32(0), r.i64(1), r.i32(2)); }); !s) return s;
  }
  int64_t runLast = INT64_MIN, runFirst = info.beginNs;
  for (auto& [rank, e] : ends) runLast = std::max(runLast, e.lastRecordNs);
  const int64_t extent = std::max<int64_t>(0, runLast - runFirst);
  const int64_t slack = std::max<int64_t>(1'000'000, extent / 20);
  std::vector<RankEnd> out;
  for (auto& [rank, e] : ends) {
    int othersMaxStep = -1;
    for (auto& [r2, e2] : ends)
      if (r2 != rank) othersMaxStep = std::max(othersMaxStep, e2.lastStep);
    if (e.exitReason != "ok" && e.lastRecordNs != INT64_MIN && runLast - e.lastRecordNs > slack &&
        e.lastStep < othersMaxStep)
      e.stoppedEarly = true;
    out.push_back(e);
  }
  return out;
}

}  // namespace

tracedb::Result<std::vector<RankEnd>> analyzeRankEnds(tracedb::Reader& reader, const RunInfo& info) {
  return rankEnds(reader, info, nullptr);
}

tracedb::Result<std::vector<RankEnd>> detail::analyzeRankEnds(tracedb::Reader& reader, const RunInfo& info,
                                                               const CollectiveTable& table) {
  return rankEnds(reader, info, &table);
}

tracedb::Result<std::vector<Finding>> crashFindings(tracedb::Reader& reader, const std::vector<RankEnd>& ends,
                                                    const RunInfo& info) {
  std::vector<Finding> out;
  for (const RankEnd& e : ends) {
    if (!e.crashed && !e.stoppedEarly) continue;
    Finding fd;
    fd.kind = FindingKind::Crash;
    fd.severity = e.crashed ? Severity::Critical : Severity::Error;
    fd.rank = e.rank;
    fd.step = e.lastStep;
    std::string who = "rank " + std::to_string(e.rank);
    if (auto d = info.describeRank(e.rank); !d.empty()) who += " (" + d + ")";
    if (e.crashed) fd.message = who + " exited: " + e.exitReason;
    else fd.message = who + " stopped recording early" + (e.exitReason.empty() ? "" : " (exit: " + e.exitReason + ")");
    if (e.lastStep >= 0) fd.message += ", last step " + std::to_string(e.lastStep);
    fd.cite("ranks", {field("rank", int64_t{e.rank})});
    {
      Query q(reader,
              "SELECT n.value, s.begin_ns, s.step, s.layer FROM spans s LEFT JOIN strings n ON n.id = s.name"
              " WHERE s.rank = ? ORDER BY s.begin_ns DESC LIMIT 1",
              "table 'spans'");
      q.bind(1, int64_t{e.rank});
      auto s = q.each([&](Query& r) {
        fd.details.push_back("last span: " + r.text(0) + (r.i32(2) >= 0 ? ", step " + std::to_string(r.i32(2)) : "") +
                             (r.i32(3) >= 0 ? ", layer " + std::to_string(r.i32(3)) : ""));
        fd.cite("spans", {field("rank", int64_t{e.rank}), field("begin_ns", r.i64(1)), field("name", r.text(0))});
      });
      if (!s) return s;
    }
    {
      Query q(reader,
              "SELECT group_name, seq, op, state, callsite FROM collectives WHERE rank = ? ORDER BY enqueue_ns DESC"
              " LIMIT 1",
              "table 'collectives'");
      q.bind(1, int64_t{e.rank});
      auto s = q.each([&](Query& r) {
        fd.collective = CollectiveRef{r.text(0), r.i64(1), r.text(2)};
        fd.details.push_back("last collective: group " + r.text(0) + " seq " + std::to_string(r.i64(1)) + " " +
                             r.text(2) + " (" + r.text(3) + ")" + (r.view(4).empty() ? "" : " at " + r.text(4)));
        fd.cite("collectives",
                {field("rank", int64_t{e.rank}), field("group_name", r.text(0)), field("seq", r.i64(1))});
      });
      if (!s) return s;
    }
    if (e.crashed) {
      // Ranks that died on their own after this end began the job's stop went down with it (capture's verdict).
      constexpr std::string_view kEcho = "; it ended first: ";
      std::string echoes;
      for (const RankEnd& o : ends)
        if (const size_t at = o.exitReason.find(kEcho); o.rank != e.rank && at != std::string::npos)
          echoes += (echoes.empty() ? "" : ", ") + std::to_string(o.rank) + " (" +
                    o.exitReason.substr(at + kEcho.size()) + ")";
      if (!echoes.empty()) fd.details.push_back("went down with it before capture stopped them: rank " + echoes);
    }
    fd.number("last_record_ns", e.lastRecordNs);
    fd.number("exit_reason", e.exitReason);
    out.push_back(std::move(fd));
  }
  return out;
}

}  // namespace tpscope::analysis
