#include "tpscope/core/op_check.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

#include "tpscope/probes/probes.h"
#include "tpscope/rules/config.h"
#include "tpscope/vocabulary/alert_kinds.h"

namespace tpscope::core {

namespace probes = ::tpscope::probes;
using Json = nlohmann::json;

namespace {

std::atomic<OpCheck*> g_active{nullptr};

// The spans open on this thread while armed (range hooks), the last one closed, and autograd's backward functions.
struct OpenSpan {
  const probes::Site* site = nullptr;
  int layer = -1;
};
struct BackwardFn {
  std::string name;
  int64_t seqNr = -1;
};
thread_local std::vector<OpenSpan> t_spans;
thread_local OpenSpan t_lastClosed;
thread_local std::vector<BackwardFn> t_backward;
thread_local BackwardFn t_lastBackward;         // the backward function that ended last (gradient hooks run after it)
thread_local bool t_backwardSinceGrad = false;  // a backward function started since the last op in grad mode
thread_local bool t_checking = false;           // inside a check (its own ATen calls are not checked)

void (*g_prevPush)(const probes::Site*, int16_t) = nullptr;
void (*g_prevPop)() = nullptr;

void pushRange(const probes::Site* site, int16_t layer) {
  t_spans.push_back({site, layer});
  if (g_prevPush != nullptr) g_prevPush(site, layer);
}
void popRange() {
  if (!t_spans.empty()) {
    t_lastClosed = t_spans.back();
    t_spans.pop_back();
  }
  if (g_prevPop != nullptr) g_prevPop();
}

std::string spanText(const OpenSpan& s) {
  if (s.site == nullptr) return "";
  return s.layer >= 0 ? fmt::format("layer {} {}", s.layer, s.site->name) : std::string(s.site->name);
}

// The innermost open span below the step's own ("train step" opens before the check is armed and is not on the
// stack), or "after" the last one closed.
std::string whereNow(int* layer) {
  if (!t_spans.empty()) {
    *layer = t_spans.back().layer;
    return spanText(t_spans.back());
  }
  *layer = t_lastClosed.layer;
  return t_lastClosed.site != nullptr ? "after " + spanText(t_lastClosed) : "";
}

std::string passNow(bool gradMode) {
  if (!t_spans.empty()) {
    const probes::Phase p = t_spans.back().site->phase;
    if (p == probes::Phase::Optimizer) return "optimizer";
    if (p == probes::Phase::Data) return "data";
  }
  if (!t_backward.empty()) return "backward";
  if (gradMode) return "forward";
  return t_backwardSinceGrad ? "backward" : "step";
}

// One value's statistics: finite, max |x| (NaN when it holds a NaN), NaN and Inf counts (counted only when not
// finite). Integer and boolean tensors are finite by construction.
struct ValueStat {
  std::string kind;  // "tensor", "scalar", "other"
  std::string dtype;
  std::vector<int64_t> shape;
  bool finite = true;
  // NaN or +Inf: what the check looks for. −Inf alone is how attention masks are written (masked_fill with −inf, then
  // softmax), so a value that only holds −Inf is reported in the statistics but carries nothing.
  bool bad() const { return nan > 0 || posInf > 0; }
  double maxAbs = 0;
  int64_t nan = 0, inf = 0, posInf = 0;
  const void* data = nullptr;
};

// An input that is also one of the outputs (in place, out=): the operator writes it.
bool writtenBy(const ValueStat& input, const std::vector<ValueStat>& outputs) {
  return input.data != nullptr &&
         std::any_of(outputs.begin(), outputs.end(), [&](const ValueStat& o) { return o.data == input.data; });
}

bool checkable(const at::Tensor& t) {
  return t.defined() && !t.is_meta() && t.numel() > 0 &&
         (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type()));
}

ValueStat statOf(const at::Tensor& t) {
  ValueStat s;
  s.kind = "tensor";
  if (!t.defined()) return s;
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) s.kind = "scalar";  // a Python/C++ number ATen made a tensor of
  s.dtype = std::string(c10::toString(t.scalar_type()));
  s.shape = t.sizes().vec();
  if (!checkable(t)) return s;
  s.data = t.data_ptr();
  at::Tensor d = t.detach();
  if (at::isComplexType(d.scalar_type())) d = at::view_as_real(d);
  // One reduction: max |x| propagates NaN and +Inf, so it says whether the tensor is finite.
  s.maxAbs = at::linalg_vector_norm(d, INFINITY).item<double>();
  s.finite = std::isfinite(s.maxAbs);
  if (!s.finite) {
    s.nan = at::isnan(d).sum().item<int64_t>();
    s.inf = at::isinf(d).sum().item<int64_t>();
    s.posInf = s.inf > 0 ? at::isposinf(d).sum().item<int64_t>() : 0;
    if (s.nan == 0) s.maxAbs = INFINITY;
  }
  return s;
}

