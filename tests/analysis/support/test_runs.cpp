#include "test_runs.h"

#include <algorithm>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "tpscope/tracedb/records.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::testing {

using tracedb::CollectiveRow;
using tracedb::CollectiveState;
using tracedb::Phase;
using tracedb::SpanKind;
using tracedb::SpanRow;
using tracedb::Status;

namespace {

constexpr int64_t kUs = 1000;
constexpr int64_t kTransferNs = 200 * kUs;   // TP all-reduce
constexpr int64_t kDpTransferNs = 500 * kUs; // DP all-reduce

// Where the simulated records go: straight into one run file (writeRun), or into per-rank buffers that become rank
// files afterwards (writeRankFiles). The simulation calls these in time order.
class Records {
 public:
  virtual ~Records() = default;
  virtual tracedb::Result<uint32_t> intern(const std::string& value) = 0;
  virtual Status addSpans(std::span<const SpanRow> spans) = 0;
  virtual Status upsertCollective(const CollectiveRow& c) = 0;
  virtual Status addGradStat(const tracedb::GradStatRow& g) = 0;
  virtual Status putStepStat(const tracedb::StepStatRow& s) = 0;
  virtual Status addAlert(const tracedb::AlertRow& a) = 0;
};

class WriterRecords final : public Records {
 public:
  explicit WriterRecords(tracedb::Writer& w) : w_(w) {}
  tracedb::Result<uint32_t> intern(const std::string& value) override { return w_.intern(value); }
  Status addSpans(std::span<const SpanRow> spans) override { return w_.addSpans(spans); }
  Status upsertCollective(const CollectiveRow& c) override { return w_.upsertCollective(c); }
  Status addGradStat(const tracedb::GradStatRow& g) override { return w_.addGradStat(g); }
  Status putStepStat(const tracedb::StepStatRow& s) override { return w_.putStepStat(s); }
  Status addAlert(const tracedb::AlertRow& a) override { return w_.addAlert(a); }

 private:
  tracedb::Writer& w_;
};

std::vector<int> tpGroup(const RunSpec& spec, int dpIndex) {
  std::vector<int> r;
  for (int t = 0; t < spec.tp; ++t) r.push_back(dpIndex * spec.tp + t);
  return r;
}
std::vector<int> dpGroup(const RunSpec& spec, int tpIndex) {
  std::vector<int> r;
  for (int d = 0; d < spec.dp; ++d) r.push_back(d * spec.tp + tpIndex);
  return r;
}

struct Sim {
  const RunSpec& spec;
  Records& w;
  int world;
  std::vector<int64_t> clock;   // per rank, ns
  std::vector<bool> stopped;    // dead, stalled or blocked: records nothing more
  std::map<std::string, int64_t> seq;  // per group
  std::map<std::string, uint32_t> names;
  std::vector<SpanRow> spans;
  Status status;
  int64_t computeCalls = 0;  // compute() calls so far (RunSpec::computeJitterNs)

  uint32_t name(const std::string& n) {
    auto it = names.find(n);
    if (it != names.end()) return it->second;
    auto id = w.intern(n);
    if (!id) {
      status = id.status();
      return 0;
    }
    names[n] = *id;
    return *id;
  }

  void span(int rank, int thread, SpanKind kind, const std::string& n, int64_t b, int64_t d, int step, int layer,
            Phase phase) {
    spans.push_back(SpanRow{rank, thread, kind, name(n), b, d, step, layer, phase, std::nullopt});
    if (spans.size() >= 4096) flushSpans();
  }
  void flushSpans() {
    if (!spans.empty() && status) status = w.addSpans(spans);
    spans.clear();
  }

  void compute(int rank, const std::string& n, int64_t d, int step, int layer, Phase phase) {
    if (stopped[rank]) return;
    if (spec.computeJitterNs > 0 && (rank + computeCalls++ / world) % 2 == 1) d += spec.computeJitterNs;
    span(rank, 0, SpanKind::Compute, n, clock[rank], d, step, layer, phase);
    for (int i = 0; i < spec.extraSpansPerCompute; ++i) {
      const int64_t part = d / (spec.extraSpansPerCompute + 1);
      span(rank, 0, SpanKind::Compute, n + ".op", clock[rank] + i * part, part, step, layer, phase);
    }
    clock[rank] += d;
  }

