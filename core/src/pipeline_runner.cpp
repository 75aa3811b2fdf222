#include "pipeline_runner.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <deque>
#include <map>
#include <mutex>
#include <string>

#include "tpscope/core/faults.h"

namespace tpscope::core {

namespace probes = ::tpscope::probes;

namespace {

// The span sites "forward mb K" / "backward mb K" [" chunk C"]: built once per (direction, micro-batch, chunk) and
// never freed (the recorder keys span names by Site pointer and may flush after the trainer is gone).
const probes::Site* passSite(bool forward, int mb, int chunk, bool withChunk) {
  static std::mutex mu;
  static auto* names = new std::deque<std::string>();
  static auto* sites = new std::deque<probes::Site>();
  static auto* index = new std::map<std::tuple<bool, int, int>, const probes::Site*>();
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(forward, mb, withChunk ? chunk : -1);
  if (auto it = index->find(key); it != index->end()) return it->second;
  names->push_back(withChunk ? fmt::format("{} mb {} chunk {}", forward ? "forward" : "backward", mb, chunk)
                             : fmt::format("{} mb {}", forward ? "forward" : "backward", mb));
  sites->push_back({names->back().c_str(), "pipeline", __FILE__, __LINE__, probes::SpanKind::Compute,
                    forward ? probes::Phase::Forward : probes::Phase::Backward});
  (*index)[key] = &sites->back();
  return &sites->back();
}

#if TPSCOPE_PROBES_ENABLED
using PassSpan = probes::SpanScope;
#else
struct PassSpan {
  PassSpan(const probes::Site*, int) noexcept {}
};
#endif

}  // namespace

PipelineRunner::PipelineRunner(const rules::TrainConfig& cfg, Mesh& mesh, std::vector<Gpt> chunks, c10::Device device)
    : cfg_(cfg), mesh_(mesh), chunks_(std::move(chunks)), device_(device),
      kind_(rules::parsePipelineSchedule(cfg.schedule)) {
  const int v = kind_ == rules::PipelineSchedule::Interleaved ? static_cast<int>(cfg.virtual_stages) : 1;
  const auto all = rules::buildPipelineSchedule(kind_, mesh.pp(), static_cast<int>(cfg.grad_accum), v);
  for (int s = 0; s < mesh.pp(); ++s)
    for (const rules::PipelineOp& op : all[static_cast<size_t>(s)])
      if (op.sendTo >= 0) ++perStep_[{s, op.sendTo}];
  ops_ = all[static_cast<size_t>(mesh.ppRank())];
  for (const rules::PipelineOp& op : ops_) forwardPasses_ += op.forward ? 1 : 0;
  const bool withChunk = v > 1;
  for (const rules::PipelineOp& op : ops_) passSite(op.forward, op.microbatch, op.chunk, withChunk);  // built up front
  const int m = static_cast<int>(cfg.grad_accum);
  siteNames_.reserve(2 * static_cast<size_t>(m));  // no reallocation: the callsites point into these strings
  for (int mb = 0; mb < m; ++mb) siteNames_.push_back(fmt::format("pipeline activation of micro-batch {}", mb));
  for (int mb = 0; mb < m; ++mb)
    siteNames_.push_back(fmt::format("pipeline activation gradient of micro-batch {}", mb));
  for (int mb = 0; mb < m; ++mb) {
    actSites_.push_back({siteNames_[static_cast<size_t>(mb)].c_str(), -1});
    gradSites_.push_back({siteNames_[static_cast<size_t>(m + mb)].c_str(), -1});
  }
}

at::Tensor PipelineRunner::run(int64_t step, const BatchSampler& sampler, double lossScale, const ForwardFn& forward,
                               const std::function<void(int)>& beforeForward,
                               const std::function<void()>& beforeLastBackward) {
  const rules::TrainConfig& c = cfg_;
  Communicator& pg = mesh_.ppGroup();
  const bool withChunk = chunks_.size() > 1;
  const int64_t seq = c.sequence_parallel && mesh_.tp() > 1 ? c.seq_len / mesh_.tp() : c.seq_len;
  const auto f32 = torch::TensorOptions().dtype(at::kFloat).device(device_);
  at::Tensor lossSum = torch::zeros({1}, f32);
  struct Saved {
    at::Tensor input, output;  // input: the received activation (a leaf); output: the activation or the loss
  };
  std::map<std::pair<int, int>, Saved> saved;
  std::vector<PendingCollective> sends;
  const int me = mesh_.ppRank();
  auto sendSeq = [&](const rules::PipelineOp& op) { return stepsRun_ * perStep_.at({me, op.sendTo}) + op.sendSeq; };
  auto recvSeq = [&](const rules::PipelineOp& op) { return stepsRun_ * perStep_.at({op.recvFrom, me}) + op.recvSeq; };
  int backwardsLeft = 0;
  for (const rules::PipelineOp& op : ops_) backwardsLeft += op.forward ? 0 : 1;
  for (const rules::PipelineOp& op : ops_) {
    Gpt& model = chunks_[static_cast<size_t>(op.chunk)];
    // The pass's micro-batch, from its receive on: capture's --inject ...,mb=K fires in it only.
    if (FaultInjector* f = activeFaults()) f->setMicrobatch(op.microbatch);
    const bool pre = model->options.pre_process(), post = model->options.post_process();
    if (op.forward) {
      beforeForward(op.microbatch);
      at::Tensor input, ids, targets;
      if (op.recvFrom >= 0) {
        input = torch::empty({c.micro_batch_size, seq, c.hidden}, f32);
        pg.recv(input, op.recvFrom, recvSeq(op), actSites_.at(static_cast<size_t>(op.microbatch)),
                probes::Phase::Forward);
        input.requires_grad_(true);
      }
      if (pre || post) {
        ids = torch::empty({c.micro_batch_size, c.seq_len}, torch::kLong);
        targets = torch::empty({c.micro_batch_size, c.seq_len}, torch::kLong);
        TPS_SPAN("data loading", Data, Data);
        sampler.fill(step, op.microbatch, c.grad_accum, mesh_.dataDpRank(), mesh_.dataDp(), ids.data_ptr<int64_t>(),
                     targets.data_ptr<int64_t>());
      }
      at::Tensor out;
      {
        PassSpan span(passSite(true, op.microbatch, op.chunk, withChunk), -1);
        out = forward(model, input, ids, targets);
        if (FaultInjector* f = activeFaults()) f->slowPass(forwardPasses_);  // capture: --inject slow on a stage
      }
      if (post) lossSum += out.detach().to(at::kFloat);
      if (op.sendTo >= 0) {
        at::Tensor wire = out.detach().to(at::kFloat).contiguous();
        sends.push_back(pg.send(wire, op.sendTo, sendSeq(op), actSites_.at(static_cast<size_t>(op.microbatch)),
                                probes::Phase::Forward));
      }
      saved[{op.microbatch, op.chunk}] = {input, out};
      continue;
    }
    auto node = saved.extract({op.microbatch, op.chunk});
    TORCH_CHECK(!node.empty(), "pipeline schedule: backward of micro-batch ", op.microbatch, " chunk ", op.chunk,
                " before its forward");
    Saved& sv = node.mapped();
    at::Tensor grad;
    if (!post) {
      grad = torch::empty({c.micro_batch_size, seq, c.hidden}, f32);
      pg.recv(grad, op.recvFrom, recvSeq(op), gradSites_.at(static_cast<size_t>(op.microbatch)),
              probes::Phase::Backward);
    }
    if (--backwardsLeft == 0) beforeLastBackward();
    {
      PassSpan span(passSite(false, op.microbatch, op.chunk, withChunk), -1);
      if (post)
        (sv.output * (lossScale / static_cast<double>(c.grad_accum))).backward();
      else
        torch::autograd::backward({sv.output}, {grad.to(sv.output.scalar_type())});
    }
    if (op.sendTo >= 0) {
      at::Tensor wire = sv.input.grad().to(at::kFloat).contiguous();
      sends.push_back(pg.send(wire, op.sendTo, sendSeq(op), gradSites_.at(static_cast<size_t>(op.microbatch)),
                              probes::Phase::Backward));
    }
  }
  for (auto& s : sends) s.wait();
  if (FaultInjector* f = activeFaults()) f->setMicrobatch(-1);
  ++stepsRun_;
  return lossSum;
}

}  // namespace tpscope::core
