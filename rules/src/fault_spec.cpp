#include "tpscope/rules/fault_spec.h"

#include <fmt/format.h>

#include "spec_numbers.h"

#include <charconv>
#include <cmath>
#include <map>

namespace tpscope::rules {

namespace {

struct KindInfo {
  FaultKind kind;
  std::string_view name;
  std::string_view usage;     // shown in errors
  std::string_view required;  // keys, comma-separated
  std::string_view optional;
};

// "rank" in `required` is met by rank=R or stage=S (exactly one of them).
constexpr KindInfo kKinds[] = {
    {FaultKind::Nan, "nan", "nan:rank=R|stage=S,step=S[,layer=L][,phase=fwd|bwd][,mb=K]", "rank,step",
     "layer,phase,mb"},
    {FaultKind::Inf, "inf", "inf:rank=R|stage=S,step=S[,layer=L][,phase=fwd|bwd][,mb=K]", "rank,step",
     "layer,phase,mb"},
    {FaultKind::Spike, "spike", "spike:rank=R|stage=S,step=S,factor=F", "rank,step,factor", ""},
    {FaultKind::Hang, "hang", "hang:rank=R|stage=S,step=S[,phase=fwd|bwd][,mb=K]", "rank,step", "phase,mb"},
    {FaultKind::Mismatch, "mismatch", "mismatch:rank=R|stage=S,step=S[,phase=fwd|bwd]", "rank,step", "phase"},
    {FaultKind::Slow, "slow", "slow:rank=R|stage=S,ms=M[,step=S]", "rank,ms", "step"},
    {FaultKind::Delay, "delay", "delay:rank=R|stage=S,ms=M", "rank,ms", ""},
    {FaultKind::Crash, "crash", "crash:rank=R|stage=S,step=S", "rank,step", ""},
    {FaultKind::Bitflip, "bitflip",
     "bitflip:rank=R|stage=S,step=S[,tensor=NAME|allreduce][,bit=B][,phase=fwd|bwd]", "rank,step",
     "tensor,bit,phase"},
};

const KindInfo& info(FaultKind kind) {
  for (const auto& k : kKinds)
    if (k.kind == kind) return k;
  return kKinds[0];
}

bool listHas(std::string_view list, std::string_view key) {
  while (!list.empty()) {
    const size_t comma = list.find(',');
    if (list.substr(0, comma) == key) return true;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}

std::string allKinds() {
  std::string out;
  for (const auto& k : kKinds) out += fmt::format("{}  {}", out.empty() ? "" : ",", k.usage);
  return out;
}

}  // namespace

namespace detail {

std::optional<int64_t> parseSpecInt(std::string_view v) {
  int64_t out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size() || v.empty()) return std::nullopt;
  return out;
}

std::optional<double> parseSpecReal(std::string_view v) {
  if (v.empty()) return std::nullopt;
  std::string s(v);
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(d)) return std::nullopt;
  return d;
}

}  // namespace detail

std::string_view faultKindName(FaultKind kind) { return info(kind).name; }

std::optional<FaultSpec> parseFaultSpec(std::string_view text, std::string* error) {
  auto fail = [&](const std::string& why) -> std::optional<FaultSpec> {
    if (error != nullptr) *error = fmt::format("--inject '{}': {}", text, why);
    return std::nullopt;
  };
  const size_t colon = text.find(':');
  const std::string_view kindText = text.substr(0, colon);
  const KindInfo* kind = nullptr;
  for (const auto& k : kKinds)
    if (k.name == kindText) kind = &k;
  if (kind == nullptr)
    return fail(fmt::format("unknown fault '{}'; expected one of:{}", kindText, allKinds()));
  if (colon == std::string_view::npos || colon + 1 == text.size())
    return fail(fmt::format("missing parameters ({})", kind->usage));

  FaultSpec spec;
  spec.kind = kind->kind;
  std::map<std::string, std::string, std::less<>> kv;
  std::string_view rest = text.substr(colon + 1);
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size())
      return fail(fmt::format("'{}' is not key=value ({})", item, kind->usage));
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    if (!listHas(kind->required, key) && !listHas(kind->optional, key) && key != "stage")
      return fail(fmt::format("unknown key '{}' for {} ({})", key, kind->name, kind->usage));
    if (!kv.emplace(std::string(key), std::string(value)).second)
      return fail(fmt::format("key '{}' given twice", key));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  if (kv.contains("rank") && kv.contains("stage"))
    return fail(fmt::format("give rank=R or stage=S, not both ({})", kind->usage));
  for (std::string_view req = kind->required; !req.empty();) {
    const size_t comma = req.find(',');
    const std::string_view key = req.substr(0, comma);
    if (!kv.contains(key) && !(key == "rank" && kv.contains("stage"))) {
      const std::string upper = key == "factor" ? "F" : key == "ms" ? "M" : key == "rank" ? "R" : "S";
      return fail(fmt::format("missing {}={} ({})", key, upper, kind->usage));
    }
    if (comma == std::string_view::npos) break;
    req.remove_prefix(comma + 1);
  }
  for (const auto& [key, value] : kv) {
    if (key == "tensor") {
      spec.tensor = value;
    } else if (key == "bit") {
      const auto n = detail::parseSpecInt(value);
      if (!n || *n < 0 || *n > 63) return fail(fmt::format("bit={} must be a bit index from 0 to 63", value));
      spec.bit = static_cast<int>(*n);
    } else if (key == "stage" || key == "mb") {
      const auto n = detail::parseSpecInt(value);
      if (!n || *n < 0 || *n > 1'000'000)
        return fail(fmt::format("{}={} must be {} >= 0", key, value, key == "stage" ? "a stage" : "a micro-batch"));
      (key == "stage" ? spec.stage : spec.microbatch) = static_cast<int>(*n);
    } else if (key == "rank" || key == "step" || key == "layer" || key == "ms") {
      const auto n = detail::parseSpecInt(value);
      if (!n) return fail(fmt::format("{}={} is not an integer", key, value));
      if (key == "rank") {
        if (*n < 0 || *n > 1'000'000) return fail(fmt::format("rank={} must be a rank >= 0", value));
        spec.rank = static_cast<int>(*n);
      } else if (key == "step") {
        if (*n < 1 || *n > 1'000'000'000) return fail(fmt::format("step={} must be a step >= 1 (steps count from 1)", value));
        spec.step = static_cast<int>(*n);
      } else if (key == "layer") {
        if (*n < 0 || *n > 1'000'000) return fail(fmt::format("layer={} must be a layer index >= 0", value));
        spec.layer = static_cast<int>(*n);
      } else {
        if (*n < 1 || *n > 3'600'000) return fail(fmt::format("ms={} must be between 1 and 3600000", value));
        spec.ms = *n;
      }
    } else if (key == "factor") {
      const auto f = detail::parseSpecReal(value);
      if (!f || *f <= 0) return fail(fmt::format("factor={} must be a finite number > 0", value));
      spec.factor = *f;
    } else if (key == "phase") {
      if (value == "fwd") spec.phase = FaultPhase::Forward;
      else if (value == "bwd") spec.phase = FaultPhase::Backward;
      else return fail(fmt::format("phase={} must be fwd or bwd", value));
    }
  }
  return spec;
}