std::vector<ValueStat> statsOf(c10::ArrayRef<const c10::IValue> values) {
  std::vector<ValueStat> out;
  for (const c10::IValue& v : values) {
    if (v.isTensor()) {
      out.push_back(statOf(v.toTensor()));
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) out.push_back(statOf(t));
    } else if (v.isDouble() || v.isComplexDouble()) {
      ValueStat s;
      s.kind = "scalar";
      const double x = v.isDouble() ? v.toDouble() : std::abs(v.toComplexDouble());
      s.dtype = "float64";
      s.maxAbs = std::abs(x);
      s.finite = std::isfinite(x);
      s.nan = std::isnan(x) ? 1 : 0;
      s.inf = std::isinf(x) ? 1 : 0;
      s.posInf = v.isDouble() && x > 0 && std::isinf(x) ? 1 : 0;
      out.push_back(s);
    } else if (v.isScalar() || v.isInt() || v.isBool()) {
      ValueStat s;
      s.kind = "scalar";
      s.dtype = v.isBool() ? "bool" : "int64";
      out.push_back(s);
    } else {
      ValueStat s;
      s.kind = "other";
      out.push_back(s);
    }
  }
  return out;
}

// How an operator's outputs relate to its arguments, from its schema (alias annotations): it writes an argument
// (in place, out=), returns a view of one without writing it, or neither. Cached per operator name.
enum class Aliasing : uint8_t { None, Writes, Views };

Aliasing aliasingOf(const at::RecordFunction& fn) {
  thread_local std::unordered_map<std::string, Aliasing> cache;
  const std::optional<c10::OperatorName> name = fn.operator_name();
  if (!name) return Aliasing::None;
  const std::string key = c10::toString(*name);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  Aliasing a = Aliasing::None;
  // In place on the metadata only (strides, sizes, storage): the values are the input's.
  static const std::unordered_set<std::string> kMetadataOnly = {
      "aten::as_strided_", "aten::resize_",    "aten::resize_as_", "aten::set_",
      "aten::squeeze_",    "aten::unsqueeze_", "aten::transpose_", "aten::t_",
      "aten::swapdims_",   "aten::swapaxes_",  "aten::detach_",    "aten::requires_grad_"};
  if (kMetadataOnly.contains(name->name)) {
    a = Aliasing::Views;
  } else if (auto handle = c10::Dispatcher::singleton().findOp(*name)) {
    const c10::FunctionSchema& schema = handle->schema();
    for (const auto& arg : schema.arguments())
      if (arg.alias_info() != nullptr && arg.alias_info()->isWrite()) a = Aliasing::Writes;
    if (a == Aliasing::None)
      for (const auto& ret : schema.returns())
        if (ret.alias_info() != nullptr) a = Aliasing::Views;
  }
  cache.emplace(key, a);
  return a;
}

// The inputs as the operator received them (taken when it starts: an in-place operator changes them).
struct InputContext : at::ObserverContext {
  std::vector<ValueStat> inputs;
};

}  // namespace

struct OpCheck::State {
  OpCheck* owner = nullptr;
  std::unordered_map<const void*, std::string> paramOf;                // parameter storage → name
  std::mutex mu;                                                       // guards the fields below
  std::unordered_map<int64_t, std::pair<std::string, int>> forwardAt;  // sequence number → span, layer
  at::CallbackHandle handle = 0;
  bool installed = false;
  std::atomic<bool> found{false};
  std::atomic<int64_t> opsChecked{0};

  std::string paramName(const void* data) const {
    auto it = paramOf.find(data);
    return it == paramOf.end() ? "" : it->second;
  }