  // One collective over `members`. Members that are stopped do not enter; then the others block forever.
  void collective(const std::string& group, const std::vector<int>& members, const std::string& op, int64_t elements,
                  int64_t transfer, const std::string& callsite, int step, int layer, Phase phase) {
    const int64_t s = ++seq[group];
    bool anyActive = false;
    for (int r : members) anyActive = anyActive || !stopped[r];
    if (!anyActive) return;
    if (group == spec.hangGroup && s == spec.hangSeq && !stopped[spec.hangRank]) {
      // The hanging rank stalls in data loading before it reaches the collective.
      span(spec.hangRank, 0, SpanKind::Data, "data loading", clock[spec.hangRank], 300 * kUs, step, -1, Phase::Data);
      clock[spec.hangRank] += 300 * kUs;
      stopped[spec.hangRank] = true;
    }
    bool complete = true;
    int64_t last = 0;
    for (int r : members) {
      if (stopped[r]) complete = false;
      else last = std::max(last, clock[r]);
    }
    for (int r : members) {
      if (stopped[r]) continue;
      CollectiveRow c;
      c.rank = r;
      c.group = group;
      c.seq = s;
      c.op = op;
      c.dtype = "float32";
      c.numel = elements;
      c.shape = {2, 8, elements / 16};
      if (group == spec.mismatchGroup && s == spec.mismatchSeq && r == spec.mismatchRank) {
        c.numel *= 2;
        c.shape[2] *= 2;
      }
      c.bytes = c.numel * 4;
      c.callsite = callsite;
      c.step = step;
      c.layer = layer;
      c.phase = phase;
      c.enqueueNs = clock[r];
      c.startNs = clock[r];
      if (complete) {
        c.endNs = last + transfer;
        c.state = CollectiveState::Completed;
        if (spec.commSpans)
          span(r, 0, SpanKind::Comm, op + " " + group, clock[r], *c.endNs - clock[r], step, layer, phase);
        clock[r] = *c.endNs;
      } else {
        c.state = CollectiveState::Started;
      }
      if (status) status = w.upsertCollective(c);
    }
    if (!complete)
      for (int r : members) stopped[r] = true;  // everyone that entered is blocked now
  }

