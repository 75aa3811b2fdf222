#include "fixture_run.h"

#include <unistd.h>

#include <limits>
#include <random>
#include <vector>

#include "tpscope/tracedb/lane_summary.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::gui::testing {

namespace fs = std::filesystem;
using namespace tpscope::tracedb;

// 2 complete steps × (2 layers fwd + 2 layers bwd) all-reduces, then the stuck one.
const int64_t kStuckSeq = (kFixtureSteps - 1) * kFixtureLayers * 2;

// One folder per process: ctest runs each test in its own process, several at once (-j), and two test processes
// rewriting the same fixture would read each other's half-written files.
fs::path scratchDir(const std::string& name) {
  fs::path dir = fs::path(TPSCOPE_GUI_TEST_SCRATCH) / (name + "-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  return dir;
}

std::string writeRankFile(const fs::path& path, int rank, int64_t epochUnixNs, int64_t clockOffsetNs,
                          const std::string& name) {
  CreateOptions o;
  o.runId = "live";
  o.epochUnixNs = epochUnixNs;
  o.overwrite = true;
  auto w = Writer::create(path, o);
  if (!w) return w.error();
  RankInfo info;
  info.rank = rank;
  info.worldSize = 2;
  info.clockOffsetNs = clockOffsetNs;
  if (auto s = (*w)->putRank(info); !s) return s.message();
  auto id = (*w)->intern(name);
  if (!id) return id.error();
  if (auto s = (*w)->addSpan({rank, 0, SpanKind::Compute, *id, 1000, 500, 0, 0, Phase::Forward, {}}); !s)
    return s.message();
  if (auto s = (*w)->close(); !s) return s.message();
  return {};
}

const std::vector<PipelinePass> kPipelinePasses = {
    {0, false, 0, 0, 2'000'000},          {0, false, 1, 2'000'000, 2'000'000},  {0, true, 0, 9'000'000, 4'000'000},
    {0, false, 2, 13'000'000, 2'000'000}, {0, true, 1, 16'000'000, 4'000'000}, {0, false, 3, 20'000'000, 2'000'000},
    {0, true, 2, 24'000'000, 4'000'000},  {0, true, 3, 33'000'000, 4'000'000},  {1, false, 0, 2'000'000, 2'000'000},
    {1, true, 0, 4'000'000, 5'000'000},   {1, false, 1, 9'000'000, 2'000'000},  {1, true, 1, 11'000'000, 5'000'000},
    {1, false, 2, 16'000'000, 2'000'000}, {1, true, 2, 18'000'000, 5'000'000}, {1, false, 3, 23'000'000, 2'000'000},
    {1, true, 3, 25'000'000, 5'000'000},
};

namespace {

// A run file as merge writes it (overwritten, clock aligned), for the fixtures below.
Result<std::unique_ptr<Writer>> newMergedRun(const fs::path& path, const std::string& runId) {
  CreateOptions o;
  o.overwrite = true;
  o.runId = runId;
  o.source = "merge";
  auto w = Writer::create(path, o);
  if (!w) return w.status();
  if (Status s = (*w)->setMeta(meta_keys::kClockAligned, "1"); !s) return s;
  return w;
}

std::string errorOf(const Status& s) { return s.isOk() ? std::string() : s.message(); }

}  // namespace

std::string writeNestedRun(const fs::path& path, unsigned seed) {
  auto w = newMergedRun(path, "nested");
  if (!w) return w.error();
  auto check = errorOf;
  std::mt19937_64 rng(seed);
  auto between = [&](int64_t a, int64_t b) { return std::uniform_int_distribution<int64_t>(a, b)(rng); };
  std::vector<uint32_t> names;
  for (const char* n : {"step", "layer", "aten::mm", "aten::add", "tiny", "kernel", "whole run"}) {
    auto id = (*w)->intern(n);
    if (!id) return id.error();
    names.push_back(*id);
  }
  int64_t runEnd = 0;
  for (int r = 0; r < 2; ++r) {
    RankInfo info;
    info.rank = r;
    info.worldSize = 2;
    if (auto e = check((*w)->putRank(info)); !e.empty()) return e;
    int64_t t = between(0, 50'000);
    for (int step = 0; step < 60; ++step) {
      const int64_t stepBegin = t;
      int64_t c = stepBegin + between(0, 2'000);
      for (int layer = 0; layer < 8; ++layer) {
        const int64_t layerBegin = c;
        for (int op = 0; op < 6; ++op) {
          const int64_t opBegin = c;
          for (int k = between(0, 4); k > 0; --k) {
            const int64_t d = between(50, 3'000);
            if (auto e = check((*w)->addSpan({r, 0, SpanKind::Compute, names[4], c, d, step, layer, Phase::Forward,
                                              {}}));
                !e.empty())
              return e;
            c += d + between(0, 200);
          }
          c += between(1'000, 20'000);
          if (auto e = check((*w)->addSpan({r, 0, SpanKind::Compute, names[2 + op % 2], opBegin, c - opBegin, step,
                                            layer, Phase::Forward, {}}));
              !e.empty())
            return e;
          if (between(0, 3) == 0) {  // a sparse stream of short kernels
            if (auto e = check((*w)->addSpan({r, 7, SpanKind::Kernel, names[5], opBegin + between(0, 500),
                                              between(100, 900), step, layer, Phase::None, {}}));
                !e.empty())
              return e;
          }
          c += between(0, 3'000);
        }
        if (auto e = check((*w)->addSpan({r, 0, SpanKind::Compute, names[1], layerBegin, c - layerBegin, step, layer,
                                          Phase::Forward, {}}));
            !e.empty())
          return e;
        c += between(0, 10'000);
      }
      c += between(0, 100'000);
      if (auto e = check((*w)->addSpan({r, 0, SpanKind::Compute, names[0], stepBegin, c - stepBegin, step, -1,
                                        Phase::Other, {}}));
          !e.empty())
        return e;
      t = c + between(0, 400'000);  // idle between steps
    }
    runEnd = std::max(runEnd, t);
  }
  if (auto e = check((*w)->addSpan({1, 9, SpanKind::Other, names[6], 0, runEnd, -1, -1, Phase::None, {}})); !e.empty())
    return e;
  if (auto e = check((*w)->createIndexes()); !e.empty()) return e;
  if (auto e = check((*w)->close()); !e.empty()) return e;
  return check(writeLaneSummary(path));
}

std::string writePipelineRun(const fs::path& path) {
  auto w = newMergedRun(path, "pipeline");
  if (!w) return w.error();
  auto check = errorOf;
  if (auto e = check((*w)->setMeta(meta_keys::kPipeline, R"({"schedule":"1f1b","stages":2,"microbatches":4,)"
                                                         R"("virtual_stages":1,"stage_of_rank":[0,1]})"));
      !e.empty())
    return e;
  for (int r = 0; r < 2; ++r) {
    RankInfo info;
    info.rank = r;
    info.worldSize = 2;
    if (auto e = check((*w)->putRank(info)); !e.empty()) return e;
  }
  for (int step = 0; step < 2; ++step)
    for (const PipelinePass& p : kPipelinePasses) {
      auto name = (*w)->intern((p.backward ? "backward mb " : "forward mb ") + std::to_string(p.microbatch));
      if (!name) return name.error();
      const SpanRow span{p.stage, 0, SpanKind::Compute, *name, step * kPipelineStepNs + p.beginNs, p.durNs, step, -1,
                         p.backward ? Phase::Backward : Phase::Forward, {}};
      if (auto e = check((*w)->addSpan(span)); !e.empty()) return e;
    }
  return check((*w)->close());
}

std::string writeFixtureRun(const fs::path& path) {
  CreateOptions options;
  options.overwrite = true;
  options.runId = "fixture";
  options.epochUnixNs = 1'700'000'000'000'000'000;
  options.source = "merge";
  auto created = Writer::create(path, options);
  if (!created) return created.error();
  Writer& w = **created;
  auto check = [](const Status& s) { return s.isOk() ? std::string() : s.message(); };
  std::string err;
#define FIX_TRY(expr)                 \
  if (!(err = check(expr)).empty()) { \
    return err;                       \
  }
  FIX_TRY(w.begin());
  FIX_TRY(w.setMeta(meta_keys::kClockAligned, "1"));
  FIX_TRY(w.setMeta(meta_keys::kConfig, R"({"layers":2,"hidden":64,"seq_len":16,"micro_batch_size":2,"tp":4})"));
  for (int r = 0; r < kFixtureRanks; ++r) {
    RankInfo info;
    info.rank = r;
    info.host = "node-0";
    info.worldSize = kFixtureRanks;
    info.localRank = r;
    info.tpRank = r;
    info.tpSize = kFixtureRanks;
    info.startNs = 0;
    info.endNs = kFixtureSteps * kStepNs;
    FIX_TRY(w.putRank(info));
    FIX_TRY(w.putThread({r, 0, "cpu", "main"}));
    FIX_TRY(w.putThread({r, 7, "cuda-stream", "stream 7"}));
  }
  FIX_TRY(w.putGroup({"tp-0", {0, 1, 2, 3}, "gloo"}));
  FIX_TRY(w.putGroup({"dp-0", {0, 2}, "gloo"}));

  auto id = [&](const std::string& s) -> uint32_t { return w.intern(s).isOk() ? *w.intern(s) : 0; };
  const uint32_t stepName = id("train_step"), dataName = id("data_loading"), optName = id("optimizer.step");
  int64_t seq = 0;
  for (int step = 0; step < kFixtureSteps; ++step) {
    const int64_t t0 = step * kStepNs;
    const bool last = step == kFixtureSteps - 1;
    for (int r = 0; r < kFixtureRanks; ++r) {
      SpanRow stepSpan{r, 0, SpanKind::Step, stepName, t0, kStepNs - 200'000, step, -1, Phase::None, {}};
      if (last) stepSpan.durNs = kStepNs / 2;  // the hang: the step never ends properly
      FIX_TRY(w.addSpan(stepSpan));
      FIX_TRY(w.addSpan({r, 0, SpanKind::Data, dataName, t0 + 100'000, 400'000, step, -1, Phase::Data, {}}));
      StepStatRow st;
      st.rank = r;
      st.step = step;
      st.loss = step == kNanStep ? std::numeric_limits<double>::quiet_NaN() : 3.0 - 0.1 * step;
      st.lr = 1e-3;
      st.gradNorm = 1.0;
      st.tokens = 32;
      st.beginNs = t0;
      st.endNs = t0 + stepSpan.durNs;
      FIX_TRY(w.putStepStat(st));
    }
    if (last) {
      // Rank 1 is stuck in data loading; the others enter the all-reduce of layer 0's forward and wait.
      for (int r = 0; r < kFixtureRanks; ++r) {
        if (r == kMissingRank) {
          FIX_TRY(w.addSpan({r, 0, SpanKind::Data, dataName, t0 + 600'000, 4'000'000, step, -1, Phase::Data, {}}));
          continue;
        }
        const int64_t at = t0 + 1'500'000 + r * 10'000;
        FIX_TRY(w.addSpan({r, 0, SpanKind::Compute, id("layers.0.attention"), t0 + 600'000, 900'000, step, 0,
                           Phase::Forward, {}}));
        FIX_TRY(w.addSpan({r, 0, SpanKind::Comm, id("all_reduce"), at, 3'400'000, step, 0, Phase::Forward, {}}));
        CollectiveRow c;
        c.rank = r;
        c.group = kStuckGroup;
        c.seq = kStuckSeq;
        c.op = "all_reduce";
        c.dtype = "float32";
        c.shape = {2, 16, 64};
        c.numel = 2048;
        c.bytes = 8192;
        c.callsite = "layers.0.attention.dense RowParallel fwd";
        c.step = step;
        c.layer = 0;
        c.phase = Phase::Forward;
        c.enqueueNs = at;
        c.startNs = at + 5'000;
        c.state = CollectiveState::Started;
        FIX_TRY(w.upsertCollective(c));
      }
      break;
    }
    // fwd layers 0..1 then bwd layers 1..0, each: compute span, a kernel on the stream, then a TP all-reduce.
    int64_t t = t0 + 600'000;
    for (int pass = 0; pass < 2; ++pass) {
      for (int i = 0; i < kFixtureLayers; ++i) {
        const int layer = pass == 0 ? i : kFixtureLayers - 1 - i;
        const Phase phase = pass == 0 ? Phase::Forward : Phase::Backward;
        const std::string lname = "layers." + std::to_string(layer) + (pass == 0 ? ".fwd" : ".bwd");
        for (int r = 0; r < kFixtureRanks; ++r) {
          const int64_t skew = r == 3 ? 150'000 : r * 20'000;  // rank 3 arrives late: a mild straggler
          FIX_TRY(w.addSpan({r, 0, SpanKind::Compute, id(lname), t, 1'000'000 + skew, step, layer, phase, {}}));
          FIX_TRY(w.addSpan({r, 7, SpanKind::Kernel, id("gemm_kernel"), t + 100'000, 800'000, step, layer, phase,
                             {}}));
          const int64_t arrive = t + 1'000'000 + skew;
          const int64_t done = t + 1'000'000 + 150'000 + 300'000;
          FIX_TRY(w.addSpan({r, 0, SpanKind::Comm, id("all_reduce"), arrive, done - arrive, step, layer, phase, {}}));
          FIX_TRY(w.addSpan({r, 7, SpanKind::NcclKernel, id("ncclAllReduceKernel"), t + 1'000'000 + 150'000,
                             300'000, step, layer, phase, {}}));
          CollectiveRow c;
          c.rank = r;
          c.group = "tp-0";
          c.seq = seq;
          c.op = "all_reduce";
          c.dtype = "float32";
          c.shape = {2, 16, 64};
          c.numel = 2048;
          c.bytes = 8192;
          c.callsite = lname;
          c.step = step;
          c.layer = layer;
          c.phase = phase;
          c.enqueueNs = arrive;
          c.startNs = t + 1'000'000 + 150'000;
          c.endNs = done;
          c.state = CollectiveState::Completed;
          FIX_TRY(w.upsertCollective(c));
          // Gradients after the backward pass of this layer.
          if (pass == 1) {
            for (const char* p : {"attn.qkv.weight", "mlp.fc2.weight"}) {
              GradStatRow g;
              g.rank = r;
              g.step = step;
              g.layer = layer;
              g.param = "layers." + std::to_string(layer) + "." + p;
              g.l2Norm = 1.0 + 0.1 * r + 0.05 * layer + 0.2 * step;
              g.maxAbs = 0.1;
              g.numel = 4096;
              if (step == kNanStep && r == kNanRank && layer == kNanLayer && std::string(p) == "mlp.fc2.weight")
                g.nanCount = 3;
              if (step == kNanStep && layer < kNanLayer) g.nanCount = 4096;  // spread by the all-reduce
              FIX_TRY(w.addGradStat(g));
            }
          }
        }
        ++seq;
        t += 1'600'000;
      }
    }
    for (int r = 0; r < kFixtureRanks; ++r)
      FIX_TRY(w.addSpan({r, 0, SpanKind::Optimizer, optName, t, 500'000, step, -1, Phase::Optimizer, {}}));
  }
  AlertRow a;
  a.rank = kNanRank;
  a.step = kNanStep;
  a.tsNs = kNanStep * kStepNs + 5'000'000;
  a.severity = "critical";
  a.kind = "nonfinite_grad";
  a.layer = kNanLayer;
  a.param = "layers.1.mlp.fc2.weight";
  a.message = "3 NaN in layers.1.mlp.fc2.weight gradient";
  FIX_TRY(w.addAlert(a));
  FIX_TRY(w.commit());
  FIX_TRY(w.createIndexes());
  FIX_TRY(w.close());
#undef FIX_TRY
  return {};
}

}  // namespace tpscope::gui::testing