  // The first non-finite value: fills the owner's report once.
  // `gradMode`: autograd's grad mode where the operator ran (the check itself runs without). Inputs that are also
  // outputs (in place, out=) are shown but carry nothing: their value before the operator was its own business.
  void describe(const std::string& op, const std::vector<ValueStat>& inputs, const std::vector<ValueStat>& outputs,
                const ValueStat& output, const std::string& collective, bool gradMode) {
    std::lock_guard<std::mutex> lock(mu);
    if (found.exchange(true)) return;
    OpCheck::Report& r = owner->report_;
    r.found = true;
    r.op = op;
    r.collective = collective;
    r.pass = passNow(gradMode);
    r.microbatch = owner->microbatch_;
    r.span = whereNow(&r.layer);
    const bool after = t_backward.empty() && r.pass == "backward" && !t_lastBackward.name.empty();
    if (!t_backward.empty() || after) {
      // Inside a backward function, or after one (a gradient hook runs between autograd's functions).
      const BackwardFn& b = after ? t_lastBackward : t_backward.back();
      r.backwardFn = (after ? "after " : "") + b.name;
      if (auto it = forwardAt.find(b.seqNr); it != forwardAt.end()) {
        r.span = (after ? "after the backward of " : "backward of ") + it->second.first;
        r.layer = it->second.second;
      }
    }
    Json in = Json::array();
    for (size_t i = 0; i < inputs.size(); ++i) {
      const ValueStat& s = inputs[i];
      Json j{{"index", i}, {"kind", s.kind}, {"dtype", s.dtype}, {"finite", s.finite}};
      if (s.kind == "tensor") j["shape"] = s.shape;
      if ((s.kind == "tensor" && s.data != nullptr) || (s.kind == "scalar" && s.dtype == "float64"))
        j["max_abs"] = std::isnan(s.maxAbs) ? Json("nan") : std::isinf(s.maxAbs) ? Json("inf") : Json(s.maxAbs);
      if (!s.finite) j.update({{"nan", s.nan}, {"inf", s.inf}, {"neg_inf", s.inf - s.posInf}});
      const std::string param = paramName(s.data);
      if (!param.empty()) j["param"] = param;
      const bool written = writtenBy(s, outputs);
      if (written) j["written"] = true;
      in.push_back(std::move(j));
      if (s.bad() && !written && r.carrier < 0) {
        r.carrier = static_cast<int>(i);
        r.carrierParam = param;
      }
    }
    r.inputs = in.dump();
    r.produced = r.carrier < 0 && collective.empty();
    r.outputNan = output.nan;
    r.outputInf = output.inf;
  }
};

namespace {

std::atomic<OpCheck::State*> g_state{nullptr};  // the armed check's state; null when none is armed

struct Checking {  // the check's own ATen calls: not observed, not recorded by autograd
  Checking() { t_checking = true; }
  ~Checking() { t_checking = false; }
  at::DisableRecordFunctionGuard noObservers;
  at::NoGradGuard noGrad;
};

// Operators whose outputs are not values yet (uninitialised memory may hold any bits, NaN included) or not final
// when the operator returns (c10d's: the transfer may be in flight; the communicator reports the landed result).
bool unchecked(const at::RecordFunction& fn) {
  const std::string_view name(fn.name());
  return name.starts_with("c10d::") || name.find("empty") != std::string_view::npos || name == "aten::resize_" ||
         name == "aten::set_";
}

std::unique_ptr<at::ObserverContext> onStart(const at::RecordFunction& fn) {
  OpCheck::State* st = g_state.load(std::memory_order_acquire);
  if (t_checking || st == nullptr || st->found.load(std::memory_order_relaxed)) return nullptr;
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    t_backward.push_back({fn.name(), fn.seqNr()});
    t_backwardSinceGrad = true;
    return nullptr;
  }
  if (at::GradMode::is_enabled()) {
    t_backwardSinceGrad = false;
    if (fn.seqNr() >= 0) {
      int layer = -1;
      std::string where = whereNow(&layer);
      std::lock_guard<std::mutex> lock(st->mu);
      st->forwardAt[fn.seqNr()] = {std::move(where), layer};
    }
  }
  // A collective's own work (its copies, Gloo's restriding of the result): its result is checked once it has landed.
  if (unchecked(fn) || (!t_spans.empty() && t_spans.back().site->kind == probes::SpanKind::Comm)) return nullptr;
  Checking guard;
  auto ctx = std::make_unique<InputContext>();
  ctx->inputs = statsOf(fn.inputs());
  return ctx;
}

