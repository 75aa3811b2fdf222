#include "pipeline_import.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>
#include <tuple>

namespace tpscope::formats::kineto {

using tracedb::Phase;
using tracedb::SpanKind;
using tracedb::Status;

namespace {

struct Found {
  size_t span = 0;
  PipeName name;
  int64_t begin = 0, end = 0;  // absolute
};

bool isOptimizerSpan(const tracedb::SpanRow& row, std::string_view name) {
  if (row.kind == SpanKind::Optimizer) return true;
  constexpr std::string_view kOptimizer = "optimizer";
  if (name.size() < kOptimizer.size()) return false;
  for (size_t k = 0; k < kOptimizer.size(); ++k)
    if (std::tolower(static_cast<unsigned char>(name[k])) != kOptimizer[k]) return false;
  return true;
}

const SpanArgs* argsOf(const KinetoFile& file, size_t i) {
  const int a = file.spans[i].args;
  return a >= 0 ? &file.spanArgs[static_cast<size_t>(a)] : nullptr;
}

// Steps of the passes (sorted by begin): as the rows carry them when every pass has one; else from the optimizer
// spans' ends; else from the pipeline flush.
// Returns true when the rows' own steps were taken.
bool assignSteps(const std::vector<Found>& passes, const RankModel& m, std::vector<int64_t> optimizerEnds,
                 std::vector<int>& steps) {
  steps.assign(passes.size(), 0);
  bool all = true;
  for (const Found& p : passes) all = all && m.spans[p.span].step >= 0;
  if (all) {
    for (size_t k = 0; k < passes.size(); ++k) steps[k] = m.spans[passes[k].span].step;
    return true;
  }
  if (!optimizerEnds.empty()) {
    std::sort(optimizerEnds.begin(), optimizerEnds.end());
    int step = 0;
    size_t next = 0;
    bool passSince = false;  // a pass since the last step boundary: an optimizer end now closes the step
    for (size_t k = 0; k < passes.size(); ++k) {
      for (; next < optimizerEnds.size() && optimizerEnds[next] <= passes[k].begin; ++next)
        if (passSince) {
          ++step;
          passSince = false;
        }
      steps[k] = step;
      passSince = true;
    }
    return false;
  }
  int step = 0, open = 0;  // forwards of the step without their backward yet
  bool backwardSeen = false;
  for (size_t k = 0; k < passes.size(); ++k) {
    const bool forward = passes[k].name.forward;
    if (forward && backwardSeen && open <= 0) {
      ++step;
      backwardSeen = false;
      open = 0;
    }
    open += forward ? 1 : -1;
    backwardSeen = backwardSeen || !forward;
    steps[k] = step;
  }
  return false;
}

// The nearest pass (of a direction, if given) before (`after` false: ended by `t`) or after (begun at or after
// `t`) a time. `found` is sorted by begin, `passes` index-aligned with it.
const PipelineRank::Pass* nearestPass(const std::vector<PipelineRank::Pass>& passes, const std::vector<Found>& found,
                                      int64_t t, std::optional<bool> forward, bool after) {
  auto firstAtOrAfter = std::lower_bound(found.begin(), found.end(), t,
                                         [](const Found& f, int64_t time) { return f.begin < time; });
  const auto from = static_cast<size_t>(firstAtOrAfter - found.begin());
  if (after) {
    for (size_t k = from; k < passes.size(); ++k)
      if (!forward || passes[k].forward == *forward) return &passes[k];
    return nullptr;
  }
  for (size_t k = from; k-- > 0;)
    if (found[k].end <= t && (!forward || passes[k].forward == *forward)) return &passes[k];
  return nullptr;
}

// The passes' step, micro-batch and chunk into out.passes.
void describePasses(const KinetoFile& file, const std::vector<Found>& found, const std::vector<int>& steps,
                    PipelineRank& out) {
  std::map<std::tuple<int, bool, int>, int> order;  // (step, forward, chunk) -> passes so far
  for (size_t k = 0; k < found.size(); ++k) {
    const SpanArgs* a = argsOf(file, found[k].span);
    PipelineRank::Pass p;
    p.forward = found[k].name.forward;
    p.step = steps[k];
    p.chunk = found[k].name.chunk >= 0 ? found[k].name.chunk : a && a->chunk >= 0 ? static_cast<int>(a->chunk) : 0;
    int& nth = order[{p.step, p.forward, p.chunk}];
    p.microbatch = found[k].name.microbatch >= 0          ? found[k].name.microbatch
                   : a && a->microbatch >= 0               ? static_cast<int>(a->microbatch)
                                                           : nth;
    ++nth;
    p.beginNs = found[k].begin;
    out.passes.push_back(p);
  }
}

}  // namespace

namespace {

// The rank's pass and transfer spans (host lanes only), sorted by begin, and the ends of its optimizer spans.
void collectSpans(const KinetoFile& file, const RankModel& m, std::vector<Found>& passes, std::vector<Found>& transfers,
                  std::vector<int64_t>& optimizerEnds) {
  const int64_t base = file.baseTimeNs.value_or(0);
  for (size_t i = 0; i < file.spans.size(); ++i) {
    const tracedb::SpanRow& row = m.spans[i];
    if (row.thread >= kGpuLaneBase) continue;
    const RawSpan& s = file.spans[i];
    const PipeName name = pipelineName(s.name);
    const Found f{i, name, s.tsNs + base, s.tsNs + base + s.durNs};
    if (name.role == PipeName::Role::Pass) passes.push_back(f);
    else if (name.role == PipeName::Role::Transfer) transfers.push_back(f);
    else if (isOptimizerSpan(row, s.name)) optimizerEnds.push_back(f.end);
  }
  auto byBegin = [](const Found& a, const Found& b) { return std::tie(a.begin, a.span) < std::tie(b.begin, b.span); };
  std::sort(passes.begin(), passes.end(), byBegin);
  std::sort(transfers.begin(), transfers.end(), byBegin);
}

// Gives a span a name of the pipeline contract (kept alive in out.names for the intern function's views).
Status rename(tracedb::SpanRow& row, std::string name, const InternFn& intern, PipelineRank& out) {
  out.names.push_back(std::move(name));
  auto id = intern(out.names.back());
  if (!id) return id.status();
  row.name = *id;
  return Status::ok();
}

Status renamePasses(const std::vector<Found>& passes, RankModel& m, const InternFn& intern, PipelineRank& out) {
  std::set<int> chunks;
  for (const PipelineRank::Pass& p : out.passes) chunks.insert(p.chunk);
  const bool withChunk = chunks.size() > 1;
  for (size_t k = 0; k < passes.size(); ++k) {
    const PipelineRank::Pass& p = out.passes[k];
    tracedb::SpanRow& row = m.spans[passes[k].span];
    std::string name = std::string(p.forward ? "forward mb " : "backward mb ") + std::to_string(p.microbatch);
    if (withChunk) name += " chunk " + std::to_string(p.chunk);
    if (Status s = rename(row, std::move(name), intern, out); !s) return s;
    row.kind = SpanKind::Compute;
    row.phase = p.forward ? Phase::Forward : Phase::Backward;
    row.step = p.step;
  }
  return Status::ok();
}

bool anyReceive(const PipeName& name) {
  for (int j = 0; j < name.messageCount; ++j)
    if (!name.messages[static_cast<size_t>(j)].send) return true;
  return false;
}

// The steps of the transfers: their rows' own where the passes took theirs from the rows, else the step of the pass
// next to them (a receive's next pass, a send's previous one).
std::vector<int> transferSteps(const std::vector<Found>& transfers, const std::vector<Found>& passes, bool rowSteps,
                               const RankModel& m, const PipelineRank& out) {
  std::vector<int> steps;
  for (const Found& t : transfers) {
    const bool recv = anyReceive(t.name);
    int step = rowSteps || passes.empty() ? m.spans[t.span].step : -1;
    if (step < 0) {
      const PipelineRank::Pass* p = nearestPass(out.passes, passes, recv ? t.begin : t.end, std::nullopt, recv);
      if (!p) p = nearestPass(out.passes, passes, recv ? t.end : t.begin, std::nullopt, !recv);
      step = p ? p->step : 0;
    }
    steps.push_back(std::max(step, 0));
  }
  return steps;
}

// When each receive began to wait: the end of the rank's previous pass or transfer span on the same thread, if that
// span is in the receive's step; else the receive's own begin.
std::vector<int64_t> waitStarts(const std::vector<Found>& transfers, const std::vector<int>& steps,
                                const std::vector<Found>& passes, const RankModel& m, const PipelineRank& out) {
  struct Busy {
    int thread;
    int64_t end;
    int step;
    bool operator<(const Busy& o) const { return std::tie(thread, end) < std::tie(o.thread, o.end); }
  };
  std::vector<Busy> busy;
  for (size_t k = 0; k < passes.size(); ++k) busy.push_back({m.spans[passes[k].span].thread, passes[k].end, out.passes[k].step});
  for (size_t k = 0; k < transfers.size(); ++k) busy.push_back({m.spans[transfers[k].span].thread, transfers[k].end, steps[k]});
  std::sort(busy.begin(), busy.end());
  std::vector<int64_t> starts;
  for (size_t k = 0; k < transfers.size(); ++k) {
    const Busy key{m.spans[transfers[k].span].thread, transfers[k].begin, 0};
    auto it = std::upper_bound(busy.begin(), busy.end(), key);  // the first that ends after the transfer begins
    const bool previous = it != busy.begin() && std::prev(it)->thread == key.thread && std::prev(it)->step == steps[k];
    starts.push_back(previous ? std::prev(it)->end : transfers[k].begin);
  }
  return starts;
}

// The transfers' messages into out.messages; their spans renamed "recv" / "send wait".
Status recordTransfers(const KinetoFile& file, const std::vector<Found>& transfers, const std::vector<Found>& passes,
                       bool rowSteps, RankModel& m, const InternFn& intern, PipelineRank& out) {
  const std::vector<int> steps = transferSteps(transfers, passes, rowSteps, m, out);
  const std::vector<int64_t> waits = waitStarts(transfers, steps, passes, m, out);
  for (size_t k = 0; k < transfers.size(); ++k) {
    const Found& t = transfers[k];
    tracedb::SpanRow& row = m.spans[t.span];
    const SpanArgs* a = argsOf(file, t.span);
    for (int j = 0; j < t.name.messageCount; ++j) {
      PipelineRank::Message msg;
      msg.what = t.name.messages[static_cast<size_t>(j)];
      msg.step = steps[k];
      msg.thread = row.thread;
      msg.beginNs = t.begin;
      msg.endNs = t.end;
      msg.waitFromNs = msg.what.send ? t.begin : waits[k];
      msg.bytes = a ? a->bytes : -1;
      const PipelineRank::Pass* p =
          nearestPass(out.passes, passes, msg.what.send ? t.end : t.begin, msg.what.activation, !msg.what.send);
      msg.microbatch = a && a->microbatch >= 0 ? static_cast<int>(a->microbatch) : p ? p->microbatch : -1;
      out.messages.push_back(msg);
    }
    if (Status s = rename(row, anyReceive(t.name) ? "recv" : "send wait", intern, out); !s) return s;
    row.kind = SpanKind::Comm;
    row.phase = t.name.messages[0].activation ? Phase::Forward : Phase::Backward;
    row.step = steps[k];
  }
  return Status::ok();
}

}  // namespace

Status recognisePipelineRank(const KinetoFile& file, RankModel& m, const InternFn& intern, PipelineRank& out) {
  std::vector<Found> passes, transfers;
  std::vector<int64_t> optimizerEnds;
  collectSpans(file, m, passes, transfers, optimizerEnds);
  if (passes.empty() && transfers.empty()) return Status::ok();
  std::vector<int> steps;
  const bool rowSteps = assignSteps(passes, m, optimizerEnds, steps);
  describePasses(file, passes, steps, out);
  if (Status s = renamePasses(passes, m, intern, out); !s) return s;
  return recordTransfers(file, transfers, passes, rowSteps, m, intern, out);
}

namespace {

constexpr int kMaxPipelineRanks = 1 << 20;

struct Sided {
  const PipelineRank::Message* msg;
  int rank;
};

// The stage a message of a rank at `stage` goes to or comes from; -1 past the first or last stage (wrapping
// around only with several model chunks, where the last stage feeds the first one's next chunk).
int peerStage(const PipeMessage& what, int stage, int stages, bool ring) {
  const int peer = stage + ((what.activation == what.send) ? 1 : -1);
  if (peer >= 0 && peer < stages) return peer;
  return ring ? (peer + stages) % stages : -1;
}

tracedb::CollectiveRow p2pRecord(const Sided& side, const std::string& group, int64_t seq, int microbatch) {
  const PipelineRank::Message& m = *side.msg;
  tracedb::CollectiveRow c;
  c.rank = side.rank;
  c.group = group;
  c.seq = seq;
  c.op = m.what.send ? "send" : "recv";
  c.bytes = std::max<int64_t>(0, m.bytes);
  c.callsite = microbatch >= 0 ? pipelineCallsite(m.what, microbatch) : std::string();
  c.step = m.step;
  c.phase = m.what.activation ? Phase::Forward : Phase::Backward;
  c.thread = m.thread;
  c.enqueueNs = m.waitFromNs;
  c.startNs = m.beginNs;
  c.endNs = m.endNs;
  c.state = tracedb::CollectiveState::Completed;
  return c;
}

// Pairs each directed pair's sends and receives in order of begin into records.
void pairMessages(std::vector<PipelineRankRef>& ranks, int stages, bool ring,
                  std::map<std::string, tracedb::GroupInfo>& groups, std::map<std::string, int64_t>& skipped) {
  std::map<std::tuple<int, int, int>, int> rankAt;  // (stage, tp, dp) -> rank
  for (const PipelineRankRef& r : ranks)
    if (r.coords.pp) rankAt[{*r.coords.pp, r.coords.tp.value_or(0), r.coords.dp.value_or(0)}] = r.rank;
  std::map<int, RankModel*> modelOf;
  for (PipelineRankRef& r : ranks) modelOf[r.rank] = r.model;
  std::map<std::pair<int, int>, std::pair<std::vector<Sided>, std::vector<Sided>>> pairs;  // (src, dst) -> sends, recvs
  for (const PipelineRankRef& r : ranks) {
    if (!r.coords.pp) {
      if (!r.pipe->messages.empty())
        skipped["pipeline transfer on a rank whose stage is not named (no record)"] +=
            static_cast<int64_t>(r.pipe->messages.size());
      continue;
    }
    for (const PipelineRank::Message& m : r.pipe->messages) {
      const int stage = peerStage(m.what, *r.coords.pp, stages, ring);
      if (stage < 0) {
        skipped["pipeline transfer past the first or last stage (no record)"]++;
        continue;
      }
      auto peer = rankAt.find({stage, r.coords.tp.value_or(0), r.coords.dp.value_or(0)});
      if (peer == rankAt.end()) {
        skipped["pipeline transfer to a stage not in the trace (no record)"]++;
        continue;
      }
      auto& pair = pairs[m.what.send ? std::pair(r.rank, peer->second) : std::pair(peer->second, r.rank)];
      (m.what.send ? pair.first : pair.second).push_back({&m, r.rank});
    }
  }
  for (auto& [key, sides] : pairs) {
    auto& [sends, recvs] = sides;
    auto byBegin = [](const Sided& a, const Sided& b) { return a.msg->beginNs < b.msg->beginNs; };
    std::stable_sort(sends.begin(), sends.end(), byBegin);
    std::stable_sort(recvs.begin(), recvs.end(), byBegin);
    const std::string group = "p2p-" + std::to_string(key.first) + "-" + std::to_string(key.second);
    const size_t n = std::min(sends.size(), recvs.size());
    for (size_t k = 0; k < n; ++k) {
      const int mb = sends[k].msg->microbatch >= 0 ? sends[k].msg->microbatch : recvs[k].msg->microbatch;
      const auto seq = static_cast<int64_t>(k + 1);
      modelOf[key.first]->collectives.push_back(p2pRecord(sends[k], group, seq, mb));
      modelOf[key.second]->collectives.push_back(p2pRecord(recvs[k], group, seq, mb));
    }
    if (sends.size() > n) skipped["pipeline send without a matching recv (no record)"] += sends.size() - n;
    if (recvs.size() > n) skipped["pipeline recv without a matching send (no record)"] += recvs.size() - n;
    if (n > 0) groups[group] = tracedb::GroupInfo{group, {key.first, key.second}, ""};
  }
}

// Counts the transfers of a run that gets no pipeline meta (no records are written for them); returns "".
std::string unrecorded(const std::vector<PipelineRankRef>& ranks, std::map<std::string, int64_t>& skipped) {
  for (const PipelineRankRef& r : ranks)
    if (!r.pipe->messages.empty())
      skipped[r.coords.pp ? "pipeline transfer in a trace without a pipeline (no record)"
                          : "pipeline transfer on a rank whose stage is not named (no record)"] +=
          static_cast<int64_t>(r.pipe->messages.size());
  return "";
}

// gpipe when on every rank and step all forward passes begin before the first backward pass.
bool allForwardsFirst(const std::vector<PipelineRankRef>& ranks) {
  for (const PipelineRankRef& r : ranks) {
    std::map<int, std::pair<int64_t, int64_t>> byStep;  // step -> (last forward begin, first backward begin)
    for (const PipelineRank::Pass& p : r.pipe->passes) {
      auto [it, fresh] = byStep.emplace(p.step, std::pair(INT64_MIN, INT64_MAX));
      if (p.forward) it->second.first = std::max(it->second.first, p.beginNs);
      else it->second.second = std::min(it->second.second, p.beginNs);
    }
    for (const auto& [step, t] : byStep)
      if (t.first > t.second) return false;
  }
  return true;
}

}  // namespace

std::string assemblePipeline(std::vector<PipelineRankRef>& ranks, std::map<std::string, tracedb::GroupInfo>& groups,
                             std::map<std::string, int64_t>& skipped) {
  int stages = 0, world = 0;
  bool anyPasses = false;
  std::set<int> chunks;
  int microbatches = 0;
  for (const PipelineRankRef& r : ranks) {
    world = std::max(world, r.rank + 1);
    if (r.coords.pp) stages = std::max({stages, *r.coords.pp + 1, r.coords.ppSize.value_or(0)});
    if (r.pipe->passes.empty()) continue;
    anyPasses = true;
    if (!r.coords.pp) skipped["pipeline passes on a rank whose stage is not named"]++;
    std::map<int, std::set<int>> perStep;
    for (const PipelineRank::Pass& p : r.pipe->passes) {
      chunks.insert(p.chunk);
      if (p.forward) perStep[p.step].insert(p.microbatch);
    }
    for (const auto& [step, mbs] : perStep) microbatches = std::max(microbatches, static_cast<int>(mbs.size()));
  }
  if (!anyPasses) return unrecorded(ranks, skipped);
  if (world > kMaxPipelineRanks) {
    skipped["pipeline ranks beyond 1048576 (no pipeline meta)"]++;
    return unrecorded(ranks, skipped);
  }
  if (stages < 2) {
    skipped["pipeline passes but fewer than 2 stages named (no pipeline meta)"]++;
    return unrecorded(ranks, skipped);
  }
  const int virtualStages = std::max<int>(1, static_cast<int>(chunks.size()));
  pairMessages(ranks, stages, virtualStages > 1, groups, skipped);
  std::vector<int> stageOfRank(static_cast<size_t>(world), -1);
  for (const PipelineRankRef& r : ranks)
    if (r.coords.pp) stageOfRank[static_cast<size_t>(r.rank)] = *r.coords.pp;
  const char* schedule = virtualStages > 1 ? "interleaved" : allForwardsFirst(ranks) ? "gpipe" : "1f1b";
  std::string json = std::string("{\"schedule\":\"") + schedule + "\",\"stages\":" + std::to_string(stages) +
                     ",\"microbatches\":" + std::to_string(microbatches) +
                     ",\"virtual_stages\":" + std::to_string(virtualStages) + ",\"stage_of_rank\":[";
  for (size_t r = 0; r < stageOfRank.size(); ++r) json += (r ? "," : "") + std::to_string(stageOfRank[r]);
  return json + "]}";
}

}  // namespace tpscope::formats::kineto
