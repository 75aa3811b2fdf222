#include "tpscope/core/activation_health.h"

#include <torch/torch.h>

#include "tpscope/probes/probes.h"

namespace tpscope::core {

namespace {
thread_local ActivationWatch* t_watch = nullptr;
}  // namespace

ActivationWatch* activeActivationWatch() {
  return t_watch;
}
ActivationWatchScope::ActivationWatchScope(ActivationWatch* watch) : previous_(t_watch) {
  t_watch = watch;
}
ActivationWatchScope::~ActivationWatchScope() {
  t_watch = previous_;
}

void ActivationWatch::beginStep() {
  notes_.clear();
  microBatch_ = 0;
}

void ActivationWatch::note(const at::Tensor& output, int layer, const std::string* where) {
  torch::NoGradGuard ng;
  // fp32 accumulation whatever the autocast dtype: a bf16 sum would overflow long before the values are unhealthy.
  notes_.push_back({output.detach().sum(at::kFloat), layer, where, microBatch_, probes::rawTicks()});
}

std::optional<rules::ActivationFault> ActivationWatch::firstNonFinite() {
  if (notes_.empty()) return std::nullopt;
  torch::NoGradGuard ng;
  std::vector<at::Tensor> sums;
  sums.reserve(notes_.size());
  for (const Note& n : notes_) sums.push_back(n.sum);
  const at::Tensor host = torch::stack(sums).to(at::kCPU, at::kDouble).contiguous();  // the one host sync
  const double* v = host.data_ptr<double>();
  for (size_t i = 0; i < notes_.size(); ++i) {
    if (std::isfinite(v[i])) continue;
    const Note& n = notes_[i];
    return rules::ActivationFault{n.layer, *n.where, n.microBatch, n.ticks, v[i]};
  }
  return std::nullopt;
}

}  // namespace tpscope::core
