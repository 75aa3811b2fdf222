#include "tpscope/core/grad_reducer.h"

#include <torch/torch.h>

#include "tpscope/core/grad_health.h"

namespace tpscope::core {

namespace probes = ::tpscope::probes;

namespace {
const char* kBucketNames[] = {"DP gradient bucket 0", "DP gradient bucket 1", "DP gradient bucket 2",
                              "DP gradient bucket 3", "DP gradient bucket 4", "DP gradient bucket 5",
                              "DP gradient bucket 6", "DP gradient bucket 7", "DP gradient bucket 8+"};
}

struct GradReducer::Impl {
  struct Bucket {
    std::vector<size_t> params;    // indices into Impl::params
    std::vector<int64_t> offsets;  // into buffer
    at::Tensor buffer;             // fp32 flat
    at::Tensor segments;           // for gradient health (lazy)
    size_t ready = 0;
    bool launched = false;
    bool late = false;
    PendingCollective pending;
    GradHealthStats health;
  };
  std::vector<at::Tensor> params;
  std::vector<bool> late;
  std::vector<int> bucketOf, slotOf;
  std::vector<bool> seen;
  std::vector<Bucket> buckets;
  Communicator* dp;
  bool overlap;
  bool armed = false;
  bool capture = false;
  std::vector<size_t> launchOrder;

  at::Tensor slot(size_t p) {
    Bucket& b = buckets[bucketOf[p]];
    return b.buffer.narrow(0, b.offsets[slotOf[p]], params[p].numel()).view(params[p].sizes());
  }

  void stage(size_t p, const at::Tensor* incoming) {
    at::Tensor s = slot(p);
    const at::Tensor& acc = params[p].grad();
    if (incoming != nullptr) {
      s.copy_(*incoming);
      if (acc.defined()) s.add_(acc);
    } else if (acc.defined()) {
      s.copy_(acc);
    } else {
      s.zero_();
    }
  }

  void launch(size_t bi) {
    Bucket& b = buckets[bi];
    if (capture) {
      if (!b.segments.defined()) {
        std::vector<int64_t> n;
        for (size_t p : b.params) n.push_back(params[p].numel());
        b.segments = gradHealthSegments(n);
      }
      b.health = gradHealthFlat(b.buffer, b.segments, static_cast<int64_t>(b.params.size()));
    }
    b.launched = true;
    launchOrder.push_back(bi);
    if (dp->size() > 1) {
      Callsite site{kBucketNames[std::min<size_t>(bi, 8)], -1};
      b.pending = dp->allReduceAsync(b.buffer, site, probes::Phase::Backward);
    }
  }

  void onGrad(size_t p, const at::Tensor& g) {
    if (!armed || late[p] || seen[p]) return;
    torch::NoGradGuard ng;
    stage(p, &g);
    seen[p] = true;
    Bucket& b = buckets[bucketOf[p]];
    if (++b.ready == b.params.size()) launch(static_cast<size_t>(bucketOf[p]));
  }
};

GradReducer::GradReducer(std::vector<at::Tensor> params, std::vector<bool> late, Communicator& dp,
                         double bucketBytes, bool overlap)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.params = std::move(params);
  m.late = std::move(late);
  m.late.resize(m.params.size(), false);
  m.dp = &dp;
  m.overlap = overlap && dp.size() > 1;
  m.bucketOf.assign(m.params.size(), -1);
  m.slotOf.assign(m.params.size(), -1);
  m.seen.assign(m.params.size(), false);
  auto add = [&](Impl::Bucket& b, size_t p) {
    int64_t off = b.offsets.empty() ? 0 : b.offsets.back() + m.params[b.params.back()].numel();
    m.slotOf[p] = static_cast<int>(b.params.size());
    b.params.push_back(p);
    b.offsets.push_back(off);
  };
  // Late parameters form the last bucket; the others are packed in reverse order.
  Impl::Bucket current;
  int64_t bytes = 0;
  for (size_t k = m.params.size(); k-- > 0;) {
    if (m.late[k]) continue;
    add(current, k);
    bytes += m.params[k].numel() * 4;
    if (static_cast<double>(bytes) >= bucketBytes) {
      m.buckets.push_back(std::move(current));
      current = Impl::Bucket{};
      bytes = 0;
    }
  }
  if (!current.params.empty()) m.buckets.push_back(std::move(current));
  Impl::Bucket lateBucket;
  lateBucket.late = true;
  for (size_t k = 0; k < m.params.size(); ++k)
    if (m.late[k]) add(lateBucket, k);
  if (!lateBucket.params.empty()) m.buckets.push_back(std::move(lateBucket));
  for (size_t bi = 0; bi < m.buckets.size(); ++bi) {
    auto& b = m.buckets[bi];
    int64_t total = 0;
    for (size_t p : b.params) {
      m.bucketOf[p] = static_cast<int>(bi);
      total += m.params[p].numel();
    }
    b.buffer = torch::zeros({total}, m.params[b.params.front()].options().dtype(at::kFloat));
  }
  if (m.overlap) {
    for (size_t p = 0; p < m.params.size(); ++p) {
      if (m.late[p]) continue;
      Impl* raw = impl_.get();
      m.params[p].register_hook([raw, p](const at::Tensor& g) { raw->onGrad(p, g); });
    }
  }
}

