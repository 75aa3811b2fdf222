// Gradient-health cost on the bench model's gradient (samples/configs/bench.json: 4 layers, hidden 512, ffn 2048,
// vocab 256 — 12.7 M fp32 elements in 52 tensors), one thread: what recording adds to every step (bench/capture).
// BM_GradHealth is the engine's call; the primitives below it are the passes it is built from, to see what one more
// or one fewer pass costs against a ~1 s step.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <limits>
#include <vector>

#include "tpscope/core/grad_health.h"

namespace {

std::vector<at::Tensor> benchGradients(bool withNan) {
  torch::manual_seed(7);
  const int64_t h = 512, f = 2048, v = 256, s = 256;
  std::vector<at::Tensor> g = {torch::randn({v, h}), torch::randn({s, h})};
  for (int layer = 0; layer < 4; ++layer) {
    for (auto shape : std::vector<std::vector<int64_t>>{{h}, {h}, {3 * h, h}, {3 * h}, {h, h}, {h}, {h}, {h},
                                                        {f, h}, {f}, {h, f}, {h}})
      g.push_back(torch::randn(shape));
  }
  g.push_back(torch::randn({h}));
  g.push_back(torch::randn({h}));
  if (withNan) g[10].view({-1})[5] = std::numeric_limits<float>::quiet_NaN();
  return g;
}

void BM_GradHealth(benchmark::State& state) {
  at::set_num_threads(1);
  const auto grads = benchGradients(state.range(0) != 0);
  int64_t n = 0;
  for (const auto& g : grads) n += g.numel();
  for (auto _ : state) benchmark::DoNotOptimize(tpscope::core::gradHealth(grads));
  state.SetBytesProcessed(state.iterations() * n * 4);
  state.counters["elements"] = static_cast<double>(n);
}
BENCHMARK(BM_GradHealth)->Arg(0)->Arg(1)->ArgNames({"with_nan"})->Unit(benchmark::kMillisecond);

template <class F>
void pass(benchmark::State& state, F&& f) {
  at::set_num_threads(1);
  const auto grads = benchGradients(false);
  for (auto _ : state)
    for (const auto& g : grads) benchmark::DoNotOptimize(f(g));
}
void BM_Pass_L2Norm(benchmark::State& s) { pass(s, [](const at::Tensor& g) { return at::linalg_vector_norm(g, 2); }); }
void BM_Pass_InfNorm(benchmark::State& s) {
  pass(s, [](const at::Tensor& g) { return at::linalg_vector_norm(g, std::numeric_limits<double>::infinity()); });
}
void BM_Pass_Dot(benchmark::State& s) {
  pass(s, [](const at::Tensor& g) { return at::dot(g.view({-1}), g.view({-1})); });
}
void BM_Pass_Aminmax(benchmark::State& s) { pass(s, [](const at::Tensor& g) { return at::aminmax(g); }); }
void BM_Pass_NanCount(benchmark::State& s) { pass(s, [](const at::Tensor& g) { return at::isnan(g).sum(); }); }
void BM_Pass_Sum(benchmark::State& s) { pass(s, [](const at::Tensor& g) { return g.sum(); }); }
BENCHMARK(BM_Pass_L2Norm)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Pass_InfNorm)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Pass_Dot)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Pass_Aminmax)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Pass_NanCount)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Pass_Sum)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
