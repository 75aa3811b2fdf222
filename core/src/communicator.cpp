#include "tpscope/core/communicator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <string>
#include <string_view>

#include "backend.h"
#include "tpscope/core/faults.h"
#include "tpscope/core/op_check.h"
#include "tpscope/vocabulary/collective_ops.h"

namespace tpscope::core {

namespace probes = ::tpscope::probes;
using vocabulary::CollectiveOp;

const char* callsitePhaseWord(probes::Phase phase) noexcept {
  switch (phase) {
    case probes::Phase::Forward: return "forward";
    case probes::Phase::Backward: return "backward";
    case probes::Phase::Optimizer: return "optimizer";
    case probes::Phase::Data: return "data";
    case probes::Phase::Checkpoint: return "checkpoint";
    case probes::Phase::Other: return "other";
    case probes::Phase::None: break;
  }
  return "none";
}

namespace {

// The op as a callsite description names it: "all-reduce", ...; else the catalogue's name ("broadcast", "send").
std::string_view opDisplay(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::AllReduce: return "all-reduce";
    case CollectiveOp::AllGather: return "all-gather";
    case CollectiveOp::ReduceScatter: return "reduce-scatter";
    default: return vocabulary::opName(op);
  }
}

}  // namespace

std::string describeCallsite(const Callsite& site, probes::Phase phase, CollectiveOp collective) {
  const std::string_view op = opDisplay(collective);
  if (site.layer >= 0)
    return fmt::format("layer {} {} {} {}", site.layer, site.what, callsitePhaseWord(phase), op);
  return fmt::format("{} {} {}", site.what, callsitePhaseWord(phase), op);
}

namespace {

const char* dtypeName(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    default: return "other";
  }
}

bool looksLikeTimeout(const std::exception& e) {
  std::string m = e.what();
  for (auto& c : m) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return m.find("timed out") != std::string::npos || m.find("timeout") != std::string::npos;
}

// Gloo carries no bf16 (and we keep fp16 reductions in fp32 too): the wire tensor is fp32.
bool needsFp32(const at::Tensor& t, bool gloo) {
  return gloo && (t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf);
}

// What goes on the wire for `t`: Gloo gets an fp32 copy of a bf16/fp16 tensor; NCCL gets a copy on the group's GPU
// of a host tensor (the few scalars the trainer reduces on the host: health flags, the replica check). Else `t`
// itself. A copy is written back into `t` (or converted back) after the collective.
at::Tensor wireOf(const at::Tensor& t, const Communicator::Backend& be, bool copyAlways = false) {
  if (needsFp32(t, be.gloo)) return t.to(at::kFloat);
  if (!be.gloo && t.device() != be.device) return t.to(be.device);
  return copyAlways ? t.clone() : t;
}

// A span of kind comm on the calling thread for the time it is blocked in a collective (the whole of a blocking one,
// the wait of an async one). The breakdown counts it as exposed communication even inside a compute span such as
// "attention forward", where a TP all-reduce sits on the critical path; the collective record alone (no thread)
// could as well overlap other work. The span is named after the op ("all_reduce"), or "<op> wait" for the wait of an
// async one ("send wait", "all_reduce wait"). One static Site per (op, wait or not, phase): the recorder keys names
// by Site.
const probes::Site* commSite(CollectiveOp op, bool wait, probes::Phase phase) {
  constexpr size_t kOps = vocabulary::kCollectiveOpCount, kPhases = 7;
  static const auto kNames = [] {
    std::array<std::array<std::string, kOps>, 2> n;
    for (size_t o = 0; o < kOps; ++o) {
      n[0][o] = vocabulary::opName(static_cast<CollectiveOp>(o));
      n[1][o] = n[0][o] + " wait";
    }
    return n;
  }();
  static const auto kSites = [] {
    std::array<std::array<std::array<probes::Site, kPhases>, kOps>, 2> t{};
    for (size_t w = 0; w < 2; ++w)
      for (size_t o = 0; o < kOps; ++o)
        for (size_t p = 0; p < kPhases; ++p)
          t[w][o][p] = {kNames[w][o].c_str(), "comm", __FILE__, __LINE__, probes::SpanKind::Comm,
                        static_cast<probes::Phase>(p)};
    return t;
  }();
  const size_t o = std::min(static_cast<size_t>(op), kOps - 1);
  return &kSites[wait ? 1 : 0][o][std::min<size_t>(static_cast<size_t>(phase), kPhases - 1)];
}

#if TPSCOPE_PROBES_ENABLED
using CommSpan = probes::SpanScope;
#else
struct CommSpan {
  CommSpan(const probes::Site*, int) noexcept {}
};
#endif