void onEnd(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  OpCheck::State* st = g_state.load(std::memory_order_acquire);
  if (t_checking || st == nullptr) return;
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    if (!t_backward.empty()) {
      t_lastBackward = t_backward.back();
      t_backward.pop_back();
    }
    return;
  }
  auto* in = static_cast<InputContext*>(ctx);
  if (in == nullptr || st->found.load(std::memory_order_relaxed)) return;
  st->opsChecked.fetch_add(1, std::memory_order_relaxed);
  const bool gradMode = at::GradMode::is_enabled();
  Checking guard;
  const std::vector<c10::IValue>& outputs = fn.outputs();
  const std::vector<ValueStat> outs = statsOf(c10::ArrayRef<const c10::IValue>(outputs.data(), outputs.size()));
  // An output that shares an input's memory is the operator's work only where it writes an argument: a view's values
  // are its input's (possibly a buffer not written yet, such as an out= argument on its way to the kernel).
  const bool writes = aliasingOf(fn) == Aliasing::Writes;
  // A number turned into a one-element tensor (type promotion of a constant such as isfinite's +Inf) is a constant,
  // not a computed value: a zero-dimensional output whose only NaN/+Inf source is a number is left alone. Where no
  // input holds one, the operator computed it (0/0 of a loss over no counted token). An argument the operator writes
  // is not a source (describe() does not name it either): what it held before is its own business — the destination
  // of copy_ or fill_ is often fresh memory, whose bits may read as NaN in one run and not in the next.
  const auto source = [&](const ValueStat& i) { return i.bad() && !writtenBy(i, outs); };
  const bool fromNumbers = std::any_of(in->inputs.begin(), in->inputs.end(), source) &&
                           std::all_of(in->inputs.begin(), in->inputs.end(),
                                       [&](const ValueStat& i) { return !source(i) || i.kind == "scalar"; });
  for (const ValueStat& out : outs)
    if (out.bad() && !(fromNumbers && out.shape.empty()) &&
        (writes ||
         std::none_of(in->inputs.begin(), in->inputs.end(), [&](const ValueStat& i) { return i.data == out.data; }))) {
      st->describe(fn.name(), in->inputs, outs, out, "", gradMode);
      return;
    }
}

void installRangeHooks() {
  g_prevPush = probes::detail::g_rangePush.load(std::memory_order_acquire);
  g_prevPop = probes::detail::g_rangePop.load(std::memory_order_acquire);
  probes::detail::g_rangePush.store(&pushRange, std::memory_order_release);
  probes::detail::g_rangePop.store(&popRange, std::memory_order_release);
}

void restoreRangeHooks() {
  probes::detail::g_rangePush.store(g_prevPush, std::memory_order_release);
  probes::detail::g_rangePop.store(g_prevPop, std::memory_order_release);
  g_prevPush = nullptr;
  g_prevPop = nullptr;
}

}  // namespace

