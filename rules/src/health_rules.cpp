#include "tpscope/rules/health_rules.h"

#include "tpscope/vocabulary/alert_kinds.h"
#include "tpscope/vocabulary/nonfinite_order.h"

#include <fmt/format.h>

#include "spec_numbers.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

namespace tpscope::rules {

namespace alert_kinds = vocabulary::alert_kinds;

namespace {

// The rule's thresholds as the shared spike test's (vocabulary/spike_baseline.h): factor is the ratio, mads the z.
vocabulary::SpikeTest spikeTest(const SpikeRule& rule) {
  vocabulary::SpikeTest t;
  t.ratio = rule.factor;
  t.zMin = rule.mads;
  t.minHistory = rule.warmup;
  return t;
}

vocabulary::SpikeVerdict isSpike(const SpikeRule& rule, const RobustBaseline& base, int step, double value) {
  if (rule.policy == HealthPolicy::Off) return {};
  return base.test(step, value, spikeTest(rule));
}

}  // namespace

std::string_view healthPolicyName(HealthPolicy policy) {
  switch (policy) {
    case HealthPolicy::Off: return "off";
    case HealthPolicy::Warn: return "warn";
    case HealthPolicy::SkipStep: return "skip-step";
    case HealthPolicy::Stop: return "stop";
    case HealthPolicy::TraceOps: return "trace-ops";
  }
  return "warn";
}

std::optional<HealthPolicy> parseHealthPolicy(std::string_view name) {
  if (name == "off") return HealthPolicy::Off;
  if (name == "warn") return HealthPolicy::Warn;
  if (name == "skip-step" || name == "skip_step" || name == "skip") return HealthPolicy::SkipStep;
  if (name == "stop") return HealthPolicy::Stop;
  if (name == "trace-ops" || name == "trace_ops") return HealthPolicy::TraceOps;
  return std::nullopt;
}

bool HealthOptions::needsAgreement() const {
  auto acts = [](HealthPolicy p) { return p == HealthPolicy::SkipStep || p == HealthPolicy::Stop; };
  return acts(nonfinite) || acts(gradSpike.policy) || acts(lossSpike.policy) || acts(replica);
}

std::optional<HealthOptions> parseHealthOptions(std::string_view text, std::string* error, const HealthOptions& base) {
  HealthOptions o = base;
  const std::string whole(text);
  auto fail = [&](const std::string& why) -> std::optional<HealthOptions> {
    if (error != nullptr) *error = fmt::format("--health '{}': {}", whole, why);
    return std::nullopt;
  };
  while (!text.empty()) {
    const size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) return fail(fmt::format("'{}' is not KEY=VALUE", item));
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    auto policy = [&](HealthPolicy& out, bool allowSkip) -> std::optional<std::string> {
      auto p = parseHealthPolicy(value);
      if (!p) return fmt::format("{}={}: expected off, warn, skip-step or stop", key, value);
      if (*p == HealthPolicy::TraceOps && key != "nonfinite")
        return fmt::format("{}={}: trace-ops is a policy of the non-finite rule only", key, value);
      if (!allowSkip && *p == HealthPolicy::SkipStep)
        return fmt::format("{}={}: this rule can only be off, warn or stop", key, value);
      out = *p;
      return std::nullopt;
    };
    auto number = [&](double lo, double hi) -> std::optional<double> {
      auto d = detail::parseSpecReal(value);
      if (!d || *d < lo || *d > hi) return std::nullopt;
      return d;
    };
    auto spikeKey = [&](SpikeRule& rule, std::string_view sub) -> std::optional<std::string> {
      if (sub == "factor" || sub == "mads") {
        auto d = number(0.0, 1e12);
        if (!d) return fmt::format("{}={}: expected a number >= 0", key, value);
        (sub == "factor" ? rule.factor : rule.mads) = *d;
      } else if (sub == "window" || sub == "warmup") {
        auto d = number(sub == "window" ? 1 : 0, 100000);
        if (!d || *d != std::floor(*d)) return fmt::format("{}={}: expected a whole number of steps", key, value);
        (sub == "window" ? rule.window : rule.warmup) = static_cast<int>(*d);
      } else {
        return fmt::format("unknown key '{}' (factor, mads, window, warmup)", key);
      }
      return std::nullopt;
    };
    std::optional<std::string> bad;
    if (key == "nonfinite") bad = policy(o.nonfinite, true);
    else if (key == "grad_spike") bad = policy(o.gradSpike.policy, true);
    else if (key == "loss_spike") bad = policy(o.lossSpike.policy, true);
    else if (key == "replica") bad = policy(o.replica, false);
    else if (key.starts_with("grad_spike.")) bad = spikeKey(o.gradSpike, key.substr(11));
    else if (key.starts_with("loss_spike.")) bad = spikeKey(o.lossSpike, key.substr(11));
    else if (key == "replica.every" || key == "skip_window" || key == "skip_max") {
      auto d = number(key == "skip_max" ? 0 : 1, 1e9);
      if (!d || *d != std::floor(*d)) bad = fmt::format("{}={}: expected a whole number", key, value);
      else (key == "replica.every" ? o.replicaEvery : key == "skip_window" ? o.skipWindow : o.skipMax) = static_cast<int>(*d);
    } else if (key == "replica.rtol") {
      auto d = number(0.0, 1.0);
      if (!d) bad = fmt::format("{}={}: expected a number in [0, 1]", key, value);
      else o.replicaRtol = *d;
    } else {
      bad = fmt::format("unknown key '{}' (nonfinite, grad_spike[.factor|.mads|.window|.warmup], loss_spike[...], "
                        "replica[.every|.rtol], skip_window, skip_max)", key);
    }
    if (bad) return fail(*bad);
  }
  return o;
}