// The collective's result in the caller's dtype and device.
at::Tensor likeInput(const at::Tensor& out, const at::Tensor& in) {
  if (out.scalar_type() == in.scalar_type() && out.device() == in.device()) return out;
  return out.to(in.device(), in.scalar_type());
}

}  // namespace

struct Communicator::Issue {
  uint64_t seq = 0;
  std::string group;  // p2p: "p2p-<src>-<dst>" (else the communicator's name)
  uint64_t handle = 0;
  probes::Sink* sink = nullptr;
  CollectiveOp op = CollectiveOp::Unknown;
  Callsite site;
  probes::Phase phase = probes::Phase::None;
};

void Communicator::checkResult(const Issue& is, const at::Tensor& result) const {
  OpCheck* oc = activeOpCheck();
  if (oc == nullptr || !oc->armed()) return;
  oc->collectiveResult(fmt::format("{} {} seq {} ({})", is.group.empty() ? name_ : is.group, vocabulary::opName(is.op),
                                   is.seq, describeCallsite(is.site, is.phase, is.op)),
                       result);
}

struct PendingCollective::State {
  Communicator* comm = nullptr;
  Communicator::Issue issue;
  c10::intrusive_ptr<compat::Work> work;
  at::Tensor user;  // caller's tensor
  at::Tensor wire;  // what was sent (fp32 copy or the user tensor itself)
  bool sendOnly = false;  // a point-to-point send: nothing to copy back
};

Communicator::Communicator(std::string name, std::vector<int> globalRanks, int rank, std::shared_ptr<Backend> backend,
                           std::chrono::milliseconds timeout)
    : name_(std::move(name)), ranks_(std::move(globalRanks)), rank_(rank), backend_(std::move(backend)),
      timeout_(timeout) {
  TORCH_CHECK(rank_ >= 0 && rank_ < size(), "communicator ", name_, ": rank ", rank_, " outside size ", size());
  TORCH_CHECK(size() == 1 || backend_, "communicator ", name_, " of size ", size(), " needs a backend");
}

Communicator::~Communicator() = default;

std::unique_ptr<Communicator> Communicator::solo(std::string name, int globalRank) {
  return std::make_unique<Communicator>(std::move(name), std::vector<int>{globalRank}, 0, nullptr,
                                        std::chrono::milliseconds(0));
}

std::string Communicator::p2pGroupName(int srcGlobal, int dstGlobal) {
  return fmt::format("p2p-{}-{}", srcGlobal, dstGlobal);
}

std::string Communicator::emulatedOps() {
  return fmt::format("{}={}", vocabulary::opName(CollectiveOp::ReduceScatter),
                     vocabulary::opName(CollectiveOp::AllReduce));
}

Communicator::Issue Communicator::begin(CollectiveOp op, const at::Tensor* t, const Callsite& site,
                                        probes::Phase phase, const P2p* p2p) {
  if (dead_) {
    throw CollectiveError(fmt::format("group {} is unusable after an earlier collective error; refusing {} seq {}",
                                      name_, vocabulary::opName(op), seq_ + 1),
                          false);
  }
  if (FaultInjector* f = activeFaults()) f->beforeCollective(*this, op, phase);  // capture: --inject delay/hang
  Issue is;
  if (p2p != nullptr) {
    is.seq = p2p->seq;  // per directed pair, kept by the caller; the group's own count is untouched
    is.group = p2pGroupName(p2p->src, p2p->dst);
  } else {
    is.seq = ++seq_;
  }
  is.op = op;
  is.site = site;
  is.phase = phase;
  is.sink = probes::sink();
  if (is.sink != nullptr) {
    std::vector<int64_t> shape;
    probes::CollectiveDesc d;
    const std::vector<int> pair = p2p != nullptr ? std::vector<int>{p2p->src, p2p->dst} : std::vector<int>{};
    d.group = p2p != nullptr ? std::string_view(is.group) : std::string_view(name_);
    d.groupRanks = p2p != nullptr ? std::span<const int>(pair) : std::span<const int>(ranks_);
    d.seq = is.seq;
    d.op = vocabulary::opName(op);
    if (t != nullptr) {
      shape.assign(t->sizes().begin(), t->sizes().end());
      d.dtype = dtypeName(t->scalar_type());
      d.shape = shape;
      d.numel = t->numel();
      d.bytes = static_cast<int64_t>(t->numel() * t->element_size());
    } else {
      d.dtype = "none";
    }
    const std::string where = describeCallsite(site, phase, op);
    d.callsite = where;
    d.layer = site.layer;
    d.phase = phase;
    is.handle = is.sink->collectiveEnqueued(d, probes::rawTicks());
    is.sink->collectiveState(is.handle, probes::CollectiveState::Started, probes::rawTicks());
  }
  return is;
}