  void run() {
    for (int step = 0; step < spec.steps && status; ++step) {
      std::vector<int64_t> stepBegin = clock;
      std::vector<bool> activeAtStart(world);
      for (int r = 0; r < world; ++r) activeAtStart[r] = !stopped[r];
      for (int r = 0; r < world; ++r) {
        if (stopped[r]) continue;
        int64_t d = 500 * kUs + (r == spec.stragglerRank ? spec.stragglerDelayNs : 0);
        span(r, 0, SpanKind::Data, "data loading", clock[r], d, step, -1, Phase::Data);
        clock[r] += d;
      }
      auto tpAllReduce = [&](const std::string& what, int layer, Phase phase) {
        for (int d = 0; d < spec.dp; ++d)
          collective("tp-" + std::to_string(d), tpGroup(spec, d), "all_reduce", spec.elements, kTransferNs,
                     "layer " + std::to_string(layer) + " " + what, step, layer, phase);
      };
      for (int l = 0; l < spec.layers; ++l) {
        if (l == 0 && step == spec.activationStep && !stopped[spec.activationRank] && status) {
          tracedb::AlertRow a;
          a.rank = spec.activationRank;
          a.step = step;
          a.tsNs = clock[spec.activationRank] + 100 * kUs;
          a.severity = "critical";
          a.kind = "nonfinite_activation";
          a.layer = 0;
          a.param = "attention";
          a.message = "NaN in the attention output of layer 0";
          a.evidence = R"({"nan_count": 7, "numel": 256, "phase": "fwd"})";
          status = w.addAlert(a);
        }
        for (int r = 0; r < world; ++r) compute(r, "attention", 500 * kUs, step, l, Phase::Forward);
        tpAllReduce("attention output RowParallel forward all-reduce", l, Phase::Forward);
        for (int r = 0; r < world; ++r) compute(r, "mlp", 500 * kUs, step, l, Phase::Forward);
        tpAllReduce("mlp fc2 RowParallel forward all-reduce", l, Phase::Forward);
      }
      for (int l = spec.layers - 1; l >= 0; --l) {
        for (int r = 0; r < world; ++r) compute(r, "mlp backward", 750 * kUs, step, l, Phase::Backward);
        tpAllReduce("mlp fc1 ColumnParallel backward all-reduce", l, Phase::Backward);
        for (int r = 0; r < world; ++r) compute(r, "attention backward", 750 * kUs, step, l, Phase::Backward);
        tpAllReduce("attention qkv ColumnParallel backward all-reduce", l, Phase::Backward);
      }
      for (int t = 0; t < spec.tp; ++t)
        collective("dp-" + std::to_string(t), dpGroup(spec, t), "all_reduce", 4096, kDpTransferNs,
                   "data-parallel gradient all-reduce", step, -1, Phase::Backward);
      for (int r = 0; r < world; ++r) {
        if (stopped[r]) continue;
        span(r, 0, SpanKind::Optimizer, "optimizer", clock[r], 300 * kUs, step, -1, Phase::Optimizer);
        clock[r] += 300 * kUs;
      }
      for (int r = 0; r < world && status; ++r) {
        if (!activeAtStart[r]) continue;
        const bool finished = !stopped[r];
        if (finished) span(r, 0, SpanKind::Step, "step", stepBegin[r], clock[r] - stepBegin[r], step, -1, Phase::None);
        gradStats(r, step);
        if (finished) {
          tracedb::StepStatRow ss;
          ss.rank = r;
          ss.step = step;
          const bool nanLoss = (spec.nanStep >= 0 && step > spec.nanStep) ||
                               (spec.activationStep >= 0 && step >= spec.activationStep);
          if (!nanLoss) ss.loss = (step == spec.lossSpikeStep ? 4.0 : 1.0) * (5.0 - 0.05 * step);
          ss.lr = 1e-3;
          if (!nanLoss) ss.gradNorm = (step == spec.divergeStep && r == 1) ? 2.5 : 2.0;
          // A rank's spike reaches the reduced norm the update is made of, as a real one does (anomalies.h).
          if (!nanLoss && step == spec.spikeStep && spec.spikeRank >= 0)
            *ss.gradNorm *= spec.spikeFactor > 0 ? spec.spikeFactor : 20.0;
          ss.tokens = 32;
          ss.beginNs = stepBegin[r];
          ss.endNs = clock[r];
          status = w.putStepStat(ss);
        }
      }
      if (spec.sdcStep >= 0 && step == std::min(spec.steps - 1, (spec.sdcStep / 10 + 1) * 10)) sdcAlerts(step);
      if (spec.crashRank >= 0 && step == spec.crashStep) stopped[spec.crashRank] = true;
    }
    flushSpans();
  }

