// tpscope_core_test_worker <scenario> [args] [gtest flags]: one rank of a multi-process core test, launched by the
// gtest launcher (multiproc_test.cpp) with torchrun's environment. Each scenario is a GoogleTest test (CoreWorker.*)
// run inside the rank, so a failed check is a gtest failure with its message and the exit status says pass (0) or
// fail (1); the launcher reads the exit status, never the output.
//   layers        every TP layer at TP = WORLD_SIZE against the TP=1 layer built in this process (fp32, no dropout)
//   ce_known      vocab-parallel cross entropy against hand-computed values (with and without label smoothing)
//   recording     collectives, spans, gradient health and step stats through a fake probes Sink (runs 2 steps of
//                 the GPT trainer; argv[2] = config file)
//   timeout       rank 0 all-reduces alone; its error must name group, seq and op
//   grad_health   per-parameter gradient health (L2, max|g|, NaN, Inf) against known answers
//   blas          a matmul must run on an optimized BLAS (OpenBLAS), checked in /proc/self/maps
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "tpscope/core/gpt.h"
#include "tpscope/core/grad_health.h"
#include "tpscope/core/layers.h"
#include "tpscope/core/mesh.h"
#include "tpscope/core/trainer.h"
#include "tpscope/rules/config.h"

namespace core = tpscope::core;
namespace rules = tpscope::rules;
namespace probes = tpscope::probes;

namespace {

std::string g_configPath;  // the recording scenario's config file (argv[2])

int worldSize() {
  const char* w = std::getenv("WORLD_SIZE");
  return w != nullptr ? std::atoi(w) : 1;
}

void check(bool ok, const std::string& what) { EXPECT_TRUE(ok) << what; }

// Relative error: max |a - b| / max(max |b|, 1e-12).
double relErr(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.sizes() == b.sizes(), "shape ", a.sizes(), " vs ", b.sizes());
  const double denom = std::max(b.abs().max().item<double>(), 1e-12);
  return (a - b).abs().max().item<double>() / denom;
}

void checkClose(const at::Tensor& got, const at::Tensor& want, const std::string& what, double tol = 1e-5) {
  const double e = relErr(got.detach(), want.detach());
  check(e <= tol, what + " rel err " + std::to_string(e));
}

at::Tensor rnd(at::IntArrayRef shape, uint64_t seed) {
  return core::masterNormal(seed, "test-input", shape, 1.0);
}

// This rank's slice of a reference tensor `ref` whose shard has `shardShape` (the one dim that differs).
at::Tensor sliceLike(const at::Tensor& ref, const at::Tensor& shard, int rank, int n) {
  if (ref.sizes() == shard.sizes()) return ref;
  for (int64_t d = 0; d < ref.dim(); ++d)
    if (ref.size(d) != shard.size(d)) return ref.chunk(n, d)[rank];
  return ref;
}

// Runs ref (TP=1) and sharded modules on inputs, with loss = sum(out * w), and compares outputs, input grads and
// every parameter gradient. `inShard`/`outShard` map a full tensor to what this rank sees.
void compareModule(const std::string& name, torch::nn::Module& ref, torch::nn::Module& shard,
                   const std::function<at::Tensor(const at::Tensor&)>& runRef,
                   const std::function<at::Tensor(const at::Tensor&)>& runShard, const at::Tensor& input,
                   const std::function<at::Tensor(const at::Tensor&)>& inShard,
                   const std::function<at::Tensor(const at::Tensor&)>& outShard, int rank, int n,
                   core::Communicator* sumReplicatedOver = nullptr) {
  at::Tensor x = input.clone().requires_grad_(true);
  at::Tensor y = runRef(x);
  at::Tensor w = rnd(y.sizes(), 77);
  (y * w).sum().backward();
  at::Tensor xs = inShard(input).clone().requires_grad_(true);
  at::Tensor ys = runShard(xs);
  (ys * outShard(w)).sum().backward();
  checkClose(ys, outShard(y), name + " output");
  checkClose(xs.grad(), inShard(x.grad()), name + " input grad");
  auto refParams = ref.named_parameters();
  for (auto& kv : shard.named_parameters()) {
    const at::Tensor* r = refParams.find(kv.key());
    check(r != nullptr, name + " param " + kv.key() + " exists in the reference");
    if (r == nullptr) continue;
    checkClose(kv.value(), sliceLike(*r, kv.value(), rank, n), name + " " + kv.key() + " initial shard");
    at::Tensor g = kv.value().grad();
    // Sequence parallel: a replicated parameter sees one sequence chunk; its gradient is summed over TP.
    if (sumReplicatedOver != nullptr && n > 1 && g.sizes() == r->sizes()) {
      static const core::Callsite s{"test replicated-grad sum", -1};
      g = g.clone();
      sumReplicatedOver->allReduce(g, core::ReduceOp::Sum, s, probes::Phase::Backward);
    }
    checkClose(g, sliceLike(r->grad(), kv.value(), rank, n), name + " " + kv.key() + " grad");
  }
}

