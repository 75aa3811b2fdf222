#include "tpscope/core/regions.h"

#include <torch/torch.h>

namespace tpscope::core {

using torch::autograd::AutogradContext;
using torch::autograd::Variable;
using torch::autograd::variable_list;
namespace probes = ::tpscope::probes;

namespace {

template <class T>
int64_t asInt(T* p) {
  return static_cast<int64_t>(reinterpret_cast<intptr_t>(p));
}
template <class T>
T* fromInt(const c10::IValue& v) {
  return reinterpret_cast<T*>(static_cast<intptr_t>(v.toInt()));
}

Communicator& commOf(AutogradContext* ctx) { return *fromInt<Communicator>(ctx->saved_data["comm"]); }
const Callsite& siteOf(AutogradContext* ctx) { return *fromInt<Callsite>(ctx->saved_data["site"]); }

at::Tensor splitLast(const at::Tensor& x, Communicator& c) {
  const int64_t last = x.dim() - 1;
  TORCH_CHECK(x.size(last) % c.size() == 0, "split along the last dim: ", x.size(last), " not divisible by TP ",
              c.size());
  return x.chunk(c.size(), last)[c.rank()].contiguous();
}

struct CopyToTpFn : torch::autograd::Function<CopyToTpFn> {
  static Variable forward(AutogradContext* ctx, Variable x, int64_t comm, int64_t site) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["site"] = site;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    at::Tensor r = g[0].contiguous().clone();
    commOf(ctx).allReduce(r, ReduceOp::Sum, siteOf(ctx), probes::Phase::Backward);
    return {r, Variable(), Variable()};
  }
};

struct ReduceFromTpFn : torch::autograd::Function<ReduceFromTpFn> {
  static Variable forward(AutogradContext* ctx, Variable x, int64_t comm, int64_t site) {
    at::Tensor r = x.contiguous().clone();
    fromInt<Communicator>(comm)->allReduce(r, ReduceOp::Sum, *fromInt<Callsite>(site), probes::Phase::Forward);
    return r;
  }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0], Variable(), Variable()}; }
};

struct ScatterToTpFn : torch::autograd::Function<ScatterToTpFn> {
  static Variable forward(AutogradContext* ctx, Variable x, int64_t comm, int64_t site) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["site"] = site;
    return splitLast(x, *fromInt<Communicator>(comm));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    at::Tensor r = commOf(ctx).allGather(g[0], g[0].dim() - 1, siteOf(ctx), probes::Phase::Backward);
    return {r, Variable(), Variable()};
  }
};

struct GatherFromTpFn : torch::autograd::Function<GatherFromTpFn> {
  static Variable forward(AutogradContext* ctx, Variable x, int64_t comm, int64_t site) {
    ctx->saved_data["comm"] = comm;
    return fromInt<Communicator>(comm)->allGather(x, x.dim() - 1, *fromInt<Callsite>(site), probes::Phase::Forward);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {splitLast(g[0], commOf(ctx)), Variable(), Variable()};
  }
};

struct GatherFromSequenceFn : torch::autograd::Function<GatherFromSequenceFn> {
  static Variable forward(AutogradContext* ctx, Variable x, int64_t comm, int64_t site) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["site"] = site;
    return fromInt<Communicator>(comm)->allGather(x, kSeqDim, *fromInt<Callsite>(site), probes::Phase::Forward);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {commOf(ctx).reduceScatter(g[0], kSeqDim, siteOf(ctx), probes::Phase::Backward), Variable(), Variable()};
  }
};

struct ReduceScatterToSequenceFn : torch::autograd::Function<ReduceScatterToSequenceFn> {
  static Variable forward(AutogradContext* ctx, Variable x, int64_t comm, int64_t site) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["site"] = site;
    return fromInt<Communicator>(comm)->reduceScatter(x, kSeqDim, *fromInt<Callsite>(site), probes::Phase::Forward);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {commOf(ctx).allGather(g[0], kSeqDim, siteOf(ctx), probes::Phase::Backward), Variable(), Variable()};
  }
};

struct SpanBeginFn : torch::autograd::Function<SpanBeginFn> {
  static Variable forward(AutogradContext* ctx, Variable y, int64_t slot) {
    ctx->saved_data["slot"] = slot;
    return y.view_as(y);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    fromInt<BackwardSpanSlot>(ctx->saved_data["slot"])->t0 = probes::rawTicks();
    return {g[0], Variable()};
  }
};

struct SpanEndFn : torch::autograd::Function<SpanEndFn> {
  static Variable forward(AutogradContext* ctx, Variable x, int64_t site, int64_t layer, int64_t slot) {
    ctx->saved_data["site"] = site;
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["slot"] = slot;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const auto* site = fromInt<const probes::Site>(ctx->saved_data["site"]);
    const uint64_t t0 = fromInt<BackwardSpanSlot>(ctx->saved_data["slot"])->t0;
    if (t0 != 0) probes::emitSpan(site, t0, probes::rawTicks(), static_cast<int>(ctx->saved_data["layer"].toInt()));
    return {g[0], Variable(), Variable(), Variable()};
  }
};

}  // namespace

#define TPS_REGION(Fn, x, tp, site) \
  ((tp).size() == 1 ? (x) : Fn::apply((x), asInt(&(tp)), asInt(const_cast<Callsite*>(&(site)))))

at::Tensor copyToTp(const at::Tensor& x, Communicator& tp, const Callsite& site) {
  return TPS_REGION(CopyToTpFn, x, tp, site);
}
at::Tensor reduceFromTp(const at::Tensor& x, Communicator& tp, const Callsite& site) {
  return TPS_REGION(ReduceFromTpFn, x, tp, site);
}
at::Tensor scatterToTp(const at::Tensor& x, Communicator& tp, const Callsite& site) {
  return TPS_REGION(ScatterToTpFn, x, tp, site);
}
at::Tensor gatherFromTp(const at::Tensor& x, Communicator& tp, const Callsite& site) {
  return TPS_REGION(GatherFromTpFn, x, tp, site);
}
at::Tensor gatherFromSequence(const at::Tensor& x, Communicator& tp, const Callsite& site) {
  return TPS_REGION(GatherFromSequenceFn, x, tp, site);
}
at::Tensor reduceScatterToSequence(const at::Tensor& x, Communicator& tp, const Callsite& site) {
  return TPS_REGION(ReduceScatterToSequenceFn, x, tp, site);
}

at::Tensor backwardSpanBegin(const at::Tensor& y, BackwardSpanSlot& slot) {
  if (!probes::recording() || !y.requires_grad()) return y;
  return SpanBeginFn::apply(y, asInt(&slot));
}

at::Tensor backwardSpanEnd(const at::Tensor& x, const probes::Site& site, int layer, BackwardSpanSlot& slot) {
  if (!probes::recording() || !x.requires_grad()) return x;
  slot.t0 = 0;
  return SpanEndFn::apply(x, asInt(const_cast<probes::Site*>(&site)), static_cast<int64_t>(layer), asInt(&slot));
}

}  // namespace tpscope::core