void Communicator::fail(const Issue& is, const std::exception& e) {
  dead_ = true;
  const bool timedOut = looksLikeTimeout(e);
  if (is.sink != nullptr) {
    is.sink->collectiveState(is.handle,
                             timedOut ? probes::CollectiveState::TimedOut : probes::CollectiveState::Failed,
                             probes::rawTicks());
    is.sink->flush();
  }
  throw CollectiveError(
      fmt::format("collective {} on group {} (ranks {}) seq {} at \"{}\" {} after timeout {} ms: {}",
                  vocabulary::opName(is.op), is.group.empty() ? name_ : is.group, fmt::join(ranks_, ","), is.seq,
                  describeCallsite(is.site, is.phase, is.op),
                  timedOut ? "timed out" : "failed", timeout_.count(), e.what()),
      timedOut);
}

#define TPS_COMM_RUN(issue, body)                                              \
  try {                                                                        \
    CommSpan blocked(commSite((issue).op, false, (issue).phase), (issue).site.layer); \
    body;                                                                      \
  } catch (const CollectiveError&) {                                           \
    throw;                                                                     \
  } catch (const std::exception& e) {                                          \
    fail(issue, e);                                                            \
  }                                                                            \
  if ((issue).sink != nullptr)                                                 \
  (issue).sink->collectiveState((issue).handle, probes::CollectiveState::Completed, probes::rawTicks())

void Communicator::inPlace(CollectiveOp op, at::Tensor& t, const Callsite& site, probes::Phase phase,
                           const std::function<void(std::vector<at::Tensor>&)>& issue) {
  TORCH_CHECK(t.is_contiguous(), vocabulary::opName(op), " on ", name_, " needs a contiguous tensor");
  Issue is = begin(op, &t, site, phase);
  TPS_COMM_RUN(is, {
    at::Tensor wire = wireOf(t, *backend_);
    std::vector<at::Tensor> v{wire};
    issue(v);
    if (!wire.is_same(t)) t.copy_(wire);
  });
  checkResult(is, t);
}

void Communicator::allReduce(at::Tensor& t, ReduceOp op, const Callsite& site, probes::Phase phase) {
  if (size() == 1) return;
  if (FaultInjector* f = activeFaults()) f->mismatchAllReduce(*this, t, site, phase);  // capture: --inject mismatch
  inPlace(CollectiveOp::AllReduce, t, site, phase, [&](std::vector<at::Tensor>& v) {
    c10d::AllreduceOptions o;
    o.reduceOp = op == ReduceOp::Sum ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
    backend_->pg->allreduce(v, o)->wait();
  });
  if (FaultInjector* f = activeFaults()) f->corruptAllReduceResult(*this, t, phase);  // capture: --inject bitflip
}

PendingCollective Communicator::allReduceAsync(at::Tensor t, const Callsite& site, probes::Phase phase) {
  auto st = std::make_unique<PendingCollective::State>();
  st->comm = this;
  st->user = t;
  if (size() == 1) return PendingCollective(std::move(st));
  TORCH_CHECK(t.is_contiguous(), "allReduceAsync on ", name_, " needs a contiguous tensor");
  st->issue = begin(CollectiveOp::AllReduce, &t, site, phase);
  try {
    st->wire = wireOf(t, *backend_);
    std::vector<at::Tensor> v{st->wire};
    st->work = backend_->pg->allreduce(v, c10d::AllreduceOptions{});
  } catch (const std::exception& e) {
    fail(st->issue, e);
  }
  return PendingCollective(std::move(st));  // Completed is recorded by wait()
}

at::Tensor Communicator::allGather(const at::Tensor& t, int64_t dim, const Callsite& site, probes::Phase phase) {
  if (size() == 1) return t;
  at::Tensor out;
  at::Tensor in = t.contiguous();
  Issue is = begin(CollectiveOp::AllGather, &in, site, phase);
  TPS_COMM_RUN(is, {
    at::Tensor wire = wireOf(in, *backend_);
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int i = 0; i < size(); ++i) outs[0].push_back(at::empty_like(wire));
    std::vector<at::Tensor> ins{wire};
    backend_->pg->allgather(outs, ins)->wait();
    out = likeInput(at::cat(outs[0], dim), in);
  });
  checkResult(is, out);
  return out;
}