  // The replica check of `checkStep` found the copies of spec.sdcTensor parted at spec.sdcStep: each suspect's alert.
  void sdcAlerts(int checkStep) {
    std::string suspects, group;
    for (size_t i = 0; i < spec.sdcSuspects.size(); ++i) suspects += (i ? "," : "") + std::to_string(spec.sdcSuspects[i]);
    for (int r = 0; r < world; ++r) group += (r ? "," : "") + std::to_string(r);
    for (int r : spec.sdcSuspects) {
      if (stopped[r] || !status) continue;
      tracedb::AlertRow a;
      a.rank = r;
      a.step = spec.sdcStep;
      a.tsNs = clock[r];
      a.severity = "critical";
      a.kind = "silent_corruption";
      a.layer = spec.sdcLayer;
      a.param = spec.sdcTensor;
      a.message = "replica check: the copies of " + spec.sdcTensor + " disagree at step " + std::to_string(spec.sdcStep);
      a.evidence = "{\"tensor\": \"" + spec.sdcTensor + "\", \"layer\": " + std::to_string(spec.sdcLayer) +
                   ", \"replicated\": true, \"suspects\": [" + suspects + "], \"majority\": " +
                   (spec.sdcMajority ? "true" : "false") + ", \"group\": [" + group + "], \"copies\": " +
                   std::to_string(world) + ", \"first_step\": " + std::to_string(spec.sdcStep) +
                   ", \"earliest_step\": " + std::to_string(spec.sdcStep) + ", \"check_step\": " +
                   std::to_string(checkStep) + ", \"tensors_disagreeing\": 1, \"policy\": \"warn\"}";
      status = w.addAlert(a);
    }
  }

  void gradStats(int r, int step) {
    const int tpRank = r % spec.tp;
    for (int l = 0; l < spec.layers && status; ++l) {
      for (const char* p : {"attention.qkv.weight", "mlp.fc1.weight"}) {
        tracedb::GradStatRow g;
        g.rank = r;
        g.step = step;
        g.param = "layers." + std::to_string(l) + "." + p;
        g.layer = l;
        g.numel = 4096;
        g.l2Norm = 1.0 + 0.01 * step + 0.001 * l + 0.0001 * tpRank;
        g.maxAbs = g.l2Norm / 10;
        if (r == spec.spikeRank && step == spec.spikeStep && spec.spikeFactor > 0)
          g.l2Norm *= spec.spikeFactor;
        else if (r == spec.spikeRank && step == spec.spikeStep && l == spec.layers - 1 &&
                 std::string(p) == "mlp.fc1.weight")
          g.l2Norm *= 50;
        if (spec.activationRank >= 0 && step >= spec.activationStep &&
            (r / spec.tp == spec.activationRank / spec.tp || step > spec.activationStep)) {
          g.nanCount = 4096;
          g.l2Norm = 0;
        }
        if (spec.nanRank >= 0) {
          const int nanTp = spec.nanRank / spec.tp;  // the origin's TP group index
          const bool sameTp = r / spec.tp == nanTp;
          // Origin: its layers ≤ nanLayer at nanStep. TP peers: layers below nanLayer (after the backward
          // all-reduce). Everyone: every layer from the next step on (after the DP all-reduce).
          const bool originLayer = r == spec.nanRank && step == spec.nanStep && l == spec.nanLayer;
          if (originLayer && std::string(p) != "mlp.fc1.weight") {
            // The NaN starts in the MLP's backward: the layer's attention gradients come later.
          } else if ((r == spec.nanRank && step == spec.nanStep && l <= spec.nanLayer) ||
              (sameTp && r != spec.nanRank && step == spec.nanStep && l < spec.nanLayer) || step > spec.nanStep) {
            (spec.nanIsInf ? g.infCount : g.nanCount) = originLayer ? 3 : 4096;
            g.l2Norm = 0;  // what the device reduction reports when it skips non-finite values
          }
        }
        status = w.addGradStat(g);
      }
    }
  }
};

}  // namespace

int64_t spansPerRankStep(const RunSpec& spec) {
  const int64_t computeSpans = int64_t{4} * spec.layers * (1 + spec.extraSpansPerCompute);
  const int64_t commSpans = spec.commSpans ? int64_t{4} * spec.layers + 1 : 0;
  return 1 /*data*/ + computeSpans + commSpans + 1 /*optimizer*/ + 1 /*step*/;
}