std::string formatHealthOptions(const HealthOptions& o) {
  auto spike = [](std::string_view n, const SpikeRule& r) {
    return fmt::format("{}={},{}.factor={},{}.mads={},{}.window={},{}.warmup={}", n, healthPolicyName(r.policy), n,
                       r.factor, n, r.mads, n, r.window, n, r.warmup);
  };
  return fmt::format("nonfinite={},{},{},replica={},replica.every={},replica.rtol={},skip_window={},skip_max={}",
                     healthPolicyName(o.nonfinite), spike("grad_spike", o.gradSpike), spike("loss_spike", o.lossSpike),
                     healthPolicyName(o.replica), o.replicaEvery, o.replicaRtol, o.skipWindow, o.skipMax);
}

HealthRules::HealthRules(HealthOptions options)
    : options_(options),
      gradBase_(options.gradSpike.window, vocabulary::SpikeScale::Norm),
      lossBase_(options.lossSpike.window, vocabulary::SpikeScale::Level),
      wholeBase_(options.gradSpike.window, vocabulary::SpikeScale::Level) {}

bool HealthRules::startsBadRun(int& lastBadStep, int step) {
  pendingUnhealthy_ = true;
  const bool first = lastBadStep != step - 1;
  lastBadStep = step;
  return first;
}

StepAction HealthRules::actionOf(HealthPolicy policy) {
  switch (policy) {
    case HealthPolicy::SkipStep: return StepAction::SkipStep;
    case HealthPolicy::Stop: return StepAction::Stop;
    default: return StepAction::Continue;
  }
}

void HealthRules::raise(vocabulary::Severity severity, std::string_view kind, int step, int layer, std::string_view param,
                        const std::string& message, const std::string& evidence, uint64_t ticks) {
  ++alerts_;
  if (probes::Sink* s = probes::sink()) {
    probes::Alert a;
    a.severity = severity;
    a.kind = kind;
    a.step = step;
    a.layer = layer;
    a.param = param;
    a.message = message;
    a.evidence = evidence;
    a.ticks = ticks;
    s->alert(a);
  } else {
    std::fprintf(stderr, "tpscope health: %.*s step %d: %s %s\n", static_cast<int>(kind.size()), kind.data(), step,
                 message.c_str(), evidence.c_str());
  }
}