void scenarioLayers() {
  auto mesh = core::Mesh::fromEnvironment({.tp = worldSize(), .dp = 1});
  core::Communicator& tp = mesh->tpGroup();
  auto solo = core::Communicator::solo("ref", mesh->rank());
  const int r = tp.rank(), n = tp.size();
  const int64_t B = 2, S = 8, H = 16, F = 32, HEADS = 4, V = 64;
  auto id = [](const at::Tensor& t) { return t; };
  auto lastChunk = [&](const at::Tensor& t) { return t.chunk(n, -1)[r]; };
  auto seqChunk = [&](const at::Tensor& t) { return t.chunk(n, 1)[r]; };
  const at::Tensor x = rnd({B, S, H}, 1);

  for (bool gather : {false, true}) {
    auto mk = [&](core::Communicator* c) {
      return core::ColumnParallelLinear(core::ColumnParallelLinearOptions(H, F).tp(c).gather_output(gather).seed(5));
    };
    auto a = mk(solo.get()), b = mk(&tp);
    compareModule(std::string("ColumnParallelLinear gather_output=") + (gather ? "1" : "0"), *a, *b,
                  [&](const at::Tensor& t) { return a(t); }, [&](const at::Tensor& t) { return b(t); }, x, id,
                  gather ? std::function<at::Tensor(const at::Tensor&)>(id) : lastChunk, r, n);
  }
  for (bool parallelIn : {true, false}) {
    auto mk = [&](core::Communicator* c) {
      return core::RowParallelLinear(core::RowParallelLinearOptions(F, H).tp(c).input_is_parallel(parallelIn).seed(6));
    };
    auto a = mk(solo.get()), b = mk(&tp);
    const at::Tensor xf = rnd({B, S, F}, 2);
    compareModule(std::string("RowParallelLinear input_is_parallel=") + (parallelIn ? "1" : "0"), *a, *b,
                  [&](const at::Tensor& t) { return a(t); }, [&](const at::Tensor& t) { return b(t); }, xf,
                  parallelIn ? std::function<at::Tensor(const at::Tensor&)>(lastChunk) : id, id, r, n);
  }
  {
    auto mk = [&](core::Communicator* c) {
      return core::VocabParallelEmbedding(core::VocabParallelEmbeddingOptions(V, H).tp(c).seed(7));
    };
    auto a = mk(solo.get()), b = mk(&tp);
    at::Tensor ids = torch::randint(0, V, {B, S}, at::detail::createCPUGenerator(3), torch::kLong);
    at::Tensor ya = a(ids), yb = b(ids);
    at::Tensor w = rnd(ya.sizes(), 78);
    (ya * w).sum().backward();
    (yb * w).sum().backward();
    checkClose(yb, ya, "VocabParallelEmbedding output");
    checkClose(b->weight.grad(), sliceLike(a->weight.grad(), b->weight, r, n), "VocabParallelEmbedding weight grad");
  }
  for (bool sp : {false, true}) {
    auto mkA = [&](core::Communicator* c) {
      return core::ParallelAttention(core::ParallelAttentionOptions(H, HEADS).tp(c).sequence_parallel(sp).seed(8));
    };
    auto a = mkA(solo.get()), b = mkA(&tp);
    auto shardIo = sp ? std::function<at::Tensor(const at::Tensor&)>(seqChunk) : id;
    compareModule(std::string("ParallelAttention sequence_parallel=") + (sp ? "1" : "0"), *a, *b,
                  [&](const at::Tensor& t) { return a(t); }, [&](const at::Tensor& t) { return b(t); }, x, shardIo,
                  shardIo, r, n, sp ? &tp : nullptr);
    auto mkM = [&](core::Communicator* c) {
      return core::ParallelMLP(core::ParallelMLPOptions(H, F).tp(c).sequence_parallel(sp).seed(9));
    };
    auto ma = mkM(solo.get()), mb = mkM(&tp);
    compareModule(std::string("ParallelMLP sequence_parallel=") + (sp ? "1" : "0"), *ma, *mb,
                  [&](const at::Tensor& t) { return ma(t); }, [&](const at::Tensor& t) { return mb(t); }, x, shardIo,
                  shardIo, r, n, sp ? &tp : nullptr);
  }
  for (double eps : {0.0, 0.1}) {
    const at::Tensor logits = rnd({B * S, V}, 4) * 3;
    at::Tensor targets = torch::randint(0, V, {B * S}, at::detail::createCPUGenerator(5), torch::kLong);
    static const core::Callsite site{"test CE", -1};
    at::Tensor la = logits.clone().requires_grad_(true);
    at::Tensor lossA = core::vocabParallelCrossEntropy(la, targets, *solo, 0, V, eps, site);
    at::Tensor lb = logits.chunk(n, 1)[r].clone().requires_grad_(true);
    at::Tensor lossB = core::vocabParallelCrossEntropy(lb, targets, tp, r * V / n, V, eps, site);
    at::Tensor w = rnd({B * S}, 79);
    (lossA * w).sum().backward();
    (lossB * w).sum().backward();
    // Reference: LibTorch's own cross entropy over the full logits.
    at::Tensor want = torch::nn::functional::cross_entropy(
        logits, targets,
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone).label_smoothing(eps));
    const std::string tag = "vocab-parallel CE label_smoothing=" + std::to_string(eps);
    checkClose(lossA, want, tag + " TP=1 vs torch cross_entropy");
    checkClose(lossB, want, tag + " loss vs torch cross_entropy");
    checkClose(lb.grad(), la.grad().chunk(n, 1)[r], tag + " logits grad");
  }
  {
    // Whole GPT forward/backward (tiny, fp32): loss and every parameter gradient.
    for (bool sp : {false, true}) {
      auto mk = [&](core::Communicator* c) {
        return core::Gpt(core::GptOptions().layers(2).hidden(H).heads(HEADS).ffn_hidden(F).seq_len(S).vocab_size(V)
                             .sequence_parallel(sp).tp(c).seed(11));
      };
      auto a = mk(solo.get()), b = mk(&tp);
      at::Tensor ids = torch::randint(0, V, {B, S}, at::detail::createCPUGenerator(6), torch::kLong);
      at::Tensor tg = torch::randint(0, V, {B, S}, at::detail::createCPUGenerator(7), torch::kLong);
      at::Tensor la = a(ids, tg), lb = b(ids, tg);
      la.backward();
      lb.backward();
      const std::string tag = std::string("Gpt sequence_parallel=") + (sp ? "1" : "0");
      checkClose(lb, la, tag + " loss");
      auto refParams = a->named_parameters();
      for (auto& kv : b->named_parameters()) {
        at::Tensor g = kv.value().grad();
        // Sequence parallel: replicated params hold a partial (per-chunk) gradient; the trainer sums it over TP.
        if (sp && g.sizes() == refParams[kv.key()].sizes() && n > 1) {
          g = g.clone();
          static const core::Callsite s{"test sum", -1};
          tp.allReduce(g, core::ReduceOp::Sum, s, probes::Phase::Backward);
        }
        checkClose(g, sliceLike(refParams[kv.key()].grad(), kv.value(), r, n), tag + " " + kv.key() + " grad");
      }
    }
  }
}

