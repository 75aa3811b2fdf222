#include "tpscope/core/faults.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>

#include "tpscope/core/activation_health.h"
#include "tpscope/core/communicator.h"
#include "tpscope/core/mesh.h"
#include "tpscope/core/op_check.h"
#include "tpscope/core/replica_check.h"
#include "tpscope/rules/config.h"
#include "tpscope/vocabulary/collective_ops.h"

namespace tpscope::core {

namespace probes = ::tpscope::probes;
// The fault specs and health rules this file carries out (rules/fault_spec.h, rules/health_rules.h).
using rules::checkFaultSpec;
using rules::ConfigError;
using rules::FaultKind;
using rules::FaultPhase;
using rules::FaultSpec;
using rules::formatFaultSpec;
using rules::HealthOptions;
using rules::HealthPolicy;
using rules::kBitflipAllReduce;
using rules::kDefaultFlipBit;
using rules::parseFaultList;
using rules::parseHealthOptions;
using rules::StepAction;

namespace {

std::atomic<FaultInjector*> g_faults{nullptr};

// Busy work, so a slow rank shows longer compute, not idle time.
void spinFor(std::chrono::microseconds us) {
  const auto until = std::chrono::steady_clock::now() + us;
  volatile uint64_t x = 0;
  while (std::chrono::steady_clock::now() < until)
    for (int i = 0; i < 1000; ++i) x = x + static_cast<uint64_t>(i);
}

bool phaseMatches(FaultPhase want, probes::Phase got) {
  if (want == FaultPhase::Any) return true;
  return (want == FaultPhase::Forward && got == probes::Phase::Forward) ||
         (want == FaultPhase::Backward && got == probes::Phase::Backward);
}

const char* envOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

// " of micro-batch K" for a spec placed in one micro-batch, else "".
std::string ofMicrobatch(const FaultSpec& s) {
  return s.microbatch >= 0 ? fmt::format(" of micro-batch {}", s.microbatch) : std::string();
}

void announce(const std::string& what) {
  std::fprintf(stderr, "tpscope inject: %s\n", what.c_str());
  std::fflush(stderr);
}

}  // namespace

FaultInjector* activeFaults() noexcept { return g_faults.load(std::memory_order_relaxed); }

FaultInjector::FaultInjector(std::vector<FaultSpec> specs, int rank) : rank_(rank) {
  for (auto& s : specs)
    if (s.rank == rank) specs_.push_back(s);
  fired_.assign(specs_.size(), false);
}

bool FaultInjector::has(FaultKind kind) const {
  for (const auto& s : specs_)
    if (s.kind == kind) return true;
  return false;
}

void FaultInjector::stepBegin(int step) {
  step_ = step;
  for (size_t i = 0; i < specs_.size(); ++i) {
    const FaultSpec& s = specs_[i];
    if (s.kind == FaultKind::Slow && !slowInPasses_ && (s.step < 0 || s.step == step)) {
      TPS_SPAN("injected slow compute", Compute, Forward);
      spinFor(std::chrono::milliseconds(s.ms));
    } else if (s.kind == FaultKind::Crash && s.step == step && !fired_[i]) {
      fired_[i] = true;
      announce(fmt::format("rank {} aborts at the start of step {} ({})", rank_, step, formatFaultSpec(s)));
      std::abort();
    }
  }
}

void FaultInjector::slowPass(int passesPerStep) {
  for (const FaultSpec& s : specs_)
    if (s.kind == FaultKind::Slow && (s.step < 0 || s.step == step_))
      spinFor(std::chrono::microseconds(1000 * s.ms / std::max(1, passesPerStep)));
}

void FaultInjector::attachGradientHooks(const std::vector<std::string>& names, const std::vector<int>& layers,
                                        std::vector<at::Tensor> params) {
  for (size_t i = 0; i < specs_.size(); ++i) {
    const FaultSpec s = specs_[i];
    if ((s.kind == FaultKind::Nan || s.kind == FaultKind::Inf) && s.phase != FaultPhase::Forward) {
      // The target: the first parameter of layer L (layer 0 when not given); else the first parameter.
      const int want = s.layer >= 0 ? s.layer : 0;
      size_t target = params.size();
      for (size_t p = 0; p < params.size() && target == params.size(); ++p)
        if (layers[p] == want) target = p;
      if (target == params.size()) {
        if (s.layer >= 0)
          throw ConfigError(fmt::format("TPSCOPE_INJECT '{}': the model has no layer {}", formatFaultSpec(s), s.layer));
        target = 0;
      }
      const std::string name = names[target];
      const double value = s.kind == FaultKind::Nan ? std::numeric_limits<double>::quiet_NaN()
                                                    : std::numeric_limits<double>::infinity();
      params[target].register_hook([this, i, s, name, value](const at::Tensor& g) -> at::Tensor {
        if (fired_[i] || step_ != s.step || !inMicrobatch(s)) return at::Tensor();
        fired_[i] = true;
        announce(fmt::format("rank {} step {}: {} enters the gradient of {}{} ({})", rank_, step_,
                             s.kind == FaultKind::Nan ? "NaN" : "+Inf", name, ofMicrobatch(s),
                             formatFaultSpec(s)));
        at::Tensor out = g.clone();
        out.view({-1}).narrow(0, 0, 1).fill_(value);
        return out;
      });
    } else if (s.kind == FaultKind::Spike) {
      for (auto& p : params) {
        p.register_hook([this, i, s](const at::Tensor& g) -> at::Tensor {
          if (step_ != s.step) return at::Tensor();
          if (!fired_[i]) {
            fired_[i] = true;
            announce(fmt::format("rank {} step {}: gradients x {} ({})", rank_, step_, s.factor, formatFaultSpec(s)));
          }
          return g * s.factor;
        });
      }
    }
  }
}

at::Tensor FaultInjector::corruptActivation(int layer, const at::Tensor& output) {
  for (size_t i = 0; i < specs_.size(); ++i) {
    const FaultSpec& s = specs_[i];
    if ((s.kind != FaultKind::Nan && s.kind != FaultKind::Inf) || s.phase != FaultPhase::Forward) continue;
    if (fired_[i] || s.step != step_ || std::max(s.layer, 0) != layer || !inMicrobatch(s)) continue;
    fired_[i] = true;
    const bool nan = s.kind == FaultKind::Nan;
    announce(fmt::format("rank {} step {}: {} enters the output of layer {} in the forward pass{} ({})", rank_, step_,
                         nan ? "NaN" : "+Inf", layer, ofMicrobatch(s), formatFaultSpec(s)));
    // Out of place and differentiable (the gradient of an addition passes through): autograd sees a normal graph.
    at::Tensor bad = torch::zeros(output.sizes(), output.options());
    bad.view({-1}).narrow(0, 0, 1).fill_(nan ? std::numeric_limits<double>::quiet_NaN()
                                             : std::numeric_limits<double>::infinity());
    return output + bad;
  }
  return output;
}

void FaultInjector::beforeCollective(const Communicator& comm, vocabulary::CollectiveOp op, probes::Phase phase) {
  for (size_t i = 0; i < specs_.size(); ++i) {
    const FaultSpec& s = specs_[i];
    if (s.kind == FaultKind::Delay) {
      std::this_thread::sleep_for(std::chrono::milliseconds(s.ms));
    } else if (s.kind == FaultKind::Hang && s.step == step_ && !fired_[i] && phaseMatches(s.phase, phase) &&
               inMicrobatch(s)) {
      fired_[i] = true;
      const auto limit = 2 * comm.timeout();
      announce(fmt::format("rank {} step {}: skips {} seq {} on group {} and stalls ({})", rank_, step_,
                           vocabulary::opName(op), comm.seq() + 1, comm.name(), formatFaultSpec(s)));
      TPS_SPAN("injected hang: stalled before a collective", Other, Other);
      const auto until = std::chrono::steady_clock::now() + limit;
      while (std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      throw CollectiveError(fmt::format("injected hang: rank {} stalled {} ms before {} seq {} on group {}", rank_,
                                        limit.count(), vocabulary::opName(op), comm.seq() + 1, comm.name()),
                            true);
    }
  }
}

bool FaultInjector::mismatchAllReduce(const Communicator& comm, at::Tensor& t, const Callsite& site,
                                      probes::Phase phase) {
  for (size_t i = 0; i < specs_.size(); ++i) {
    const FaultSpec& s = specs_[i];
    if (s.kind != FaultKind::Mismatch || s.step != step_ || fired_[i] || !phaseMatches(s.phase, phase)) continue;
    fired_[i] = true;
    announce(fmt::format("rank {} step {}: all-reduce of {} elements sent as {} ({})", rank_, step_, t.numel(),
                         t.numel() + 1, formatFaultSpec(s)));
    t = at::zeros({t.numel() + 1}, t.options());
    if (probes::Sink* sink = probes::sink()) {
      // The communicator records the same (group, seq) right after this (an upsert of the same row).
      const std::vector<int64_t> shape{t.numel()};
      const std::string where = describeCallsite(site, phase, vocabulary::CollectiveOp::AllReduce);
      probes::CollectiveDesc d;
      d.group = comm.name();
      d.groupRanks = comm.globalRanks();
      d.seq = comm.seq() + 1;
      d.op = vocabulary::opName(vocabulary::CollectiveOp::AllReduce);
      d.dtype = t.scalar_type() == at::kDouble ? "float64"
                : t.scalar_type() == at::kBFloat16 ? "bfloat16"
                : t.scalar_type() == at::kHalf    ? "float16"
                                                  : "float32";
      d.shape = shape;
      d.numel = t.numel();
      d.bytes = t.numel() * static_cast<int64_t>(t.element_size());
      d.callsite = where;
      d.layer = site.layer;
      d.phase = phase;
      const uint64_t h = sink->collectiveEnqueued(d, probes::rawTicks());
      sink->collectiveState(h, probes::CollectiveState::Started, probes::rawTicks());
      sink->flush();
    }
    return true;
  }
  return false;
}

void FaultInjector::flipParameterBit(const std::vector<std::string>& names, const std::vector<at::Tensor>& params,
                                     const std::vector<bool>& replicated) {
  for (size_t i = 0; i < specs_.size(); ++i) {
    const FaultSpec& s = specs_[i];
    if (s.kind != FaultKind::Bitflip || s.tensor == kBitflipAllReduce || s.step != step_ || fired_[i]) continue;
    fired_[i] = true;
    size_t target = params.size();
    for (size_t p = 0; p < params.size() && target == params.size(); ++p)
      if (s.tensor.empty() ? replicated[p] : names[p] == s.tensor) target = p;
    if (target == params.size()) target = 0;  // no replicated parameter (names were checked at start-up)
    torch::NoGradGuard ng;
    const at::Tensor& t = params[target];
    const double before = t.detach().reshape({-1})[0].item<double>();
    const int bit = flipBit(t, 0, s.bit >= 0 ? s.bit : kDefaultFlipBit);
    announce(fmt::format("rank {} step {}: bit {} of {}[0] flips after the optimizer update: {} -> {} ({})", rank_,
                         step_, bit, names[target], before, t.detach().reshape({-1})[0].item<double>(),
                         formatFaultSpec(s)));
  }
}

void FaultInjector::corruptAllReduceResult(const Communicator& comm, const at::Tensor& result, probes::Phase phase) {
  for (size_t i = 0; i < specs_.size(); ++i) {
    const FaultSpec& s = specs_[i];
    if (s.kind != FaultKind::Bitflip || s.tensor != kBitflipAllReduce || s.step != step_ || fired_[i] ||
        !phaseMatches(s.phase, phase) || result.numel() == 0)
      continue;
    fired_[i] = true;
    const int bit = flipBit(result, 0, s.bit >= 0 ? s.bit : kDefaultFlipBit);
    announce(fmt::format("rank {} step {}: bit {} of element 0 of the result of all-reduce seq {} on group {} flips ({})",
                         rank_, step_, bit, comm.seq(), comm.name(), formatFaultSpec(s)));
  }
}

StepHooks::StepHooks(Mesh& mesh, const std::vector<std::string>& names, const std::vector<int>& layers,
                     const std::vector<at::Tensor>& params, int modelLayers)
    : mesh_(mesh), recordingRequested_(*envOr("TPSCOPE_OUT", "") != '\0'), rules_([&] {
        std::string error;
        auto o = parseHealthOptions(envOr("TPSCOPE_HEALTH", ""), &error);
        if (!o) throw ConfigError("TPSCOPE_HEALTH: " + error);
        return *o;
      }()) {
  std::string error;
  auto specs = parseFaultList(envOr("TPSCOPE_INJECT", ""), &error);
  if (!specs) throw ConfigError("TPSCOPE_INJECT: " + error);
  for (auto& s : *specs) {
    if (std::string why = checkFaultSpec(s, mesh.worldSize(), modelLayers, mesh.pp()); !why.empty())
      throw ConfigError("TPSCOPE_INJECT: " + why);
    if (s.stage >= 0) s.rank = s.stage * mesh.tp() * mesh.dp();  // the stage's first rank (mesh.h's rank order)
  }
  for (const auto& s : *specs)
    // Pipeline stages hold other parameters: the rank the flip targets checks the name (its error stops the job).
    if (s.kind == FaultKind::Bitflip && s.rank == mesh.rank() && !s.tensor.empty() && s.tensor != kBitflipAllReduce &&
        std::find(names.begin(), names.end(), s.tensor) == names.end())
      throw ConfigError(fmt::format("TPSCOPE_INJECT '{}': the model has no parameter '{}' (its parameters: {}, ...; or "
                                    "tensor={})",
                                    formatFaultSpec(s), s.tensor, fmt::join(names.begin(), names.begin() + std::min<size_t>(4, names.size()), ", "),
                                    kBitflipAllReduce));
  auto mine = std::make_unique<FaultInjector>(*specs, mesh.rank());
  if (!mine->specs().empty()) {
    faults_ = std::move(mine);
    faults_->attachGradientHooks(names, layers, params);
    if (mesh.pp() > 1) faults_->spreadSlowOverPasses();
    FaultInjector* expected = nullptr;
    if (!g_faults.compare_exchange_strong(expected, faults_.get()))
      throw ConfigError("TPSCOPE_INJECT: another trainer in this process already injects faults");
  }
  opCheck_ = OpCheck::fromEnvironment(mesh.jobRank(), names, params);  // tpscope replay: named by the run's rank
  if (rules_.options().nonfinite == HealthPolicy::TraceOps && !opCheck_) {
    names_ = names;
    params_ = params;
  }
}

StepHooks::~StepHooks() {
  FaultInjector* mine = faults_.get();
  if (mine != nullptr) g_faults.compare_exchange_strong(mine, nullptr);
}

void StepHooks::stepBegin(int64_t step) {
  if (faults_) faults_->stepBegin(static_cast<int>(step));
  if (opCheck_) opCheck_->stepBegin(step);  // after the injected slow compute and crash: the step's own work
}

void StepHooks::stepEnd(int64_t step) {
  if (opCheck_) opCheck_->stepEnd(step);
}

bool StepHooks::wantsHealth() const {
  const auto& o = rules_.options();
  const bool gradRules = o.nonfinite != HealthPolicy::Off || o.gradSpike.policy != HealthPolicy::Off;
  return gradRules && (recordingRequested_ || o.needsAgreement());
}

bool StepHooks::beforeUpdate(int64_t step64, std::span<const probes::GradStat> grads, ActivationWatch* activations,
                             const at::Tensor& lossSum, int64_t microBatches, double gradNorm) {
  const int step = static_cast<int>(step64);
  const HealthOptions& o = rules_.options();
  // Nothing to tell anyone and nothing to act on. Decided from the environment (identical on every rank), never from
  // this rank's sink: the replica check below is a collective that every rank must enter or none.
  if (!(recordingRequested_ || o.needsAgreement())) return false;
  torch::NoGradGuard ng;
  StepAction action = StepAction::Continue;
  // A rank's gradients are a part of the model's (a pipeline stage) or of the batch's (a DP replica): its spikes are
  // judged against the whole model's norm after reduction, what the update is made of (anomalies.cpp, material()).
  // The batch's own loss tells a hard batch (its gradient jumps with it) from a gradient that jumped on its own.
  const double wholeModelNorm = gradNorm;
  const double localLoss = lossSum.defined() ? lossSum.detach().sum().item<double>() / std::max<int64_t>(1, microBatches)
                                             : std::numeric_limits<double>::quiet_NaN();
  if (!grads.empty()) action = std::max(action, rules_.checkGradients(step, grads, wholeModelNorm, localLoss));
  const std::optional<rules::ActivationFault> badOutput =
      activations != nullptr ? activations->firstNonFinite() : std::nullopt;
  if (badOutput) action = std::max(action, rules_.checkActivation(step, *badOutput));
  if (lossSum.defined()) action = std::max(action, rules_.checkLoss(step, localLoss));
  bool bad = badOutput.has_value() || (lossSum.defined() && !std::isfinite(localLoss));
  for (const auto& g : grads) bad = bad || g.nanCount > 0 || g.infCount > 0;
  if (bad) nonFiniteStep_ = step64;
  // trace-ops: a non-finite value on this rank arms the op check from the next step on (this rank's own: no collective).
  if (o.nonfinite == HealthPolicy::TraceOps && !opCheck_ && bad)
    opCheck_ = std::make_unique<OpCheck>(mesh_.rank(), step + 1, names_, params_, /*live=*/true, step);
  if (rules_.replicaCheckDue(step, mesh_.dp())) {
    // Reduced gradients are identical on every DP replica by construction: compare their global norms.
    at::Tensor mm = torch::tensor({gradNorm, -gradNorm}, torch::kDouble);
    static const Callsite kReplicaSite{"health check: DP replica gradient norms", -1};
    mesh_.dpGroup().allReduce(mm, ReduceOp::Max, kReplicaSite, probes::Phase::Optimizer);
    action = std::max(action, rules_.checkReplicas(step, -mm[1].item<double>(), mm[0].item<double>(), mesh_.dp()));
  }
  if (o.needsAgreement()) {
    at::Tensor flag = torch::tensor({static_cast<int64_t>(action)}, torch::kLong);
    static const Callsite kAgreeSite{"health policy: agree on skip/stop", -1};
    mesh_.world().allReduce(flag, ReduceOp::Max, kAgreeSite, probes::Phase::Optimizer);
    action = static_cast<StepAction>(flag.item<int64_t>());
  } else {
    action = StepAction::Continue;  // warn-only rules never act
  }
  const StepAction final = rules_.agree(step, action);
  if (final == StepAction::Stop) {
    if (probes::Sink* s = probes::sink()) s->flush();
    throw NonFiniteStop(fmt::format("rank {} step {}: every rank agreed to stop (health policy; alerts in the trace)",
                                    mesh_.rank(), step));
  }
  return final == StepAction::SkipStep;
}

}  // namespace tpscope::core
