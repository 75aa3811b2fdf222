#include "tpscope/core/grad_health.h"

#include <torch/torch.h>

#include <limits>
#include <numeric>

namespace tpscope::core {

at::Tensor gradHealthSegments(const std::vector<int64_t>& numels) { return torch::tensor(numels, torch::kLong); }

// Per-parameter views of the flat buffer, each reduced by vectorised kernels: norm, inf-norm (max |g|), and the
// NaN/Inf counts. A few fast passes over the buffer; the earlier scatter over a per-element index (index_add_ and
// scatter_reduce_ with a buffer-long int64 index) cost ~20% of a CPU step. No host sync: everything stays a tensor.
at::Tensor gradHealthFlat(const at::Tensor& flat, const at::Tensor& segments, int64_t count) {
  torch::NoGradGuard ng;
  TORCH_CHECK(segments.numel() == count, "gradHealthFlat: ", segments.numel(), " lengths for ", count, " tensors");
  at::Tensor lengthsHost = segments.to(at::kCPU, at::kLong).contiguous();
  const int64_t* len = lengthsHost.data_ptr<int64_t>();
  const std::vector<int64_t> lengths(len, len + count);
  at::Tensor g = flat.scalar_type() == at::kFloat ? flat : flat.to(at::kFloat);
  TORCH_CHECK(std::accumulate(lengths.begin(), lengths.end(), int64_t{0}) == g.numel(),
              "gradHealthFlat: lengths do not add up to the buffer's ", g.numel(), " elements");
  std::vector<at::Tensor> l2, mx, nan, inf;
  l2.reserve(lengths.size());
  mx.reserve(lengths.size());
  nan.reserve(lengths.size());
  inf.reserve(lengths.size());
  const at::Tensor zero = torch::zeros({}, g.options());
  for (const at::Tensor& v : g.split_with_sizes(lengths)) {
    if (v.numel() == 0) {
      l2.push_back(zero);
      mx.push_back(zero);
      nan.push_back(zero);
      inf.push_back(zero);
      continue;
    }
    l2.push_back(at::linalg_vector_norm(v, 2));
    mx.push_back(at::linalg_vector_norm(v, std::numeric_limits<double>::infinity()));
    nan.push_back(torch::isnan(v).sum().to(at::kFloat));
    inf.push_back(torch::isinf(v).sum().to(at::kFloat));
  }
  return torch::stack({torch::stack(l2), torch::stack(mx), torch::stack(nan), torch::stack(inf)}, 1);
}

at::Tensor gradHealth(const std::vector<at::Tensor>& grads) {
  torch::NoGradGuard ng;
  std::vector<at::Tensor> flat;
  std::vector<int64_t> numels;
  for (const auto& g : grads) {
    if (g.defined()) {
      flat.push_back(g.reshape({-1}).to(at::kFloat));
      numels.push_back(g.numel());
    } else {
      numels.push_back(0);
    }
  }
  at::Tensor buf = flat.empty() ? torch::zeros({0}) : torch::cat(flat);
  return gradHealthFlat(buf, gradHealthSegments(numels), static_cast<int64_t>(grads.size()));
}

void reportGradHealth(probes::Sink& sink, int step, const std::vector<std::string>& names,
                      const std::vector<int>& layers, const std::vector<int64_t>& numels, const at::Tensor& stats) {
  at::Tensor host = stats.to(at::kCPU, at::kDouble).contiguous();  // the one host sync of the step
  auto a = host.accessor<double, 2>();
  std::vector<probes::GradStat> out(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    out[i].param = names[i];
    out[i].layer = layers[i];
    out[i].l2Norm = a[i][kL2Norm];
    out[i].maxAbs = a[i][kMaxAbs];
    out[i].nanCount = static_cast<int64_t>(a[i][kNanCount]);
    out[i].infCount = static_cast<int64_t>(a[i][kInfCount]);
    out[i].numel = numels[i];
  }
  sink.gradStats(step, out);
}

}  // namespace tpscope::core