void scenarioCeKnown() {
  auto mesh = core::Mesh::fromEnvironment({.tp = worldSize(), .dp = 1});
  core::Communicator& tp = mesh->tpGroup();
  const int r = tp.rank(), n = tp.size();
  static const core::Callsite site{"test CE", -1};
  // V = 4 logits [0, 0, ln 2, ln 4] (softmax 1/8, 1/8, 2/8, 4/8); target 3 and target 0.
  const double l2 = std::log(2.0), l4 = std::log(4.0);
  at::Tensor logits = torch::tensor({0.0, 0.0, l2, l4, 0.0, 0.0, l2, l4}, torch::kFloat).view({2, 4});
  at::Tensor targets = torch::tensor({3, 0}, torch::kLong);
  const int64_t V = 4;
  for (double eps : {0.0, 0.2}) {
    at::Tensor lb = logits.chunk(n, 1)[r].clone().requires_grad_(true);
    at::Tensor loss = core::vocabParallelCrossEntropy(lb, targets, tp, r * V / n, V, eps, site);
    // logZ = ln 8. nll(3) = ln 8 - ln 4 = ln 2; nll(0) = ln 8. mean_v z = (ln 2 + ln 4) / 4 = 3/4 ln 2.
    const double logZ = std::log(8.0), meanZ = 0.75 * l2;
    const double want0 = (1 - eps) * l2 + eps * (logZ - meanZ);
    const double want1 = (1 - eps) * logZ + eps * (logZ - meanZ);
    checkClose(loss, torch::tensor({want0, want1}, torch::kFloat),
               "CE known answer eps=" + std::to_string(eps) + " tp=" + std::to_string(n), 1e-6);
    loss.sum().backward();
    // d/dz = softmax - (1-eps) onehot - eps/V, row 0 target 3.
    at::Tensor p = torch::tensor({0.125, 0.125, 0.25, 0.5}, torch::kFloat);
    at::Tensor g0 = p - eps / V, g1 = p - eps / V;
    g0[3] -= (1 - eps);
    g1[0] -= (1 - eps);
    checkClose(lb.grad(), torch::stack({g0, g1}).chunk(n, 1)[r], "CE known gradient eps=" + std::to_string(eps), 1e-6);
  }
}