std::optional<std::vector<FaultSpec>> parseFaultList(std::string_view text, std::string* error) {
  std::vector<FaultSpec> out;
  while (!text.empty()) {
    const size_t semi = text.find(';');
    const std::string_view item = text.substr(0, semi);
    if (!item.empty()) {
      auto spec = parseFaultSpec(item, error);
      if (!spec) return std::nullopt;
      out.push_back(*spec);
    }
    if (semi == std::string_view::npos) break;
    text.remove_prefix(semi + 1);
  }
  return out;
}

std::string formatFaultSpec(const FaultSpec& s) {
  std::string out = s.stage >= 0 ? fmt::format("{}:stage={}", faultKindName(s.kind), s.stage)
                                 : fmt::format("{}:rank={}", faultKindName(s.kind), s.rank);
  if (s.step >= 1) out += fmt::format(",step={}", s.step);
  if (s.layer >= 0) out += fmt::format(",layer={}", s.layer);
  if (s.kind == FaultKind::Spike) out += fmt::format(",factor={}", s.factor);
  if (s.kind == FaultKind::Slow || s.kind == FaultKind::Delay) out += fmt::format(",ms={}", s.ms);
  if (!s.tensor.empty()) out += fmt::format(",tensor={}", s.tensor);
  if (s.bit >= 0) out += fmt::format(",bit={}", s.bit);
  if (s.phase == FaultPhase::Forward) out += ",phase=fwd";
  if (s.phase == FaultPhase::Backward) out += ",phase=bwd";
  if (s.microbatch >= 0) out += fmt::format(",mb={}", s.microbatch);
  return out;
}

std::string formatFaultList(const std::vector<FaultSpec>& specs) {
  std::string out;
  for (const auto& s : specs) out += (out.empty() ? "" : ";") + formatFaultSpec(s);
  return out;
}

std::string checkFaultSpec(const FaultSpec& spec, int worldSize, int layers, int stages) {
  if (stages > 0 && spec.stage >= stages)
    return fmt::format("--inject '{}': stage {} does not exist in a pipeline of {} stages (stages 0-{})",
                       formatFaultSpec(spec), spec.stage, stages, stages - 1);
  if (stages == 1 && (spec.stage >= 0 || spec.microbatch >= 0))
    return fmt::format("--inject '{}': stage= and mb= place a fault in a pipeline; this run has none (--pp 1)",
                       formatFaultSpec(spec));
  if (spec.stage < 0 && spec.rank >= worldSize)
    return fmt::format("--inject '{}': rank {} does not exist in a job of {} ranks (ranks 0-{})",
                       formatFaultSpec(spec), spec.rank, worldSize, worldSize - 1);
  if (layers > 0 && spec.layer >= layers)
    return fmt::format("--inject '{}': layer {} does not exist in a model of {} layers (layers 0-{})",
                       formatFaultSpec(spec), spec.layer, layers, layers - 1);
  return {};
}

bool operator==(const FaultSpec& a, const FaultSpec& b) {
  return a.kind == b.kind && a.rank == b.rank && a.step == b.step && a.layer == b.layer && a.factor == b.factor &&
         a.ms == b.ms && a.phase == b.phase && a.tensor == b.tensor && a.bit == b.bit && a.stage == b.stage &&
         a.microbatch == b.microbatch;
}

}  // namespace tpscope::rules