at::Tensor Communicator::reduceScatter(const at::Tensor& t, int64_t dim, const Callsite& site, probes::Phase phase) {
  if (size() == 1) return t;
  TORCH_CHECK(t.size(dim) % size() == 0, "reduceScatter on ", name_, ": size ", t.size(dim), " along dim ", dim,
              " is not divisible by the group size ", size());
  at::Tensor in = t.contiguous();
  at::Tensor out;
  Issue is = begin(CollectiveOp::ReduceScatter, &in, site, phase);
  TPS_COMM_RUN(is, {
    // Emulated: Gloo here has no reduce-scatter. All-reduce a copy (the input stays untouched), keep our chunk.
    at::Tensor wire = wireOf(in, *backend_, /*copyAlways=*/true);
    std::vector<at::Tensor> v{wire};
    backend_->pg->allreduce(v, c10d::AllreduceOptions{})->wait();
    out = likeInput(wire.chunk(size(), dim)[rank_].contiguous(), in);
  });
  checkResult(is, out);
  return out;
}

void Communicator::broadcast(at::Tensor& t, int root, const Callsite& site, probes::Phase phase) {
  if (size() == 1) return;
  inPlace(CollectiveOp::Broadcast, t, site, phase, [&](std::vector<at::Tensor>& v) {
    c10d::BroadcastOptions o;
    o.rootRank = root;
    backend_->pg->broadcast(v, o)->wait();
  });
}

void Communicator::barrier(const Callsite& site, probes::Phase phase) {
  if (size() == 1) return;
  Issue is = begin(CollectiveOp::Barrier, nullptr, site, phase);
  TPS_COMM_RUN(is, { backend_->pg->barrier()->wait(); });
}

PendingCollective Communicator::send(const at::Tensor& t, int peer, uint64_t seq, const Callsite& site,
                                       probes::Phase phase) {
  TORCH_CHECK(peer >= 0 && peer < size() && peer != rank_, "send on ", name_, ": peer ", peer, " is not another member");
  auto st = std::make_unique<PendingCollective::State>();
  st->comm = this;
  st->user = t.contiguous();
  const P2p p2p{ranks_[rank_], ranks_[peer], seq};
  st->issue = begin(CollectiveOp::Send, &st->user, site, phase, &p2p);
  try {
    st->wire = wireOf(st->user, *backend_);
    std::vector<at::Tensor> v{st->wire};
    st->work = backend_->pg->send(v, peer, static_cast<int>(seq));
  } catch (const std::exception& e) {
    fail(st->issue, e);
  }
  st->sendOnly = true;
  return PendingCollective(std::move(st));  // Completed is recorded by wait()
}

void Communicator::recv(at::Tensor& t, int peer, uint64_t seq, const Callsite& site, probes::Phase phase) {
  TORCH_CHECK(peer >= 0 && peer < size() && peer != rank_, "recv on ", name_, ": peer ", peer, " is not another member");
  TORCH_CHECK(t.is_contiguous(), "recv on ", name_, " needs a contiguous tensor");
  const P2p p2p{ranks_[peer], ranks_[rank_], seq};
  Issue is = begin(CollectiveOp::Recv, &t, site, phase, &p2p);
  TPS_COMM_RUN(is, {
    at::Tensor wire = wireOf(t, *backend_);
    std::vector<at::Tensor> v{wire};
    backend_->pg->recv(v, peer, static_cast<int>(seq))->wait();
    if (!wire.is_same(t)) t.copy_(wire);
  });
  checkResult(is, t);
}

PendingCollective::PendingCollective() = default;
PendingCollective::PendingCollective(std::unique_ptr<State> s) : state_(std::move(s)) {}
PendingCollective::PendingCollective(PendingCollective&&) noexcept = default;
PendingCollective& PendingCollective::operator=(PendingCollective&&) noexcept = default;
PendingCollective::~PendingCollective() = default;

void PendingCollective::wait() {
  TORCH_CHECK(state_ != nullptr, "PendingCollective::wait on an empty or already waited handle");
  std::unique_ptr<State> st = std::move(state_);
  if (!st->work) return;  // size-1 group
  Communicator* c = st->comm;
  try {
    CommSpan blocked(commSite(st->issue.op, /*wait=*/true, st->issue.phase), st->issue.site.layer);
    st->work->wait();
  } catch (const std::exception& e) {
    c->fail(st->issue, e);
  }
  if (!st->sendOnly) {
    if (!st->wire.is_same(st->user)) st->user.copy_(st->wire);
    if (FaultInjector* f = activeFaults()) f->corruptAllReduceResult(*c, st->user, st->issue.phase);  // --inject bitflip
    c->checkResult(st->issue, st->user);
  }
  if (st->issue.sink != nullptr)
    st->issue.sink->collectiveState(st->issue.handle, probes::CollectiveState::Completed, probes::rawTicks());
}

}  // namespace tpscope::core