namespace {

std::string configJson(const RunSpec& spec) {
  return "{\"layers\": " + std::to_string(spec.layers) + ", \"hidden\": 16, \"seq_len\": 8, \"micro_batch_size\": " +
         std::to_string(spec.elements / 128) + "}";
}

tracedb::RankInfo rankInfo(const RunSpec& spec, int r) {
  tracedb::RankInfo ri;
  ri.rank = r;
  ri.host = "node-" + std::to_string(r / spec.ranksPerHost);
  ri.pid = 1000 + r;
  ri.worldSize = spec.tp * spec.dp;
  ri.localRank = r % spec.ranksPerHost;
  ri.tpRank = r % spec.tp;
  ri.tpSize = spec.tp;
  ri.dpRank = r / spec.tp;
  ri.dpSize = spec.dp;
  ri.clockUncertaintyNs = 1000;
  const bool stopped = spec.hangRank >= 0 || spec.crashRank >= 0;
  ri.exitReason = r == spec.crashRank ? spec.crashReason : stopped ? spec.stopReason : "ok";
  return ri;
}

Sim makeSim(const RunSpec& spec, Records& out) {
  const int world = spec.tp * spec.dp;
  return Sim{spec, out, world, std::vector<int64_t>(world, 0), std::vector<bool>(world, false), {}, {}, {},
             Status::ok()};
}

}  // namespace

Status writeRun(const std::filesystem::path& path, const RunSpec& spec) {
  tracedb::CreateOptions options;
  options.overwrite = true;
  options.runId = "test-run";
  options.epochUnixNs = 1'700'000'000'000'000'000;
  options.source = "test";
  auto writer = tracedb::Writer::create(path, options);
  if (!writer) return writer.status();
  tracedb::Writer& w = **writer;
  const int world = spec.tp * spec.dp;
  if (Status s = w.begin(); !s) return s;
  if (Status s = w.setMeta("config", configJson(spec)); !s) return s;
  if (Status s = w.setMeta("clock_aligned", "1"); !s) return s;
  if (!spec.seqByOrder.empty())
    if (Status s = w.setMeta(tracedb::meta_keys::kSeqByOrder, spec.seqByOrder); !s) return s;
  if (!spec.pipelineMeta.empty())
    if (Status s = w.setMeta(tracedb::meta_keys::kPipeline, spec.pipelineMeta); !s) return s;
  if (spec.hostCpus > 0)
    for (int node = 0; node * spec.ranksPerHost < world; ++node)
      if (Status s = w.setMeta(std::string(tracedb::meta_keys::kHostCpusPrefix) + "node-" + std::to_string(node),
                               std::to_string(spec.hostCpus));
          !s)
        return s;
  for (int r = 0; r < world; ++r) {
    if (Status s = w.putRank(rankInfo(spec, r)); !s) return s;
    if (Status s = w.putThread(tracedb::ThreadInfo{r, 0, "cpu", "main"}); !s) return s;
  }
  for (int d = 0; d < spec.dp; ++d)
    if (Status s = w.putGroup(tracedb::GroupInfo{"tp-" + std::to_string(d), tpGroup(spec, d), "gloo"}); !s) return s;
  for (int t = 0; t < spec.tp; ++t)
    if (Status s = w.putGroup(tracedb::GroupInfo{"dp-" + std::to_string(t), dpGroup(spec, t), "gloo"}); !s) return s;
  WriterRecords out(w);
  Sim sim = makeSim(spec, out);
  sim.run();
  if (!sim.status) return sim.status;
  if (Status s = w.commit(); !s) return s;
  if (spec.indexed)
    if (Status s = w.createIndexes(); !s) return s;
  return w.close();
}

namespace {

// Rank-file mode: every rank's records kept in memory (the simulation needs all ranks at once), then written one
// file at a time. Span names are indexes into `strings` until a file interns them.
class RankBuffers final : public Records {
 public:
  struct Rank {
    std::vector<SpanRow> spans;
    std::vector<CollectiveRow> collectives;
    std::vector<tracedb::GradStatRow> grads;
    std::vector<tracedb::StepStatRow> steps;
    std::vector<tracedb::AlertRow> alerts;
    int64_t lastNs = 0;  // the end of its last record, on the simulation's clock
  };
  explicit RankBuffers(int world) : ranks(static_cast<size_t>(world)) {}