StepAction HealthRules::checkGradients(int step, std::span<const probes::GradStat> stats, double wholeModelNorm,
                                       double batchLoss) {
  StepAction action = StepAction::Continue;
  pendingGradNorm_.reset();
  pendingWholeNorm_.reset();
  if (std::isfinite(wholeModelNorm)) pendingWholeNorm_ = wholeModelNorm;
  double sumSq = 0;
  const probes::GradStat* first = nullptr;
  int affected = 0;
  int64_t nan = 0, inf = 0;
  for (const auto& g : stats) {
    sumSq += g.l2Norm * g.l2Norm;
    if (g.nanCount > 0 || g.infCount > 0) {
      ++affected;
      nan += g.nanCount;
      inf += g.infCount;
      // "first": the gradient the backward pass produced first (nonfinite_order.h, the analysis' definition too).
      if (first == nullptr || vocabulary::producedBefore(g.layer, first->layer)) first = &g;
    }
  }
  const double norm = std::sqrt(sumSq);
  if (first != nullptr) {
    const bool firstOfRun = startsBadRun(lastNonfiniteGradStep_, step);
    if (options_.nonfinite != HealthPolicy::Off && firstOfRun) {
      nlohmann::json ev{{"param", first->param},         {"layer", first->layer},
                        {"nan_count", first->nanCount}, {"inf_count", first->infCount},
                        {"numel", first->numel},        {"params_affected", affected},
                        {"nan_total", nan},             {"inf_total", inf},
                        {"policy", healthPolicyName(options_.nonfinite)}};
      raise(vocabulary::Severity::Critical, alert_kinds::kNonfiniteGrad, step, first->layer, first->param,
            fmt::format("non-finite gradient before reduction: {} ({} NaN, {} Inf in {} elements){}", first->param,
                        first->nanCount, first->infCount, first->numel,
                        affected > 1 ? fmt::format("; {} parameters affected", affected) : std::string()),
            ev.dump());
    }
    if (options_.nonfinite != HealthPolicy::Off) action = std::max(action, actionOf(options_.nonfinite));
    return action;
  }
  const vocabulary::SpikeVerdict v = isSpike(options_.gradSpike, gradBase_, step, norm);
  // A rank's spike that leaves the whole model's norm within its range (one stage's, one replica's, averaged away by
  // the reduction; a hard batch's, a few times the median) changes no update beyond what the run's own batches do:
  // not a fault (and, a spike, not the rank's baseline either). The analysis' materiality (anomalies.h).
  // A rank sees no peer: as the analysis where no TP peer saw the batch, the whole norm must also pass the largest
  // the run has shown by an order of magnitude (vocabulary::kRunRangeRatio).
  const bool wholeMoved = !pendingWholeNorm_ || wholeBase_.size() < options_.gradSpike.warmup ||
                          (*pendingWholeNorm_ >= kWholeModelSpikeRatio * wholeBase_.max() &&
                           *pendingWholeNorm_ >= vocabulary::kRunRangeRatio * wholeRunMax_);
  const bool hardBatch = std::isfinite(batchLoss) && lossBase_.size() >= options_.lossSpike.warmup &&
                         batchLoss > lossBase_.max();
  if (v.spike && !wholeMoved) return action;
  if (v.spike && hardBatch) {  // the batch's: not raised, and its norms (beyond the range) not learned
    pendingWholeNorm_.reset();
    return action;
  }
  if (v.spike) {
    pendingUnhealthy_ = true;
    const double ratio = v.baseline > 0 ? norm / v.baseline : 0.0;
    nlohmann::json ev{{"grad_norm", norm},
                      {"median", v.median},
                      {"mad_decades", v.mad},
                      {"baseline", v.baseline},
                      {"ratio", ratio},
                      {"z", v.z},
                      {"baseline_steps", gradBase_.size()},
                      {"factor", options_.gradSpike.factor},
                      {"policy", healthPolicyName(options_.gradSpike.policy)}};
    // The parameter with the largest norm is where the spike shows most.
    const probes::GradStat* top = nullptr;
    for (const auto& g : stats)
      if (top == nullptr || g.l2Norm > top->l2Norm) top = &g;
    if (top != nullptr) ev["top_param"] = top->param;
    // A rank sees neither its TP peers nor the steps after: it cannot tell a hard batch whose loss stays in range
    // from a gradient that jumped on its own (healthy TP runs showed both ranks' norms 36-107x, the reduced norm 10x
    // the run's largest). Under the warn policy the alert is a figure (info) and the analysis, which sees the peers
    // and the steps after, decides the finding; a policy that acts on it (skip-step, stop) makes it a warning.
    ev["batch_loss_known"] = std::isfinite(batchLoss);
    const auto severity =
        options_.gradSpike.policy != HealthPolicy::Warn ? vocabulary::Severity::Warning : vocabulary::Severity::Info;
    raise(severity, alert_kinds::kGradSpike, step, top != nullptr ? top->layer : -1,
          top != nullptr ? top->param : std::string_view(),
          fmt::format("gradient norm {:.4g} is {:.1f}x its baseline {:.4g} (the trend of the last {} healthy steps, "
                      "median {:.4g}; robust z {:.1f})",
                      norm, ratio, v.baseline, gradBase_.size(), v.median, v.z),
          ev.dump());
    action = std::max(action, actionOf(options_.gradSpike.policy));
  } else {
    pendingGradNorm_ = norm;
  }
  return action;
}