// A probes Sink that keeps what it is told, for the recording scenario.
class FakeSink final : public probes::Sink {
 public:
  struct Coll {
    std::string group, op, dtype, callsite;
    uint64_t seq;
    int64_t bytes;
    std::vector<probes::CollectiveState> states;
  };
  probes::ThreadBuffer* acquireThreadBuffer() noexcept override {
    std::lock_guard<std::mutex> l(mu);
    buffers.push_back(std::make_unique<probes::ThreadBuffer>());
    return buffers.back().get();
  }
  uint64_t collectiveEnqueued(const probes::CollectiveDesc& d, uint64_t) noexcept override {
    std::lock_guard<std::mutex> l(mu);
    colls.push_back({std::string(d.group), std::string(d.op), std::string(d.dtype), std::string(d.callsite), d.seq,
                     d.bytes, {probes::CollectiveState::Scheduled}});
    return colls.size() - 1;
  }
  void collectiveState(uint64_t h, probes::CollectiveState s, uint64_t) noexcept override {
    std::lock_guard<std::mutex> l(mu);
    colls[h].states.push_back(s);
  }
  void gradStats(int step, std::span<const probes::GradStat> s) noexcept override {
    std::lock_guard<std::mutex> l(mu);
    gradSteps.push_back(step);
    gradCount = s.size();
    for (const auto& g : s) gradOk &= std::isfinite(g.l2Norm) && g.l2Norm >= 0 && g.nanCount == 0;
  }
  void stepStat(const probes::StepStat& s) noexcept override {
    std::lock_guard<std::mutex> l(mu);
    steps.push_back(s.step);
  }
  void alert(const probes::Alert&) noexcept override {}
  void counter(std::string_view, double, uint64_t) noexcept override {}
  void flush() noexcept override {}

  std::mutex mu;
  std::vector<std::unique_ptr<probes::ThreadBuffer>> buffers;
  std::vector<Coll> colls;
  std::vector<int> gradSteps, steps;
  size_t gradCount = 0;
  bool gradOk = true;
};

