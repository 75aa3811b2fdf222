#include "tpscope/analysis/pipeline.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "analysis_internal.h"
#include "intervals.h"
#include "stragglers.h"
#include "tpscope/analysis/run_info.h"
#include "tpscope/tracedb/query.h"
#include "tpscope/vocabulary/spike_baseline.h"

namespace tpscope::analysis {

namespace {

using detail::Interval;
using detail::IntervalSet;

struct RankStep {
  std::vector<Interval> passes, transfers;
  std::vector<Interval> collectives;  // the rank's own collectives other than point to point (TP, DP, ...)
  int64_t firstBackwardBegin = INT64_MAX, lastForwardEnd = INT64_MIN;
  int64_t begin = INT64_MAX, end = INT64_MIN;  // of the passes
};

using Layout = detail::PipelineLayout;

// The layout the pipeline analysis can use: two stages or more, every rank's stage known.
std::optional<Layout> readLayout(tracedb::Reader& reader) {
  auto layout = detail::readPipelineLayout(reader);
  if (!layout || layout->stages < 2 || layout->stageOfRank.empty()) return std::nullopt;
  if (std::any_of(layout->stageOfRank.begin(), layout->stageOfRank.end(), [](int s) { return s < 0; }))
    return std::nullopt;
  return layout;
}

// Pass spans "forward mb K" / "backward mb K" [" chunk C"] by (rank, step).
tracedb::Status readPasses(tracedb::Reader& reader, std::map<std::pair<int, int>, RankStep>& out) {
  tracedb::Query q(reader,
                   "SELECT s.rank, s.step, substr(n.value, 1, 1), s.begin_ns, s.begin_ns + s.dur_ns FROM spans s "
                   "JOIN strings n ON n.id = s.name WHERE s.kind = 0 AND (n.value LIKE 'forward mb %' OR n.value "
                   "LIKE 'backward mb %')",
                   "pipeline pass spans");
  return q.each([&](tracedb::Query& r) {
    RankStep& rs = out[{r.i32(0), r.i32(1)}];
    const bool forward = r.view(2) == "f";
    const int64_t b = r.i64(3), e = r.i64(4);
    rs.passes.push_back({b, e});
    rs.begin = std::min(rs.begin, b);
    rs.end = std::max(rs.end, e);
    if (forward) rs.lastForwardEnd = std::max(rs.lastForwardEnd, e);
    else rs.firstBackwardBegin = std::min(rs.firstBackwardBegin, b);
  });
}

// Transfer intervals: a receive from when the peer posted the send (or when the receive began, if later) to its
// end; the time blocked in "send wait".
tracedb::Status readTransfers(tracedb::Reader& reader, std::map<std::pair<int, int>, RankStep>& out) {
  std::map<std::pair<std::string, int64_t>, int64_t> posted;  // (p2p group, seq) -> send enqueue
  struct Recv {
    int rank, step;
    std::string group;
    int64_t seq, begin, end;
  };
  std::vector<Recv> recvs;
  tracedb::Query q(reader,
                   "SELECT rank, step, group_name, seq, op, enqueue_ns, end_ns FROM collectives WHERE op IN "
                   "('send', 'recv') AND group_name LIKE 'p2p-%'",
                   "point-to-point records");
  auto st = q.each([&](tracedb::Query& r) {
    if (r.view(4) == "send") {
      posted[{r.text(2), r.i64(3)}] = r.i64(5);
    } else if (auto end = r.optI64(6)) {
      recvs.push_back({r.i32(0), r.i32(1), r.text(2), r.i64(3), r.i64(5), *end});
    }
  });
  if (!st) return st;
  for (const Recv& rv : recvs) {
    auto it = posted.find({rv.group, rv.seq});
    const int64_t from = it == posted.end() ? rv.begin : std::max(rv.begin, it->second);
    if (rv.end > from) out[{rv.rank, rv.step}].transfers.push_back({from, rv.end});
  }
  tracedb::Query w(reader,
                   "SELECT s.rank, s.step, s.begin_ns, s.begin_ns + s.dur_ns FROM spans s JOIN strings n ON n.id = "
                   "s.name WHERE s.kind = 1 AND n.value = 'send wait'",
                   "send waits");
  return w.each([&](tracedb::Query& r) { out[{r.i32(0), r.i32(1)}].transfers.push_back({r.i64(2), r.i64(3)}); });
}

// The rank's collectives other than point to point, from when it entered them to their end: inside a pass span they
// are the stage's TP communication, including the wait for a slower TP peer, not the stage's own compute.
tracedb::Status readCollectives(tracedb::Reader& reader, std::map<std::pair<int, int>, RankStep>& out) {
  tracedb::Query q(reader,
                   "SELECT rank, step, enqueue_ns, end_ns FROM collectives WHERE end_ns IS NOT NULL AND group_name "
                   "NOT LIKE 'p2p-%'",
                   "collectives in passes");
  return q.each([&](tracedb::Query& r) {
    auto it = out.find({r.i32(0), r.i32(1)});
    if (it != out.end() && r.i64(3) > r.i64(2)) it->second.collectives.push_back({r.i64(2), r.i64(3)});
  });
}

}  // namespace

double analyticPipelineBubble(const std::string& schedule, int p, int m, int v) {
  if (p < 1 || m < 1) return 0;
  if (schedule != "interleaved") v = 1;
  return static_cast<double>(p - 1) / (static_cast<double>(std::max(v, 1)) * m + p - 1);
}

tracedb::Result<PipelineReport> analyzePipeline(tracedb::Reader& reader) {
  PipelineReport out;
  const std::optional<Layout> layout = readLayout(reader);
  if (!layout) return out;
  std::map<std::pair<int, int>, RankStep> byRankStep;
  if (auto st = readPasses(reader, byRankStep); !st) return st;
  if (byRankStep.empty()) return out;
  if (auto st = readTransfers(reader, byRankStep); !st) return st;
  if (auto st = readCollectives(reader, byRankStep); !st) return st;

  const Layout& l = *layout;
  out.present = true;
  out.schedule = l.schedule;
  out.stages = l.stages;
  out.microbatches = l.microbatches;
  out.virtualStages = l.virtualStages;
  out.analyticBubblePct = 100.0 * analyticPipelineBubble(l.schedule, l.stages, l.microbatches, l.virtualStages);
  const int world = static_cast<int>(l.stageOfRank.size());
  auto stageOf = [&](int rank) { return rank >= 0 && rank < world ? l.stageOfRank[rank] : -1; };
  // A rank's pipeline: its place among its stage's ranks in rank order — (DP, TP) in Megatron's order (TP fastest,
  // then DP, then PP, where it is rank mod ranks-per-stage), and the same for an engine that orders PP fastest.
  std::vector<int> pipelineOf(static_cast<size_t>(world), -1);
  {
    std::map<int, int> seen;  // stage -> ranks of it so far
    for (int r = 0; r < world; ++r)
      if (stageOf(r) >= 0) pipelineOf[static_cast<size_t>(r)] = seen[stageOf(r)]++;
  }
  auto pipeline = [&](int rank) { return rank >= 0 && rank < world ? pipelineOf[static_cast<size_t>(rank)] : -1; };

  // The window of each (pipeline, step): first pass begun to last pass ended over the pipeline's stages.
  std::map<std::pair<int, int>, Interval> window;
  std::set<int> steps;
  for (const auto& [key, rs] : byRankStep) {
    if (rs.passes.empty()) continue;
    steps.insert(key.second);
    if (pipeline(key.first) < 0) continue;
    auto [it, fresh] = window.insert({{pipeline(key.first), key.second}, {rs.begin, rs.end}});
    if (!fresh) it->second = {std::min(it->second.first, rs.begin), std::max(it->second.second, rs.end)};
  }
  std::set<int> measured = steps;
  if (measured.size() > 2) measured.erase(measured.begin());  // the first step carries the process's warm-up
  out.steps = static_cast<int>(measured.size());

  struct Sums {
    double window = 0, compute = 0, transfer = 0, structural = 0, dependency = 0;
    std::vector<double> own;  // own compute of each (rank, step)
    std::set<int> ranks;
  };
  std::vector<Sums> sums(static_cast<size_t>(l.stages));
  for (const auto& [key, rs] : byRankStep) {
    const int stage = stageOf(key.first);
    if (stage < 0 || stage >= l.stages || rs.passes.empty() || !measured.count(key.second)) continue;
    const Interval w = window.at({pipeline(key.first), key.second});
    const IntervalSet win({w});
    const IntervalSet compute = IntervalSet(rs.passes).intersect(win);
    const IntervalSet idle = win.subtract(compute);
    const IntervalSet transfer = IntervalSet(rs.transfers).intersect(idle);
    const IntervalSet rest = idle.subtract(transfer);
    const IntervalSet structuralRegion(
        {{w.first, std::min(rs.firstBackwardBegin, w.second)}, {std::max(rs.lastForwardEnd, w.first), w.second}});
    const int64_t structural = rest.intersect(structuralRegion).total();
    Sums& s = sums[static_cast<size_t>(stage)];
    s.ranks.insert(key.first);
    s.window += static_cast<double>(w.second - w.first);
    s.compute += static_cast<double>(compute.total());
    s.own.push_back(static_cast<double>(compute.subtract(IntervalSet(rs.collectives)).total()));
    s.transfer += static_cast<double>(transfer.total());
    s.structural += static_cast<double>(structural);
    s.dependency += static_cast<double>(rest.total() - structural);
  }
  double computeSum = 0, computeMax = -1;
  int counted = 0;
  for (int stage = 0; stage < l.stages; ++stage) {
    const Sums& s = sums[static_cast<size_t>(stage)];
    PipelineStageBubble b;
    b.stage = stage;
    for (int r = 0; r < world; ++r)
      if (stageOf(r) == stage) b.ranks.push_back(r);
    const double samples = static_cast<double>(s.ranks.size() * measured.size());
    if (s.window > 0 && samples > 0) {
      b.stepNs = s.window / samples;
      b.computeNs = s.compute / samples;
      b.transferPct = 100.0 * s.transfer / s.window;
      b.warmupCooldownPct = 100.0 * s.structural / s.window;
      b.dependencyWaitPct = 100.0 * s.dependency / s.window;
      b.bubblePct = b.transferPct + b.warmupCooldownPct + b.dependencyWaitPct;
      b.ownComputeNs = vocabulary::medianOf(s.own);
      computeSum += b.ownComputeNs;
      ++counted;
      if (b.ownComputeNs > computeMax) {
        computeMax = b.ownComputeNs;
        out.longestStage = stage;
      }
    }
    out.perStage.push_back(std::move(b));
  }
  if (counted > 0 && computeSum > 0) out.longestOverMeanPct = 100.0 * (computeMax / (computeSum / counted) - 1.0);
  return out;
}

// The micro-batch a point-to-point message carries, from its records' callsite ("… of micro-batch K …"); -1 when
// no record of it says.
int microbatchOfMessage(tracedb::Reader& reader, const std::string& group, int64_t seq) {
  tracedb::Query q(reader, "SELECT callsite FROM collectives WHERE group_name = ? AND seq = ?", "p2p callsites");
  q.bind(1, std::string_view(group));
  q.bind(2, seq);
  int mb = -1;
  (void)q.each([&](tracedb::Query& r) {
    const std::string_view site = r.view(0);
    constexpr std::string_view kKey = "micro-batch ";
    const size_t at = site.find(kKey);
    if (at == std::string_view::npos || mb >= 0) return;
    int n = -1;
    const char* first = site.data() + at + kKey.size();
    if (std::from_chars(first, site.data() + site.size(), n).ec == std::errc() && n >= 0) mb = n;
  });
  return mb;
}

void namePipelineHangs(tracedb::Reader& reader, std::vector<Finding>& findings) {
  const std::optional<Layout> layout = readLayout(reader);
  if (!layout) return;
  const int world = static_cast<int>(layout->stageOfRank.size());
  for (Finding& fd : findings) {
    if (fd.kind != FindingKind::Hang || !fd.collective || !isPointToPointGroup(fd.collective->group)) continue;
    int src = -1, dst = -1;
    if (std::sscanf(fd.collective->group.c_str(), "p2p-%d-%d", &src, &dst) != 2 || src < 0 || dst < 0 ||
        src >= world || dst >= world)
      continue;
    const int srcStage = layout->stageOfRank[src], dstStage = layout->stageOfRank[dst];
    const bool forward = layout->schedule == "interleaved" ? dstStage == (srcStage + 1) % layout->stages
                                                           : dstStage > srcStage;
    const int64_t seq = fd.collective->seq;
    // The micro-batch: as the message's records say it (the engine's callsite "… of micro-batch K", any schedule);
    // for a trace without it, gpipe and 1f1b carry one micro-batch per message in order on a pair.
    int mb = microbatchOfMessage(reader, fd.collective->group, seq);
    if (mb < 0 && layout->schedule != "interleaved" && layout->microbatches > 0)
      mb = static_cast<int>((seq - 1) % layout->microbatches);
    const bool senderMissing = std::find(fd.ranks.begin(), fd.ranks.end(), src) != fd.ranks.end();
    const std::string what = std::string(forward ? "activation" : "activation gradient");
    const std::string mbText = mb >= 0 ? "micro-batch " + std::to_string(mb) + "'s " : "the ";
    char buf[320];
    if (senderMissing)
      std::snprintf(buf, sizeof buf, "stage %d (rank %d) never sent %s%s to stage %d (rank %d): p2p %d -> %d seq %lld",
                    srcStage, src, mbText.c_str(), what.c_str(), dstStage, dst, src, dst,
                    static_cast<long long>(seq));
    else
      std::snprintf(buf, sizeof buf,
                    "stage %d (rank %d) never received %s%s from stage %d (rank %d): p2p %d -> %d seq %lld", dstStage,
                    dst, mbText.c_str(), what.c_str(), srcStage, src, src, dst, static_cast<long long>(seq));
    fd.kind = FindingKind::PipelineHang;
    fd.details.insert(fd.details.begin(), fd.message);
    fd.message = buf;
    fd.number("src", int64_t{src})
        .number("dst", int64_t{dst})
        .number("seq", seq)
        .number("src_stage", int64_t{srcStage})
        .number("dst_stage", int64_t{dstStage})
        .number("stage", int64_t{senderMissing ? srcStage : dstStage})
        .number("direction", std::string(forward ? "activation" : "activation_gradient"))
        .number("microbatch", int64_t{mb});
  }
}

int pipelineStages(tracedb::Reader& reader) {
  const std::optional<Layout> layout = readLayout(reader);
  return layout ? layout->stages : 0;
}

std::vector<Finding> pipelineFindings(const PipelineReport& p, const std::map<int, double>& cpuWait) {
  std::vector<Finding> out;
  if (!p.present || p.longestStage < 0 || p.longestOverMeanPct < 10.0) return out;
  const PipelineStageBubble& s = p.perStage.at(static_cast<size_t>(p.longestStage));
  double meanCompute = 0, othersWait = 0;
  int others = 0;
  for (const auto& x : p.perStage) {
    meanCompute += x.ownComputeNs / static_cast<double>(p.perStage.size());
    if (x.stage != s.stage) {
      othersWait += x.dependencyWaitPct;
      ++others;
    }
  }
  if (others > 0) othersWait /= others;
  // The other stages' ranks' wait for a CPU per step (their median): the host's scheduling noise in compute times.
  const std::optional<double> hostWait =
      detail::medianCpuWait(cpuWait, [&](int r) { return !std::ranges::count(s.ranks, r); });
  const double excessNs = s.ownComputeNs - meanCompute;
  const bool hostNoise = hostWait.has_value() && excessNs < hostWait.value();
  Finding fd;
  fd.kind = FindingKind::StageImbalance;
  // A warning only where the imbalance costs the run: the other stages measurably wait on the longest one. The first
  // and last stages carry the embedding and the head, so an uneven split alone is the config's, not a fault. Nor is
  // an excess the host's scheduling can make.
  fd.severity = p.longestOverMeanPct >= 25.0 && othersWait >= 5.0 && !hostNoise ? Severity::Warning : Severity::Info;
  fd.ranks = s.ranks;
  if (s.ranks.size() == 1) fd.rank = s.ranks.front();
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "pipeline stage %d is the longest: %.1f %% more compute per step than the stages' mean (%.2f ms vs "
                "%.2f ms, TP communication left out); the other stages wait on it (dependency wait %.1f %% of the "
                "pipeline time)",
                s.stage, p.longestOverMeanPct, s.ownComputeNs / 1e6, meanCompute / 1e6, othersWait);
  fd.message = buf;
  if (hostNoise) {
    std::snprintf(buf, sizeof buf,
                  "the other stages' ranks wait %.2f ms per step for a CPU (their median): its %.2f ms per step over "
                  "the mean is within that scheduling noise (a compute span's time includes its thread's time "
                  "descheduled); a host with CPUs to spare decides",
                  hostWait.value() / 1e6, excessNs / 1e6);
    fd.details.push_back(buf);
  }
  for (int r : s.ranks) fd.cite("spans", {{"rank", int64_t{r}}});
  fd.number("stage", int64_t{s.stage})
      .number("compute_ns", s.ownComputeNs)
      .number("mean_compute_ns", meanCompute)
      .number("longest_over_mean_pct", p.longestOverMeanPct)
      .number("others_dependency_wait_pct", othersWait)
      .number("steps", int64_t{p.steps});
  if (hostWait) fd.number("host_cpu_wait_ns_per_step", *hostWait);
  out.push_back(std::move(fd));
  return out;
}

}  // namespace tpscope::analysis
