#include "tpscope/core/grad_health.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace tpscope::core {

at::Tensor gradHealthSegments(const std::vector<int64_t>& numels) { return torch::tensor(numels, torch::kLong); }

namespace {

// One read of a contiguous fp32 CPU tensor for its L2 norm and its min and max: what linalg_vector_norm and aminmax
// take two passes over memory for (the step's gradients do not fit the caches, so the second pass costs as much as the
// first; measured in a recording run of bench.json: 4.5 + 6.4 ms per step, bench/core). The squares are summed in
// 16 float lanes over blocks of 4096 elements, each block's sum added in double: a relative error below 1e-6 on
// these sizes, as ATen's cascade sum. min/max skip NaN: a tensor whose sum of squares is not finite is left to
// aminmax (NaN propagates there, as max |g| reports it), which runs only then.
struct CpuPass {
  double sumSquares = 0;
  float min = std::numeric_limits<float>::infinity(), max = -std::numeric_limits<float>::infinity();
};

CpuPass cpuPass(const float* p, int64_t n) {
  constexpr int kLanes = 16;
  constexpr int64_t kBlock = 4096;
  float lo[kLanes], hi[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    lo[l] = std::numeric_limits<float>::infinity();
    hi[l] = -std::numeric_limits<float>::infinity();
  }
  CpuPass out;
  const int64_t whole = n - n % kLanes;
  for (int64_t i = 0; i < whole;) {
    const int64_t end = std::min(whole, i + kBlock);
    float acc[kLanes] = {};
    for (; i < end; i += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        const float v = p[i + l];
        acc[l] += v * v;
        lo[l] = v < lo[l] ? v : lo[l];
        hi[l] = v > hi[l] ? v : hi[l];
      }
    double block = 0;
    for (int l = 0; l < kLanes; ++l) block += acc[l];
    out.sumSquares += block;
  }
  for (int64_t i = whole; i < n; ++i) {
    out.sumSquares += static_cast<double>(p[i]) * p[i];
    lo[0] = p[i] < lo[0] ? p[i] : lo[0];
    hi[0] = p[i] > hi[0] ? p[i] : hi[0];
  }
  for (int l = 0; l < kLanes; ++l) {
    out.min = std::min(out.min, lo[l]);
    out.max = std::max(out.max, hi[l]);
  }
  return out;
}

bool hostPassable(const at::Tensor& v) {
  return v.defined() && v.device().is_cpu() && v.scalar_type() == at::kFloat && v.is_contiguous();
}

// Stats of the tensors `views` (fp32, any shape; empty ones give zeros), each reduced by vectorised kernels: its L2
// norm, its max |g| and, where needed, its NaN and Inf counts (int64, as torch counts them). A NaN or Inf element
// makes the L2 norm non-finite, so on the CPU — where reading a value back costs nothing — the two counting passes run
// only for tensors whose norm is not finite (a finite norm means both counts are exactly 0). On an accelerator the
// counts are always computed: four passes on the device beat a host sync in the middle of the backward pass. Never
// syncs on an accelerator.
GradHealthStats statsOfViews(const std::vector<at::Tensor>& views, const at::TensorOptions& options) {
  const int64_t count = static_cast<int64_t>(views.size());
  if (count == 0)
    return {torch::zeros({0, 2}, options.dtype(at::kFloat)), torch::zeros({0, 2}, options.dtype(at::kLong)), {}};
  std::vector<at::Tensor> l2, lo, hi;
  std::vector<double> sumSquares(views.size(), -1.0);
  l2.reserve(views.size());
  lo.reserve(views.size());
  hi.reserve(views.size());
  const at::Tensor zero = torch::zeros({}, options.dtype(at::kFloat));
  for (size_t p = 0; p < views.size(); ++p) {
    const at::Tensor& v = views[p];
    if (!v.defined() || v.numel() == 0) {
      l2.push_back(zero);
      lo.push_back(zero);
      hi.push_back(zero);
      continue;
    }
    if (hostPassable(v)) {
      const CpuPass r = cpuPass(v.data_ptr<float>(), v.numel());
      sumSquares[p] = r.sumSquares;
      if (std::isfinite(r.sumSquares)) {
        l2.push_back(torch::tensor(static_cast<float>(std::sqrt(r.sumSquares))));
        lo.push_back(torch::tensor(r.min));
        hi.push_back(torch::tensor(r.max));
        continue;
      }
    }
    l2.push_back(at::linalg_vector_norm(v, 2));
    // max |g| = max(|min|, |max|): one vectorised min/max pass (ATen's inf-norm kernel is ~15x slower on the CPU).
    auto [mn, mx] = at::aminmax(v);
    lo.push_back(mn);
    hi.push_back(mx);
  }
  at::Tensor norms = torch::stack(l2);
  at::Tensor maxAbs = at::maximum(torch::stack(lo).abs(), torch::stack(hi).abs());
  const bool onCpu = norms.device().is_cpu();
  const at::Tensor finite = onCpu ? torch::isfinite(norms) : at::Tensor();
  const bool* ok = onCpu ? finite.data_ptr<bool>() : nullptr;
  const at::Tensor none = torch::zeros({}, options.dtype(at::kLong));
  std::vector<at::Tensor> nan, inf;
  nan.reserve(views.size());
  inf.reserve(views.size());
  for (size_t p = 0; p < views.size(); ++p) {
    const at::Tensor& v = views[p];
    const bool skip = (ok != nullptr && ok[p]) || !v.defined() || v.numel() == 0;
    nan.push_back(skip ? none : torch::isnan(v).sum());  // int64
    inf.push_back(skip ? none : torch::isinf(v).sum());
  }
  return {torch::stack({norms, maxAbs}, 1), torch::stack({torch::stack(nan), torch::stack(inf)}, 1),
          std::move(sumSquares)};
}

at::Tensor asFloat(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat ? t : t.to(at::kFloat);
}

}  // namespace