void scenarioRecording(const std::string& configPath) {
  const int world = worldSize();
  auto mesh = core::Mesh::fromEnvironment({.tp = world, .dp = 1});
  static FakeSink sink;
  probes::detail::g_sink.store(&sink);
  probes::detail::g_recording.store(true);
  rules::TrainConfig cfg = rules::TrainConfig::fromFile(configPath);
  core::Trainer trainer(cfg, *mesh);
  trainer.trainStep(1);
  trainer.trainStep(2);
  probes::detail::g_recording.store(false);

  std::map<std::string, uint64_t> lastSeq;
  bool seqOk = true, statesOk = true, sawRowFwd = false, sawCopyBwd = false, sawCe = false;
  std::ostringstream sig;
  for (const auto& c : sink.colls) {
    seqOk &= c.seq == lastSeq[c.group] + 1;
    lastSeq[c.group] = c.seq;
    statesOk &= c.states.size() == 3 && c.states[1] == probes::CollectiveState::Started &&
                c.states[2] == probes::CollectiveState::Completed;
    sawRowFwd |= c.callsite == "layer 1 attention output RowParallel forward all-reduce" && c.group == "tp-0";
    sawCopyBwd |= c.callsite == "layer 0 mlp fc1 ColumnParallel backward all-reduce";
    sawCe |= c.callsite.find("vocab-parallel cross entropy forward all-reduce") != std::string::npos;
    sig << c.group << ':' << c.seq << ':' << c.op << ':' << c.dtype << ':' << c.bytes << ':' << c.callsite << ';';
  }
  check(!sink.colls.empty(), "collectives recorded: " + std::to_string(sink.colls.size()));
  check(seqOk, "per-group sequence numbers count 1, 2, 3, ...");
  check(statesOk, "every collective went enqueued -> started -> completed");
  check(sawRowFwd, "callsite 'layer 1 attention output RowParallel forward all-reduce' on tp-0");
  check(sawCopyBwd, "callsite 'layer 0 mlp fc1 ColumnParallel backward all-reduce'");
  check(sawCe, "vocab-parallel cross entropy collectives recorded");
  check(sink.gradSteps == std::vector<int>{1, 2}, "gradStats once per step");
  check(sink.gradCount > 10 && sink.gradOk, "gradStats covers every parameter with finite norms");
  check(sink.steps == std::vector<int>{1, 2}, "stepStat once per step");
  uint64_t spans = 0;
  std::map<std::string, int> names;
  for (auto& b : sink.buffers) {
    spans += b->head.load();
    for (uint64_t i = 0; i < b->head.load(); ++i) names[b->events[i].site->name]++;
  }
  check(names["train step"] == 2 && names["attention forward"] == 2 * cfg.layers &&
            names["attention backward"] == 2 * cfg.layers && names["mlp backward"] == 2 * cfg.layers &&
            names["optimizer step"] == 2 && names["data loading"] == 2 && names["gradient clipping"] == 2 &&
            names["embedding forward"] == 2 && names["loss backward"] == 2,
        "spans: step, data, per-layer forward and backward, clipping, optimizer (" + std::to_string(spans) + ")");
  // Every rank must have seen the same collectives in the same order (compared by the launcher).
  std::printf("SIGNATURE %zu\n", std::hash<std::string>{}(sig.str()));
}

[[noreturn]] void scenarioTimeout() {
  core::MeshOptions mo;
  mo.tp = worldSize();
  mo.timeout = std::chrono::milliseconds(3000);
  auto mesh = core::Mesh::fromEnvironment(mo);
  static const core::Callsite site{"test lonely", 2};
  at::Tensor t = torch::ones({4});
  if (mesh->rank() != 0) {
    std::this_thread::sleep_for(std::chrono::seconds(8));
    std::fflush(stdout);
    std::_Exit(0);
  }
  tpscope::core::Communicator& tp = mesh->tpGroup();
  tp.allReduce(t, core::ReduceOp::Sum, site, probes::Phase::Forward);  // seq 1: everyone joins? no: rank 1 sleeps
  check(false, "a lone all-reduce returned instead of timing out");
  std::_Exit(1);
}

void scenarioTimeoutChecked() {
  try {
    scenarioTimeout();
  } catch (const core::CollectiveError& e) {
    const std::string m = e.what();
    std::printf("error: %s\n", m.c_str());
    check(e.timedOut(), "error says timed out");
    check(m.find("group tp-0") != std::string::npos, "error names the group");
    check(m.find("seq 1") != std::string::npos, "error names the sequence number");
    check(m.find("all_reduce") != std::string::npos, "error names the op");
    check(m.find("layer 2 test lonely forward all-reduce") != std::string::npos, "error names the callsite");
    std::fflush(stdout);
    std::_Exit(::testing::Test::HasFailure() ? 1 : 0);
  }
}

