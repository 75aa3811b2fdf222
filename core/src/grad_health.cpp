#include "tpscope/core/grad_health.h"

#include <torch/torch.h>

namespace tpscope::core {

at::Tensor gradHealthSegments(const std::vector<int64_t>& numels) {
  at::Tensor counts = torch::tensor(numels, torch::kLong);
  return torch::repeat_interleave(torch::arange(static_cast<int64_t>(numels.size()), torch::kLong), counts);
}

at::Tensor gradHealthFlat(const at::Tensor& flat, const at::Tensor& segments, int64_t count) {
  torch::NoGradGuard ng;
  at::Tensor g = flat.to(at::kFloat);
  auto z = [&] { return torch::zeros({count}, g.options()); };
  at::Tensor l2 = z().index_add_(0, segments, g * g).sqrt_();
  at::Tensor mx = z().scatter_reduce_(0, segments, g.abs(), "amax", /*include_self=*/true);
  at::Tensor nan = z().index_add_(0, segments, torch::isnan(g).to(at::kFloat));
  at::Tensor inf = z().index_add_(0, segments, torch::isinf(g).to(at::kFloat));
  return torch::stack({l2, mx, nan, inf}, 1);
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
