// minimal_trainer: a data-parallel MLP regression in plain LibTorch + c10d Gloo, instrumented with tpscope's probes.
// It shows the four things a program does to be captured (`tpscope capture --nproc 2 -- ./minimal_trainer`):
//   1. start the recorder from the launcher's environment (probes::startFromEnvironment; it does nothing when
//      TPSCOPE_OUT is unset, so the program runs the same without capture);
//   2. mark steps and phases with TPS_STEP / TPS_SPAN (compiled out with TPSCOPE_PROBES_ENABLED=0);
//   3. record each collective through the sink: enqueued → started → completed, with a per-group sequence number;
//   4. report per-step stats (loss, tokens) and, optionally, per-parameter gradient health.
// Environment: torchrun's MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (a single process without them).
// Usage: minimal_trainer [--steps N] [--hidden H]
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tpscope/probes/probes.h"
#include "tpscope/probes/runtime.h"

namespace probes = tpscope::probes;

namespace {

int envInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

// All-reduce (sum) over the data-parallel group, recorded as one collective of group "world".
class RecordedAllReduce {
 public:
  RecordedAllReduce(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, int rank, int world)
      : pg_(std::move(pg)) {
    for (int r = 0; r < world; ++r) ranks_.push_back(r);
    (void)rank;
  }

  void operator()(at::Tensor& t, const char* callsite) {
    if (!pg_) return;
    ++seq_;
    uint64_t handle = 0;
    probes::Sink* sink = probes::sink();
    std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
    if (sink != nullptr) {
      probes::CollectiveDesc d;
      d.group = "world";
      d.groupRanks = ranks_;
      d.seq = seq_;
      d.op = "all_reduce";
      d.dtype = "float32";
      d.shape = shape;
      d.numel = t.numel();
      d.bytes = t.numel() * static_cast<int64_t>(t.element_size());
      d.callsite = callsite;
      d.phase = probes::Phase::Backward;
      handle = sink->collectiveEnqueued(d, probes::rawTicks());
      sink->collectiveState(handle, probes::CollectiveState::Started, probes::rawTicks());
    }
    std::vector<at::Tensor> v{t};
    {
      TPS_SPAN("gradient all-reduce", Comm, Backward);
      pg_->allreduce(v)->wait();
    }
    if (sink != nullptr) sink->collectiveState(handle, probes::CollectiveState::Completed, probes::rawTicks());
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  std::vector<int> ranks_;
  uint64_t seq_ = 0;
};

}  // namespace

// One function on purpose (~100 lines): the sample shows a training loop instrumented with the probes in the order
// a reader meets it, from setup to the last step.
int main(int argc, char** argv) {
  int steps = 20, hidden = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--steps") steps = std::atoi(argv[i + 1]);
    else if (a == "--hidden") hidden = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: minimal_trainer [--steps N] [--hidden H]\n");
      return 2;
    }
  }
  if (steps < 1 || hidden < 1) {
    std::fprintf(stderr, "minimal_trainer: --steps and --hidden must be >= 1\n");
    return 2;
  }
  const int rank = envInt("RANK", 0), world = envInt("WORLD_SIZE", 1);
  at::set_num_threads(1);

  // 1. The recorder: DIR/rank-<RANK>.db when TPSCOPE_OUT is set (tpscope capture sets it), else nothing.
  if (auto s = probes::startFromEnvironment(); !s) std::fprintf(stderr, "minimal_trainer: %s\n", s.message().c_str());

  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  if (world > 1) {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(envInt("MASTER_PORT", 29500));
    so.isServer = rank == 0;
    so.numWorkers = world;
    const char* host = std::getenv("MASTER_ADDR");
    auto store = c10::make_intrusive<c10d::TCPStore>(host != nullptr ? host : "127.0.0.1", so);
    auto opts = c10d::ProcessGroupGloo::Options::create();
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, opts);
  }
  RecordedAllReduce allReduce(pg, rank, world);

  torch::manual_seed(1234);  // same initial weights on every rank
  torch::nn::Sequential model(torch::nn::Linear(16, hidden), torch::nn::ReLU(), torch::nn::Linear(hidden, 1));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05));
  torch::manual_seed(99 + rank);  // each rank its own data shard
  const at::Tensor target = torch::randn({16, 1});
  constexpr int kBatch = 32;
  std::vector<std::string> names;
  for (const auto& p : model->named_parameters()) names.push_back(p.key());

  for (int step = 1; step <= steps; ++step) {
    // 2. Steps and phases.
    TPS_STEP(step);
    const uint64_t t0 = probes::rawTicks();
    at::Tensor loss;
    {
      TPS_SPAN("train step", Step, None);
      at::Tensor x, y;
      {
        TPS_SPAN("data loading", Data, Data);
        x = torch::randn({kBatch, 16});
        y = x.matmul(target) + 0.01 * torch::randn({kBatch, 1});
      }
      opt.zero_grad();
      {
        TPS_SPAN("forward", Compute, Forward);
        loss = torch::mse_loss(model->forward(x), y);
      }
      {
        TPS_SPAN("backward", Compute, Backward);
        loss.backward();
      }
      // 3. The DP gradient all-reduce, recorded per collective.
      std::vector<probes::GradStat> health;
      size_t i = 0;
      for (auto& p : model->parameters()) {
        at::Tensor g = p.mutable_grad();
        // 4a. Gradient health before the reduction (where a bad value starts).
        probes::GradStat st;
        st.param = names[i++];
        st.l2Norm = g.norm().item<double>();
        st.maxAbs = g.abs().max().item<double>();
        st.nanCount = g.isnan().sum().item<int64_t>();
        st.infCount = g.isinf().sum().item<int64_t>();
        st.numel = g.numel();
        health.push_back(st);
        allReduce(g, "gradient all-reduce");
        g.div_(world);
      }
      if (probes::Sink* s = probes::sink()) s->gradStats(step, health);
      {
        TPS_SPAN("optimizer step", Optimizer, Optimizer);
        opt.step();
      }
    }
    // 4b. Step stats.
    if (probes::Sink* s = probes::sink()) {
      probes::StepStat st;
      st.step = step;
      st.loss = loss.item<double>();
      st.lr = 0.05;
      st.tokens = kBatch;
      st.t0 = t0;
      st.t1 = probes::rawTicks();
      s->stepStat(st);
    }
    if (rank == 0) std::printf("step %d/%d loss %.5f\n", step, steps, loss.item<double>());
  }
  probes::stop("ok");
  return 0;
}