void scenarioGradHealth() {
  // Known answers: [3, 4] -> norm 5, max 4; [-7] -> 7, 7; NaN and Inf counted; an undefined grad is all zeros.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<at::Tensor> grads{torch::tensor({3.0, 4.0}), torch::tensor({-7.0}), at::Tensor(),
                                torch::tensor({1.0, std::nan(""), inf, -inf, 2.0})};
  const tpscope::core::GradHealthStats st = tpscope::core::gradHealth(grads);
  check(st.values.sizes() == at::IntArrayRef({4, 2}) && st.counts.sizes() == at::IntArrayRef({4, 2}),
        "one row of 4 stats per parameter");
  check(st.counts.scalar_type() == at::kLong, "NaN/Inf counts are integers (exact beyond 2^24 elements)");
  auto a = st.values.accessor<float, 2>();
  auto n = st.counts.accessor<int64_t, 2>();
  check(a[0][core::kL2Norm] == 5.0f && a[0][core::kMaxAbs] == 4.0f, "L2 norm and max|g| of [3, 4]");
  check(a[1][core::kL2Norm] == 7.0f && a[1][core::kMaxAbs] == 7.0f, "L2 norm and max|g| of [-7]");
  check(a[2][core::kL2Norm] == 0.0f && n[2][core::kNanCount] == 0, "undefined gradient reads as empty");
  check(n[3][core::kNanCount] == 1 && n[3][core::kInfCount] == 2, "NaN and Inf counts");
  check(n[0][core::kNanCount] == 0 && n[1][core::kInfCount] == 0, "finite gradients count no NaN/Inf");
  // The flat form over a bf16 buffer agrees with the per-tensor form.
  at::Tensor flat = torch::cat({torch::tensor({3.0, 4.0}), torch::tensor({-7.0})}).to(at::kBFloat16);
  const tpscope::core::GradHealthStats st2 =
      tpscope::core::gradHealthFlat(flat, tpscope::core::gradHealthSegments({2, 1}), 2);
  checkClose(st2.values, st.values.narrow(0, 0, 2), "flat bf16 buffer gives the same stats", 1e-6);
  check(at::equal(st2.counts, st.counts.narrow(0, 0, 2)), "flat bf16 buffer gives the same counts");
}

// LibTorch's matmul runs on an optimised BLAS: MKL, linked into the PyPI wheel, or a system OpenBLAS.
void scenarioBlas() {
  at::Tensor a = torch::randn({256, 256}), b = torch::randn({256, 256});
  at::Tensor c = torch::mm(a, b);
  (void)c.sum().item<float>();
  std::ifstream maps("/proc/self/maps");
  std::string line;
  bool openblas = false;
  while (std::getline(maps, line)) openblas |= line.find("libopenblas") != std::string::npos;
  EXPECT_TRUE(at::hasMKL() || openblas)
      << "LibTorch has no MKL and no libopenblas is mapped after a matmul: it runs on the reference BLAS (~10x "
         "slower). Use PyTorch's PyPI wheel (it carries MKL) or install libopenblas0-openmp.";
}

TEST(CoreWorker, Layers) { scenarioLayers(); }
TEST(CoreWorker, CeKnown) { scenarioCeKnown(); }
TEST(CoreWorker, Recording) { scenarioRecording(g_configPath); }
TEST(CoreWorker, Timeout) { scenarioTimeoutChecked(); }
TEST(CoreWorker, GradHealth) { scenarioGradHealth(); }
TEST(CoreWorker, Blas) { scenarioBlas(); }

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);  // takes the --gtest_* flags out of argv
  static const std::map<std::string, std::string> kTests = {
      {"layers", "Layers"}, {"ce_known", "CeKnown"}, {"recording", "Recording"},
      {"timeout", "Timeout"}, {"grad_health", "GradHealth"}, {"blas", "Blas"}};
  const auto test = argc >= 2 ? kTests.find(argv[1]) : kTests.end();
  if (test == kTests.end() || (test->first == "recording" && argc < 3)) {
    std::fprintf(stderr, "usage: %s layers|ce_known|recording CONFIG|timeout|grad_health|blas\n", argv[0]);
    return 2;
  }
  if (argc >= 3) g_configPath = argv[2];
  at::set_num_threads(1);
  GTEST_FLAG_SET(filter, "CoreWorker." + test->second);
  const int rc = RUN_ALL_TESTS();
  std::fflush(stdout);
  return rc;
}
