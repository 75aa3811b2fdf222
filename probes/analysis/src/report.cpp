#include "tpscope/analysis/report.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <set>

#include "analysis_internal.h"
#include "tpscope/analysis/summary.h"
#include "tpscope/tracedb/query.h"

namespace tpscope::analysis {

using tracedb::Query;

tracedb::Result<Report> buildReport(tracedb::Reader& reader) {
  Report r;
  // The collectives are loaded once, for the run info and the collective analysis; where they cannot be, the run
  // info reads the file itself and the first failure is the one reported before.
  auto table = detail::loadCollectives(reader);
  auto info = table ? detail::loadRunInfo(reader, *table) : loadRunInfo(reader);
  if (!info) return info.status();
  r.info = std::move(*info);
  auto b = computeBreakdown(reader);
  if (!b) return b.status();
  r.breakdown = std::move(*b);
  if (!table) return table.status();
  r.collectives = detail::analyzeCollectives(*table, r.info);
  auto p = analyzePipeline(reader);
  if (!p) return p.status();
  r.pipeline = std::move(*p);
  const bool deviceLanes = std::any_of(r.breakdown.ranks.begin(), r.breakdown.ranks.end(),
                                       [](const RankBreakdown& rb) { return rb.lanes == Lanes::Device; });
  if (deviceLanes) {
    auto k = summarizeKernels(reader);
    if (!k) return k.status();
    r.kernels = std::move(*k);
  }
  return r;
}

tracedb::Result<PhaseProfile> profilePhases(tracedb::Reader& reader, const Report& report) {
  PhaseProfile p;
  p.ranks = static_cast<int>(report.breakdown.ranks.size());
  int steps = 0;
  for (const auto& rb : report.breakdown.ranks) steps = std::max(steps, rb.steps);
  p.steps = steps;
  const double rankSteps = std::max(1, p.ranks) * static_cast<double>(std::max(1, steps));
  p.stepNs = report.breakdown.steps.empty()
                 ? 0.0
                 : static_cast<double>(report.breakdown.run.stepNs) / static_cast<double>(report.breakdown.steps.size());

  // (kind, phase) → busy time summed over ranks: from the file's summaries, else from the spans.
  std::map<std::pair<int, int>, int64_t> byKey;
  {
    auto summary = tracedb::readSummary(reader, kSummaryVersion);
    if (!summary) return summary.status();
    std::vector<tracedb::PhaseSummaryRow> rows;
    if (*summary) {
      rows = std::move((*summary)->phases);
    } else {
      auto computed = phaseBusyFromRecords(reader);
      if (!computed) return computed.status();
      rows = std::move(*computed);
    }
    for (const auto& r : rows) byKey[{r.kind, r.phase}] += r.busyNs;
  }
  std::map<int, std::string> kinds, phases;
  {
    Query q(reader, "SELECT id, name FROM span_kinds", "table 'span_kinds'");
    if (auto s = q.each([&](Query& row) { kinds[row.i32(0)] = row.text(1); }); !s) return s;
    Query q2(reader, "SELECT id, name FROM phases", "table 'phases'");
    if (auto s = q2.each([&](Query& row) { phases[row.i32(0)] = row.text(1); }); !s) return s;
  }
  for (const auto& [key, total] : byKey) {
    PhaseTime t;
    t.kind = kinds.count(key.first) ? kinds[key.first] : std::to_string(key.first);
    t.phase = phases.count(key.second) ? phases[key.second] : std::to_string(key.second);
    t.nsPerRankStep = static_cast<double>(total) / rankSteps;
    p.phases.push_back(t);
  }

  std::map<std::pair<std::string, std::string>, CollectiveClassTime> classes;
  std::map<std::pair<std::string, std::string>, std::pair<double, double>> bw;  // bytes, latency·factor⁻¹
  std::map<std::pair<std::string, std::string>, std::set<std::string>> groups;
  std::map<std::pair<std::string, std::string>, int64_t> counts, stepsMax;
  for (const CollectiveStats& s : report.collectives.stats) {
    const auto key = std::make_pair(groupClass(s.group), s.op);
    CollectiveClassTime& c = classes[key];
    c.groupClass = key.first;
    c.op = key.second;
    c.meanLatencyNs += static_cast<double>(s.latencyNs);
    c.meanTimeNs += static_cast<double>(s.totalNs);
    counts[key] += s.count;
    groups[key].insert(s.group);
    stepsMax[key] = std::max(stepsMax[key], s.steps);
    bw[key].first += static_cast<double>(s.bytes);
    bw[key].second += s.busbwGbps > 0 ? static_cast<double>(s.latencyNs) / (s.busbwGbps / s.algbwGbps) : 0.0;
  }
  for (auto& [key, c] : classes) {
    const double n = static_cast<double>(std::max<int64_t>(1, counts[key]));
    c.meanLatencyNs /= n;
    c.meanTimeNs /= n;
    c.countPerStep = static_cast<double>(counts[key]) / static_cast<double>(groups[key].size()) /
                     static_cast<double>(std::max<int64_t>(1, stepsMax[key]));
    c.busbwGbps = bw[key].second > 0 ? bw[key].first / bw[key].second : 0.0;
    p.collectives.push_back(c);
  }
  return p;
}

RunDiff diffProfiles(const PhaseProfile& a, const PhaseProfile& b) {
  RunDiff d;
  d.stepsA = a.steps;
  d.stepsB = b.steps;
  d.ranksA = a.ranks;
  d.ranksB = b.ranks;
  d.entries.push_back(DiffEntry{"step time", a.stepNs, b.stepNs, "ns"});
  std::vector<DiffEntry> phases, colls;
  std::map<std::string, std::pair<double, double>> pm;
  for (const auto& t : a.phases) pm[t.kind + "/" + t.phase].first = t.nsPerRankStep;
  for (const auto& t : b.phases) pm[t.kind + "/" + t.phase].second = t.nsPerRankStep;
  for (const auto& [k, v] : pm) phases.push_back(DiffEntry{"phase " + k + " per rank-step", v.first, v.second, "ns"});
  std::map<std::string, std::array<double, 8>> cm;
  for (const auto& c : a.collectives) {
    auto& v = cm[c.groupClass + " " + c.op];
    v[0] = c.meanLatencyNs;
    v[2] = c.countPerStep;
    v[4] = c.busbwGbps;
    v[6] = c.meanTimeNs;
  }
  for (const auto& c : b.collectives) {
    auto& v = cm[c.groupClass + " " + c.op];
    v[1] = c.meanLatencyNs;
    v[3] = c.countPerStep;
    v[5] = c.busbwGbps;
    v[7] = c.meanTimeNs;
  }
  for (const auto& [k, v] : cm) {
    colls.push_back(DiffEntry{"collective " + k + " latency", v[0], v[1], "ns"});
    colls.push_back(DiffEntry{"collective " + k + " mean time", v[6], v[7], "ns"});
    colls.push_back(DiffEntry{"collective " + k + " per group-step", v[2], v[3], "count"});
    colls.push_back(DiffEntry{"collective " + k + " busbw", v[4], v[5], "GB/s"});
  }
  auto byChange = [](const DiffEntry& x, const DiffEntry& y) {
    const double cx = std::fabs(x.a != 0 ? x.changePct() : (x.b != 0 ? 1e300 : 0));
    const double cy = std::fabs(y.a != 0 ? y.changePct() : (y.b != 0 ? 1e300 : 0));
    return cx != cy ? cx > cy : x.what < y.what;
  };
  std::stable_sort(phases.begin(), phases.end(), byChange);
  std::stable_sort(colls.begin(), colls.end(), byChange);
  d.entries.insert(d.entries.end(), phases.begin(), phases.end());
  d.entries.insert(d.entries.end(), colls.begin(), colls.end());
  return d;
}

}  // namespace tpscope::analysis
