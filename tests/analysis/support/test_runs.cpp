#include "test_runs.h"

#include <algorithm>
#include <map>
#include <memory>
#include <vector>

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

struct Sim {
  const RunSpec& spec;
  tracedb::Writer& w;
  int world;
  std::vector<int64_t> clock;   // per rank, ns
  std::vector<bool> stopped;    // dead, stalled or blocked: records nothing more
  std::map<std::string, int64_t> seq;  // per group
  std::map<std::string, uint32_t> names;
  std::vector<SpanRow> spans;
  Status status;

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
    span(rank, 0, SpanKind::Compute, n, clock[rank], d, step, layer, phase);
    for (int i = 0; i < spec.extraSpansPerCompute; ++i) {
      const int64_t part = d / (spec.extraSpansPerCompute + 1);
      span(rank, 0, SpanKind::Compute, n + ".op", clock[rank] + i * part, part, step, layer, phase);
    }
    clock[rank] += d;
  }

  std::vector<int> tpGroup(int dpIndex) const {
    std::vector<int> r;
    for (int t = 0; t < spec.tp; ++t) r.push_back(dpIndex * spec.tp + t);
    return r;
  }
  std::vector<int> dpGroup(int tpIndex) const {
    std::vector<int> r;
    for (int d = 0; d < spec.dp; ++d) r.push_back(d * spec.tp + tpIndex);
    return r;
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
          collective("tp-" + std::to_string(d), tpGroup(d), "all_reduce", spec.elements, kTransferNs,
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
        collective("dp-" + std::to_string(t), dpGroup(t), "all_reduce", 4096, kDpTransferNs,
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
          ss.tokens = 32;
          ss.beginNs = stepBegin[r];
          ss.endNs = clock[r];
          status = w.putStepStat(ss);
        }
      }
      if (spec.crashRank >= 0 && step == spec.crashStep) stopped[spec.crashRank] = true;
    }
    flushSpans();
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
        if (r == spec.spikeRank && step == spec.spikeStep && l == spec.layers - 1 && std::string(p) == "mlp.fc1.weight")
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
  if (Status s = w.setMeta("config", "{\"layers\": " + std::to_string(spec.layers) +
                                         ", \"hidden\": 16, \"seq_len\": 8, \"micro_batch_size\": " +
                                         std::to_string(spec.elements / 128) + "}");
      !s)
    return s;
  if (Status s = w.setMeta("clock_aligned", "1"); !s) return s;
  if (spec.hostCpus > 0)
    for (int node = 0; node * 4 < world; ++node)
      if (Status s = w.setMeta(std::string(tracedb::meta_keys::kHostCpusPrefix) + "node-" + std::to_string(node),
                               std::to_string(spec.hostCpus));
          !s)
        return s;
  const bool hang = spec.hangRank >= 0;
  for (int r = 0; r < world; ++r) {
    tracedb::RankInfo ri;
    ri.rank = r;
    ri.host = "node-" + std::to_string(r / 4);
    ri.pid = 1000 + r;
    ri.worldSize = world;
    ri.localRank = r % 4;
    ri.tpRank = r % spec.tp;
    ri.tpSize = spec.tp;
    ri.dpRank = r / spec.tp;
    ri.dpSize = spec.dp;
    ri.clockUncertaintyNs = 1000;
    ri.exitReason = r == spec.crashRank ? spec.crashReason : hang || spec.crashRank >= 0 ? spec.stopReason : "ok";
    if (Status s = w.putRank(ri); !s) return s;
    if (Status s = w.putThread(tracedb::ThreadInfo{r, 0, "cpu", "main"}); !s) return s;
  }
  Sim sim{spec, w, world, std::vector<int64_t>(world, 0), std::vector<bool>(world, false), {}, {}, {}, Status::ok()};
  for (int d = 0; d < spec.dp; ++d)
    if (Status s = w.putGroup(tracedb::GroupInfo{"tp-" + std::to_string(d), sim.tpGroup(d), "gloo"}); !s) return s;
  for (int t = 0; t < spec.tp; ++t)
    if (Status s = w.putGroup(tracedb::GroupInfo{"dp-" + std::to_string(t), sim.dpGroup(t), "gloo"}); !s) return s;
  sim.run();
  if (!sim.status) return sim.status;
  if (Status s = w.commit(); !s) return s;
  if (spec.indexed)
    if (Status s = w.createIndexes(); !s) return s;
  return w.close();
}

}  // namespace tpscope::testing