namespace {
std::string nonfiniteName(double v) {
  return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
}
}  // namespace

StepAction HealthRules::checkActivation(int step, const ActivationFault& fault) {
  const bool firstOfRun = startsBadRun(lastNonfiniteActStep_, step);
  if (options_.nonfinite == HealthPolicy::Off) return StepAction::Continue;
  if (!firstOfRun) return actionOf(options_.nonfinite);
  nlohmann::json ev{{"phase", std::string(probes::phaseName(probes::Phase::Forward))},
                    {"where", fault.where},
                    {"micro_batch", fault.microBatch},
                    {"value", nonfiniteName(fault.value)},
                    {std::isnan(fault.value) ? "nan_count" : "inf_count", 1},
                    {"policy", healthPolicyName(options_.nonfinite)}};
  raise(vocabulary::Severity::Critical, alert_kinds::kNonfiniteActivation, step, fault.layer, fault.where,
        fmt::format("{} is {} in the forward pass (micro-batch {}): the first non-finite output of this rank's step",
                    fault.where, nonfiniteName(fault.value), fault.microBatch),
        ev.dump(), fault.ticks);
  return actionOf(options_.nonfinite);
}

StepAction HealthRules::checkLoss(int step, double localLoss) {
  pendingLoss_.reset();
  if (!std::isfinite(localLoss)) {
    const bool firstOfRun = startsBadRun(lastNonfiniteLossStep_, step);
    if (options_.nonfinite == HealthPolicy::Off) return StepAction::Continue;
    // Already named by the forward output it came from (checkActivation this step), or a repeat of a bad run.
    if (!firstOfRun || lastNonfiniteActStep_ == step) return actionOf(options_.nonfinite);
    nlohmann::json ev{
        {"phase", std::string(probes::phaseName(probes::Phase::Forward))},
        {"loss", nonfiniteName(localLoss)},
        {"policy", healthPolicyName(options_.nonfinite)}};
    raise(vocabulary::Severity::Critical, alert_kinds::kNonfiniteActivation, step, -1, "loss",
          fmt::format("this rank's loss is {} before the DP reduction: the forward pass produced a non-finite value",
                      localLoss),
          ev.dump());
    return actionOf(options_.nonfinite);
  }
  const vocabulary::SpikeVerdict v = isSpike(options_.lossSpike, lossBase_, step, localLoss);
  if (v.spike) {
    pendingUnhealthy_ = true;
    nlohmann::json ev{{"loss", localLoss},
                      {"median", v.median},
                      {"mad", v.mad},
                      {"z", v.z},
                      {"baseline_steps", lossBase_.size()},
                      {"factor", options_.lossSpike.factor},
                      {"policy", healthPolicyName(options_.lossSpike.policy)}};
    raise(vocabulary::Severity::Warning, alert_kinds::kLossSpike, step, -1, "loss",
          fmt::format("loss {:.4g} is {:.1f}x the median {:.4g} of the last {} steps", localLoss,
                      v.median > 0 ? localLoss / v.median : 0.0, v.median, lossBase_.size()),
          ev.dump());
    return actionOf(options_.lossSpike.policy);
  }
  pendingLoss_ = localLoss;
  return StepAction::Continue;
}