  tracedb::Result<uint32_t> intern(const std::string& value) override {
    strings.push_back(value);  // the simulation caches ids: each name arrives once
    return static_cast<uint32_t>(strings.size() - 1);
  }
  Status addSpans(std::span<const SpanRow> spans) override {
    for (const SpanRow& s : spans) {
      Rank& r = ranks[static_cast<size_t>(s.rank)];
      r.spans.push_back(s);
      r.lastNs = std::max(r.lastNs, s.beginNs + s.durNs);
    }
    return Status::ok();
  }
  Status upsertCollective(const CollectiveRow& c) override {
    Rank& r = ranks[static_cast<size_t>(c.rank)];
    r.collectives.push_back(c);  // the simulation writes each (rank, group, seq) once
    r.lastNs = std::max(r.lastNs, c.endNs.value_or(c.enqueueNs));
    return Status::ok();
  }
  Status addGradStat(const tracedb::GradStatRow& g) override {
    ranks[static_cast<size_t>(g.rank)].grads.push_back(g);
    return Status::ok();
  }
  Status putStepStat(const tracedb::StepStatRow& s) override {
    ranks[static_cast<size_t>(s.rank)].steps.push_back(s);
    return Status::ok();
  }
  Status addAlert(const tracedb::AlertRow& a) override {
    ranks[static_cast<size_t>(a.rank)].alerts.push_back(a);
    return Status::ok();
  }