GradReducer::~GradReducer() = default;

size_t GradReducer::bucketCount() const noexcept { return impl_->buckets.size(); }

void GradReducer::beginLastMicrobatch(bool captureHealth) {
  Impl& m = *impl_;
  m.armed = m.overlap;
  m.capture = captureHealth;
  std::fill(m.seen.begin(), m.seen.end(), false);
  m.launchOrder.clear();
  for (auto& b : m.buckets) {
    b.ready = 0;
    b.launched = false;
    b.health = GradHealthStats();
  }
}

GradHealthStats GradReducer::finish() {
  Impl& m = *impl_;
  torch::NoGradGuard ng;
  m.armed = false;
  const bool reduce = m.dp->size() > 1;
  if (!reduce) {
    if (!m.capture) return GradHealthStats();
    // DP = 1: nothing to reduce; the health stats are read straight from the gradients (no staging copy).
    std::vector<at::Tensor> grads;
    grads.reserve(m.params.size());
    for (const auto& p : m.params) grads.push_back(p.grad());
    return gradHealth(grads);
  }
  {
    TPS_SPAN("dp gradient reduction", Comm, Backward);
    for (size_t bi = 0; bi < m.buckets.size(); ++bi) {  // what the backward hooks did not launch
      auto& b = m.buckets[bi];
      if (b.launched) continue;
      for (size_t p : b.params)
        if (!m.seen[p]) m.stage(p, nullptr);
      m.launch(bi);
    }
    for (size_t bi : m.launchOrder) {
      auto& b = m.buckets[bi];
      if (b.pending.valid()) b.pending.wait();
      b.buffer.div_(static_cast<double>(m.dp->size()));
      for (size_t p : b.params) {
        at::Tensor s = m.slot(p);
        if (m.params[p].grad().defined())
          m.params[p].mutable_grad().copy_(s);
        else
          m.params[p].mutable_grad() = s.clone();
      }
    }
  }
  if (!m.capture) return GradHealthStats();
  // On the gradients' device (an accelerator's stats stay there until the one host sync of the step).
  const int64_t count = static_cast<int64_t>(m.params.size());
  const GradHealthStats& first = m.buckets.front().health;
  GradHealthStats out;  // sumSquares stays empty: the buckets' stats are the pre-reduction copies'
  out.values = torch::zeros({count, 2}, first.values.options());
  out.counts = torch::zeros({count, 2}, first.counts.options());
  for (auto& b : m.buckets) {
    at::Tensor idx = torch::tensor(std::vector<int64_t>(b.params.begin(), b.params.end()),
                                   torch::TensorOptions(torch::kLong).device(out.values.device()));
    out.values.index_copy_(0, idx, b.health.values);
    out.counts.index_copy_(0, idx, b.health.counts);
  }
  return out;
}

}  // namespace tpscope::core