bool HealthRules::replicaCheckDue(int step, int dpSize) const {
  return dpSize > 1 && options_.replica != HealthPolicy::Off && options_.replicaEvery > 0 &&
         step % options_.replicaEvery == 0;
}

StepAction HealthRules::checkReplicas(int step, double minNorm, double maxNorm, int dpSize) {
  if (options_.replica == HealthPolicy::Off || dpSize <= 1) return StepAction::Continue;
  if (!std::isfinite(minNorm) || !std::isfinite(maxNorm)) return StepAction::Continue;  // non-finite: own rule
  const double scale = std::max(std::fabs(maxNorm), std::fabs(minNorm));
  const double rel = scale > 0 ? (maxNorm - minNorm) / scale : 0.0;
  if (rel <= options_.replicaRtol) return StepAction::Continue;
  nlohmann::json ev{{"min_grad_norm", minNorm}, {"max_grad_norm", maxNorm}, {"relative_difference", rel},
                    {"rtol", options_.replicaRtol}, {"dp_size", dpSize},
                    {"policy", healthPolicyName(options_.replica)}};
  raise(vocabulary::Severity::Error, alert_kinds::kReplicaDivergence, step, -1, "",
        fmt::format("DP replicas disagree after the gradient reduction: grad norm {:.8g} vs {:.8g} (relative {:.2e})",
                    minNorm, maxNorm, rel),
        ev.dump());
  return actionOf(options_.replica);
}

StepAction HealthRules::silentCorruption(int step, int layer, std::string_view tensor, const std::string& message,
                                         const std::string& evidence) {
  if (options_.replica == HealthPolicy::Off) return StepAction::Continue;
  raise(vocabulary::Severity::Critical, alert_kinds::kSilentCorruption, step, layer, tensor, message, evidence);
  return actionOf(options_.replica);
}

StepAction HealthRules::agree(int step, StepAction agreed) {
  StepAction out = agreed;
  if (agreed == StepAction::SkipStep) {
    while (!skipped_.empty() && skipped_.front() <= step - options_.skipWindow) skipped_.pop_front();
    skipped_.push_back(step);
    if (static_cast<int>(skipped_.size()) > options_.skipMax) {
      out = StepAction::Stop;
      nlohmann::json ev{{"skipped_steps", std::vector<int>(skipped_.begin(), skipped_.end())},
                        {"skip_window", options_.skipWindow},
                        {"skip_max", options_.skipMax}};
      raise(vocabulary::Severity::Critical, alert_kinds::kTooManySkippedSteps, step, -1, "",
            fmt::format("{} steps skipped within {} steps (at most {} allowed): stopping", skipped_.size(),
                        options_.skipWindow, options_.skipMax),
            ev.dump());
    }
  }
  // Baselines learn only from steps that every rank found healthy and that were applied.
  if (agreed == StepAction::Continue && !pendingUnhealthy_) {
    if (pendingGradNorm_) gradBase_.add(*pendingGradNorm_, step);
    if (pendingLoss_) lossBase_.add(*pendingLoss_, step);
    if (pendingWholeNorm_) {
      wholeBase_.add(*pendingWholeNorm_, step);
      wholeRunMax_ = std::max(wholeRunMax_, *pendingWholeNorm_);
    }
  }
  pendingWholeNorm_.reset();
  pendingGradNorm_.reset();
  pendingLoss_.reset();
  pendingUnhealthy_ = false;
  return out;
}

}  // namespace tpscope::rules