  std::vector<std::string> strings;
  std::vector<Rank> ranks;
};

constexpr int64_t kEpochUnixNs = 1'700'000'000'000'000'000;
constexpr int64_t kLeadNs = 2'000'000;  // a rank file's time 0 lies this far (± its shift) before the first step

// A rank file as the recorder writes it is on the rank's own clock: its epoch is when the rank started recording
// (ranks start a few µs apart) and its clock runs clock_offset_ns behind rank 0's. merge undoes both
// (run_files.h): t_run = t_file + (epoch_file − epoch_run) + offset. Here t_run = t_sim + kLeadNs for every rank.
struct RankClock {
  int64_t epochShiftNs;  // epoch_file − epoch_run (rank 0 and every 97th rank hold the earliest epoch)
  int64_t offsetNs;      // ranks.clock_offset_ns (rank 0: 0)
  explicit RankClock(int r) : epochShiftNs(int64_t{r % 97} * 10 * kUs), offsetNs(r == 0 ? 0 : (r % 11 - 5) * kUs) {}
  int64_t toFile(int64_t simNs) const { return simNs + kLeadNs - epochShiftNs - offsetNs; }
};

// The rank's own groups, as its recorder knows them.
Status putRankGroups(tracedb::Writer& w, const RunSpec& spec, int r) {
  const int tpIndex = r / spec.tp, dpIndex = r % spec.tp;
  if (Status s = w.putGroup({"tp-" + std::to_string(tpIndex), tpGroup(spec, tpIndex), "nccl"}); !s) return s;
  return w.putGroup({"dp-" + std::to_string(dpIndex), dpGroup(spec, dpIndex), "nccl"});
}

// The rank's records, moved onto its clock; span names interned in this file.
Status putRankRecords(tracedb::Writer& w, const RankBuffers& b, int r, RankBuffers::Rank& rec, const RankClock& clock) {
  std::vector<uint32_t> ids(b.strings.size(), 0);
  for (size_t i = 0; i < b.strings.size(); ++i) {
    auto id = w.intern(b.strings[i]);
    if (!id) return id.status();
    ids[i] = *id;
  }
  for (SpanRow& s : rec.spans) {
    s.name = ids[s.name];
    s.beginNs = clock.toFile(s.beginNs);
  }
  if (Status s = w.addSpans(rec.spans); !s) return s;
  for (CollectiveRow& c : rec.collectives) {
    c.enqueueNs = clock.toFile(c.enqueueNs);
    if (c.startNs) c.startNs = clock.toFile(*c.startNs);
    if (c.endNs) c.endNs = clock.toFile(*c.endNs);
    if (Status s = w.upsertCollective(c); !s) return s;
  }
  for (const auto& g : rec.grads)
    if (Status s = w.addGradStat(g); !s) return s;
  for (auto& st : rec.steps) {
    if (st.beginNs) st.beginNs = clock.toFile(*st.beginNs);
    if (st.endNs) st.endNs = clock.toFile(*st.endNs);
    if (Status s = w.putStepStat(st); !s) return s;
  }
  for (auto& a : rec.alerts) {
    a.tsNs = clock.toFile(a.tsNs);
    if (Status s = w.addAlert(a); !s) return s;
  }
  tracedb::RecorderStatsRow stats;
  stats.rank = r;
  stats.tsNs = clock.toFile(rec.lastNs);
  stats.spansWritten = static_cast<int64_t>(rec.spans.size());
  stats.recordsWritten = static_cast<int64_t>(rec.collectives.size() + rec.grads.size() + rec.steps.size());
  return w.addRecorderStats(stats);
}

// One rank file: meta and ranks row as the recorder writes them, the launcher's exit verdict, the records.
Status writeRankFile(const std::filesystem::path& dir, const RunSpec& spec, RankBuffers& b, int r, int64_t runEndNs) {
  const RankClock clock(r);
  tracedb::CreateOptions options;
  options.overwrite = true;
  options.runId = "scale-run";
  options.epochUnixNs = kEpochUnixNs + clock.epochShiftNs;
  options.source = "capture";
  auto writer = tracedb::Writer::create(dir / ("rank-" + std::to_string(r) + ".db"), options);
  if (!writer) return writer.status();
  tracedb::Writer& w = **writer;
  if (Status s = w.begin(); !s) return s;
  tracedb::RankInfo ri = rankInfo(spec, r);
  ri.clockOffsetNs = clock.offsetNs;
  ri.startNs = clock.toFile(-kLeadNs / 2);
  RankBuffers::Rank& rec = b.ranks[static_cast<size_t>(r)];
  ri.endNs = clock.toFile(ri.exitReason == "ok" ? rec.lastNs : runEndNs);  // a stopped job stops together
  namespace keys = tracedb::meta_keys;
  if (Status s = w.setMeta(keys::kTool, "tpscope_scale_gen (simulated recorder files)"); !s) return s;
  if (Status s = w.setMeta(keys::kConfig, configJson(spec)); !s) return s;
  if (spec.hostCpus > 0)
    if (Status s = w.setMeta(std::string(keys::kHostCpusPrefix) + ri.host, std::to_string(spec.hostCpus)); !s)
      return s;
  if (ri.exitReason != "ok")
    if (Status s = w.setMeta(keys::kCaptureExit, "signal SIGTERM"); !s) return s;
  if (Status s = w.putRank(ri); !s) return s;
  if (Status s = w.putThread(tracedb::ThreadInfo{r, 0, "cpu", "main"}); !s) return s;
  if (Status s = putRankGroups(w, spec, r); !s) return s;
  if (Status s = putRankRecords(w, b, r, rec, clock); !s) return s;
  rec = RankBuffers::Rank{};  // written: its memory is not needed any more
  if (Status s = w.commit(); !s) return s;
  return w.close();
}

}  // namespace

Status writeRankFiles(const std::filesystem::path& dir, const RunSpec& spec) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::error(dir.string() + ": cannot create the folder: " + ec.message());
  const int world = spec.tp * spec.dp;
  RankBuffers buffers(world);
  Sim sim = makeSim(spec, buffers);
  sim.run();
  if (!sim.status) return sim.status;
  int64_t runEnd = 0;
  for (const auto& r : buffers.ranks) runEnd = std::max(runEnd, r.lastNs);
  for (int r = 0; r < world; ++r)
    if (Status s = writeRankFile(dir, spec, buffers, r, runEnd); !s) return s;
  return Status::ok();
}

}  // namespace tpscope::testing