double gradSumSquares(const at::Tensor& g) {
  if (!hostPassable(g)) return -1;
  return g.numel() == 0 ? 0.0 : cpuPass(g.data_ptr<float>(), g.numel()).sumSquares;
}

GradHealthStats gradHealthFlat(const at::Tensor& flat, const at::Tensor& segments, int64_t count) {
  torch::NoGradGuard ng;
  TORCH_CHECK(segments.numel() == count, "gradHealthFlat: ", segments.numel(), " lengths for ", count, " tensors");
  at::Tensor lengthsHost = segments.to(at::kCPU, at::kLong).contiguous();
  const int64_t* len = lengthsHost.data_ptr<int64_t>();
  const std::vector<int64_t> lengths(len, len + count);
  at::Tensor g = asFloat(flat);
  TORCH_CHECK(std::accumulate(lengths.begin(), lengths.end(), int64_t{0}) == g.numel(),
              "gradHealthFlat: lengths do not add up to the buffer's ", g.numel(), " elements");
  GradHealthStats stats = statsOfViews(g.split_with_sizes(lengths), g.options());
  stats.sumSquares.clear();  // a staging buffer's, not the gradients' the clip reads
  return stats;
}

GradHealthStats gradHealth(const std::vector<at::Tensor>& grads) {
  torch::NoGradGuard ng;
  std::vector<at::Tensor> views;
  views.reserve(grads.size());
  at::TensorOptions options = torch::TensorOptions();
  for (const auto& g : grads) {
    views.push_back(g.defined() ? asFloat(g) : at::Tensor());
    if (g.defined()) options = g.options();
  }
  return statsOfViews(views, options);
}

std::vector<probes::GradStat> gradStatsOnHost(const std::vector<std::string>& names, const std::vector<int>& layers,
                                              const std::vector<int64_t>& numels, const GradHealthStats& stats) {
  TORCH_CHECK(stats.values.size(0) == static_cast<int64_t>(names.size()), "gradStatsOnHost: ", stats.values.size(0),
              " rows for ", names.size(), " parameters");
  // The one host sync of the step (the second copy waits for nothing more).
  at::Tensor values = stats.values.detach().to(at::kCPU, at::kDouble).contiguous();
  at::Tensor counts = stats.counts.detach().to(at::kCPU, at::kLong).contiguous();
  auto a = values.accessor<double, 2>();
  auto n = counts.accessor<int64_t, 2>();
  std::vector<probes::GradStat> out(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    out[i].param = names[i];
    out[i].layer = layers[i];
    out[i].l2Norm = a[i][kL2Norm];
    out[i].maxAbs = a[i][kMaxAbs];
    out[i].nanCount = n[i][kNanCount];
    out[i].infCount = n[i][kInfCount];
    out[i].numel = numels[i];
  }
  return out;
}

}  // namespace tpscope::core