std::unique_ptr<OpCheck> OpCheck::fromEnvironment(int rank, const std::vector<std::string>& names,
                                                  const std::vector<at::Tensor>& params) {
  const char* v = std::getenv("TPSCOPE_REPLAY_STEP");
  if (v == nullptr || *v == '\0') return nullptr;
  char* end = nullptr;
  const long step = std::strtol(v, &end, 10);
  if (*end != '\0' || step < 1 || step > 1'000'000'000)
    throw rules::ConfigError(fmt::format("TPSCOPE_REPLAY_STEP '{}': expected a step number >= 1", v));
  return std::make_unique<OpCheck>(rank, static_cast<int>(step), names, params);
}

OpCheck::OpCheck(int rank, int step, const std::vector<std::string>& names, const std::vector<at::Tensor>& params,
                 bool live, int afterStep)
    : rank_(rank), step_(step), live_(live), afterStep_(afterStep), state_(std::make_unique<State>()) {
  state_->owner = this;
  for (size_t i = 0; i < params.size() && i < names.size(); ++i)
    if (params[i].defined()) state_->paramOf[params[i].data_ptr()] = names[i];
  g_active.store(this, std::memory_order_release);
}

OpCheck::~OpCheck() {
  disarm();
  g_active.store(nullptr, std::memory_order_release);
}

OpCheck* activeOpCheck() noexcept {
  return g_active.load(std::memory_order_acquire);
}

void OpCheck::stepBegin(int64_t step) {
  if (!done_ && (step == step_ || (live_ && step > step_))) arm();
}

void OpCheck::stepEnd(int64_t step) {
  if (!armed_) return;
  disarm();
  if (live_ && !report_.found) return;  // live: the next step is checked too
  done_ = true;
  sendAlert(static_cast<int>(step));
}

void OpCheck::arm() {
  if (armed_) return;
  armed_ = true;
  report_ = Report{};
  t_spans.clear();
  t_lastClosed = {};
  t_backward.clear();
  t_lastBackward = {};
  t_backwardSinceGrad = false;
  installRangeHooks();
  state_->found = false;
  state_->opsChecked = 0;
  g_state.store(state_.get(), std::memory_order_release);
  state_->handle = at::addGlobalCallback(at::RecordFunctionCallback(&onStart, &onEnd)
                                             .needsInputs(true)
                                             .needsOutputs(true)
                                             .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  state_->installed = true;
}

void OpCheck::disarm() {
  if (!armed_) return;
  armed_ = false;
  if (state_->installed) at::removeCallback(state_->handle);
  state_->installed = false;
  g_state.store(nullptr, std::memory_order_release);
  restoreRangeHooks();
  report_.opsChecked = state_->opsChecked.load();
}

void OpCheck::collectiveResult(const std::string& what, const at::Tensor& result) {
  State* st = g_state.load(std::memory_order_acquire);
  if (st == nullptr || t_checking || st->found.load(std::memory_order_relaxed)) return;
  const bool gradMode = at::GradMode::is_enabled();
  ValueStat out;
  {
    Checking guard;
    out = statOf(result);
  }
  if (out.bad()) st->describe("collective", {}, {}, out, what, gradMode);
}

void OpCheck::sendAlert(int step) const {
  probes::Sink* sink = probes::sink();
  const Report& r = report_;
  Json ev{{"ops_checked", r.opsChecked}, {"check_step", step_}, {"live", live_}};
  if (live_) ev["after_step"] = afterStep_;
  std::string message;
  probes::Alert a;
  a.step = step;
  if (r.found) {
    ev.update({{"op", r.op},
               {"pass", r.pass},
               {"backward_function", r.backwardFn},
               {"span", r.span},
               {"layer", r.layer},
               {"microbatch", r.microbatch},
               {"produced", r.produced},
               {"carrier_input", r.carrier},
               {"carrier_param", r.carrierParam},
               {"collective", r.collective},
               {"inputs", Json::parse(r.inputs.empty() ? "[]" : r.inputs)},
               {"output_nan", r.outputNan},
               {"output_inf", r.outputInf}});
    const char* value = r.outputNan > 0 ? "NaN" : "Inf";
    const std::string where =
        (r.span.empty() ? "" : ", " + r.span) + (r.backwardFn.empty()                 ? ""
                                                 : r.backwardFn.starts_with("after ") ? ", " + r.backwardFn
                                                                                      : ", in " + r.backwardFn);
    if (r.op == "collective")
      message = fmt::format("rank {} step {}: {} arrived in the result of {}", rank_, step, value, r.collective);
    else if (r.produced)
      message = fmt::format("rank {} step {}: {} made {} ({} pass{}); no input carried it", rank_, step, r.op, value,
                            r.pass, where);
    else
      message =
          fmt::format("rank {} step {}: {} output {} ({} pass{}); its input {}{} already carried it", rank_, step, r.op,
                      value, r.pass, where, r.carrier, r.carrierParam.empty() ? "" : " (" + r.carrierParam + ")");
    a.severity = probes::Severity::Error;
    a.kind = vocabulary::alert_kinds::kOpCheck;
    a.layer = r.layer;
    a.param = r.op;
  } else {
    message = fmt::format("rank {} step {}: {} operators checked, every output finite", rank_, step, r.opsChecked);
    a.severity = probes::Severity::Info;
    a.kind = vocabulary::alert_kinds::kOpCheckClean;
  }
  std::fprintf(stderr, "tpscope %s: %s\n", live_ ? "op check" : "replay", message.c_str());
  if (sink == nullptr) return;
  const std::string evidence = ev.dump();
  a.message = message;
  a.evidence = evidence;
  sink->alert(a);
  sink->flush();
}

}  // namespace tpscope::core
