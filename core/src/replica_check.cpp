#include "tpscope/core/replica_check.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>

#include "tpscope/core/communicator.h"
#include "tpscope/core/faults.h"
#include "tpscope/core/mesh.h"

namespace tpscope::core {

namespace probes = ::tpscope::probes;

namespace {

constexpr int64_t kChunk = int64_t{1} << 16;
constexpr uint64_t kColumnMul = 0x9E3779B97F4A7C15ull;  // odd
constexpr uint64_t kRowMul = 0xC2B2AE3D27D4EB4Full;     // odd
constexpr uint64_t kFinalMul = 0x94D049BB133111EBull;   // odd

int64_t asSigned(uint64_t v) { return static_cast<int64_t>(v); }

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// (2j+1)·k for j in [0, n): odd, distinct, in wrapping int64.
at::Tensor oddMultipliers(int64_t n, uint64_t k, const c10::Device& device) {
  return (torch::arange(n, torch::dtype(torch::kLong).device(device)) * 2 + 1) * asSigned(k);
}

// The column multipliers, made once per device.
const at::Tensor& columnMultipliers(const c10::Device& device) {
  static std::map<std::string, at::Tensor> cache;
  at::Tensor& m = cache[device.str()];
  if (!m.defined()) m = oddMultipliers(kChunk, kColumnMul, device);
  return m;
}

at::Tensor bitsAsLong(const at::Tensor& flat) {
  switch (flat.element_size()) {
    case 8: return flat.view(at::kLong);
    case 4: return flat.view(at::kInt).to(at::kLong);
    case 2: return flat.view(at::kShort).to(at::kLong);
    case 1: return flat.view(at::kChar).to(at::kLong);
    default: break;
  }
  TORCH_CHECK(false, "fingerprint: elements of ", flat.element_size(), " bytes are not supported");
}

at::ScalarType intTypeOfWidth(int64_t bytes) {
  switch (bytes) {
    case 8: return at::kLong;
    case 4: return at::kInt;
    case 2: return at::kShort;
    case 1: return at::kChar;
    default: break;
  }
  TORCH_CHECK(false, "flipBit: elements of ", bytes, " bytes are not supported");
}

}  // namespace

at::Tensor fingerprint(const at::Tensor& t) {
  at::NoGradGuard ng;
  at::Tensor src = t.detach();
  if (src.scalar_type() == at::kBool) src = src.view(at::kByte);
  const at::Tensor x = bitsAsLong(src.contiguous().reshape({-1}));
  const int64_t n = x.numel();
  const c10::Device device = x.device();
  const at::Tensor& col = columnMultipliers(device);
  const int64_t rows = n / kChunk, rem = n % kChunk;
  at::Tensor h = torch::zeros({}, torch::dtype(torch::kLong).device(device));
  if (rows > 0) {
    const at::Tensor perRow = (x.narrow(0, 0, rows * kChunk).view({rows, kChunk}) * col).sum(1);
    h = (perRow * oddMultipliers(rows, kRowMul, device)).sum();
  }
  if (rem > 0) {
    const uint64_t rowMul = (2 * static_cast<uint64_t>(rows) + 1) * kRowMul;
    h = h + (x.narrow(0, rows * kChunk, rem) * col.narrow(0, 0, rem)).sum() * asSigned(rowMul);
  }
  uint64_t salt = splitmix(static_cast<uint64_t>(t.scalar_type()) + 1);
  for (int64_t s : t.sizes()) salt = splitmix(salt ^ static_cast<uint64_t>(s));
  salt = splitmix(salt ^ static_cast<uint64_t>(t.dim()));
  return h * asSigned(kFinalMul) + asSigned(salt);
}

int flipBit(const at::Tensor& t, int64_t index, int bit) {
  at::NoGradGuard ng;
  TORCH_CHECK(t.is_contiguous(), "flipBit needs a contiguous tensor");
  TORCH_CHECK(index >= 0 && index < t.numel(), "flipBit: element ", index, " of a tensor of ", t.numel());
  const int64_t width = t.element_size() * 8;
  const int b = static_cast<int>(bit % width);
  at::Tensor e = t.detach().reshape({-1}).view(intTypeOfWidth(t.element_size())).narrow(0, index, 1);
  const uint64_t mask = uint64_t{1} << b;
  int64_t m = 0;
  switch (width) {
    case 64: m = static_cast<int64_t>(mask); break;
    case 32: m = static_cast<int32_t>(static_cast<uint32_t>(mask)); break;
    case 16: m = static_cast<int16_t>(static_cast<uint16_t>(mask)); break;
    default: m = static_cast<int8_t>(static_cast<uint8_t>(mask)); break;
  }
  e.bitwise_xor_(m);
  return b;
}

ReplicaCheck::ReplicaCheck(const rules::TrainConfig& config, Mesh& mesh, std::vector<ReplicaTensor> tensors,
                           StepHooks& hooks)
    : config_(config), mesh_(mesh), hooks_(hooks), tensors_(std::move(tensors)) {
  const rules::HealthOptions& o = hooks.rules().options();
  every_ = std::max(1, o.replicaEvery);
  enabled_ = mesh.worldSize() > 1 && o.replica != rules::HealthPolicy::Off && (hooks.recording() || o.needsAgreement());
  // The copies that must agree live on one pipeline stage (Mesh: rank = pp·tp·dp + dp·tp + tp): the layout is the
  // stage's, its ranks counted from the stage's first.
  stageSize_ = mesh.tp() * mesh.dp();
  stageBase_ = mesh.ppRank() * stageSize_;
  layout_.worldSize = stageSize_;
  for (int r = 0; r < stageSize_; ++r) layout_.tpRankOf.push_back(r % mesh.tp());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    layout_.names.push_back(tensors_[i].name);
    layout_.layers.push_back(tensors_[i].layer);
    layout_.replicated.push_back(tensors_[i].replicated);
    if (tensors_[i].replicated) layout_.historyTensors.push_back(i);
  }
}

ReplicaCheck::~ReplicaCheck() = default;

bool ReplicaCheck::checkDue(int64_t step) const {
  const bool saves = !config_.checkpoint_dir.empty() && config_.save_every > 0 && step % config_.save_every == 0;
  return step % every_ == 0 || saves || step == config_.steps;
}

void ReplicaCheck::afterStep(int64_t step64) {
  const int step = static_cast<int>(step64);
  if (FaultInjector* f = activeFaults()) {  // capture: --inject bitflip (a parameter)
    std::vector<std::string> names;
    std::vector<at::Tensor> params;
    std::vector<bool> replicated;
    if (f->has(rules::FaultKind::Bitflip)) {
      for (const auto& t : tensors_) {
        names.push_back(t.name);
        params.push_back(t.tensor);
        replicated.push_back(t.replicated);
      }
      f->flipParameterBit(names, params, replicated);
    }
  }
  if (!enabled_) return;
  TPS_SPAN("replica fingerprints", Other, Optimizer);
  std::vector<at::Tensor> h;
  for (size_t i : layout_.historyTensors) h.push_back(fingerprint(tensors_[i].tensor));
  const c10::Device device = tensors_.empty() ? c10::Device(c10::kCPU) : tensors_.front().tensor.device();
  history_.push_back(h.empty() ? torch::zeros({0}, torch::dtype(torch::kLong).device(device)) : torch::stack(h));
  historySteps_.push_back(step);
  if (checkDue(step)) {
    check(step);
  } else if (static_cast<int>(history_.size()) > every_) {
    history_.erase(history_.begin());
    historySteps_.erase(historySteps_.begin());
  }
}

// The widest row any rank sends with `historySteps` steps of history. Without pipeline stages every rank holds the
// same tensors; with them the stages' counts are gathered once, at the first check (a collective on every rank).
size_t ReplicaCheck::paddedRowSize(size_t historySteps) {
  if (mesh_.pp() == 1) return rules::fingerprintRowSize(layout_, historySteps);
  if (stageCounts_.empty()) {
    const c10::Device device = tensors_.empty() ? c10::Device(c10::kCPU) : tensors_.front().tensor.device();
    const at::Tensor mine = torch::tensor({static_cast<int64_t>(layout_.historyTensors.size()),
                                           static_cast<int64_t>(layout_.names.size())},
                                          torch::dtype(torch::kLong))
                                .to(device);
    static const Callsite kSite{"replica check: fingerprint counts per pipeline stage", -1};
    const at::Tensor all = mesh_.world().allGather(mine, 0, kSite, probes::Phase::Optimizer).to(at::kCPU).contiguous();
    stageCounts_.assign(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel());
  }
  size_t widest = 0;
  for (size_t r = 0; r + 1 < stageCounts_.size(); r += 2)
    widest = std::max(widest, historySteps * static_cast<size_t>(stageCounts_[r]) + static_cast<size_t>(stageCounts_[r + 1]));
  return widest;
}

void ReplicaCheck::check(int step) {
  std::vector<at::Tensor> parts(history_);
  std::vector<at::Tensor> now;
  for (const auto& t : tensors_) now.push_back(fingerprint(t.tensor));
  if (!now.empty()) parts.push_back(torch::stack(now));
  const at::Tensor row = torch::cat(parts);
  const size_t width = rules::fingerprintRowSize(layout_, historySteps_.size());
  TORCH_CHECK(static_cast<size_t>(row.numel()) == width, "replica check: ", row.numel(), " fingerprints, expected ",
              width);
  // One all-gather on the world. Pipeline stages hold other tensors (rows of other widths): every row is padded to
  // the widest stage's, and each rank reads its own stage's rows.
  const size_t padded = paddedRowSize(historySteps_.size());
  const at::Tensor sent = padded == width ? row : torch::cat({row, torch::zeros({static_cast<int64_t>(padded - width)}, row.options())});
  static const Callsite kSite{"replica check: fingerprints of replicated state", -1};
  const at::Tensor all = mesh_.world().allGather(sent, 0, kSite, probes::Phase::Optimizer).to(at::kCPU).contiguous();
  const int64_t* p = all.data_ptr<int64_t>() + static_cast<size_t>(stageBase_) * padded;
  std::vector<std::vector<int64_t>> rows(layout_.worldSize);
  for (int r = 0; r < layout_.worldSize; ++r) rows[r].assign(p + r * padded, p + r * padded + width);
  auto incident = rules::findSdcIncident(layout_, rows, historySteps_, step, lastCheck_);
  history_.clear();
  historySteps_.clear();
  lastCheck_ = step;
  if (incident) {  // the stage's ranks → global ranks
    for (int& r : incident->group) r += stageBase_;
    for (int& r : incident->vote.suspects) r += stageBase_;
  }
  rules::HealthRules& rules = hooks_.rules();
  const rules::HealthPolicy policy = rules.options().replica;
  // Each stage decides from its own rows; with a stop policy every stage must stop with the one that found it.
  bool stop = policy == rules::HealthPolicy::Stop && incident && !reported_;
  if (mesh_.pp() > 1 && policy == rules::HealthPolicy::Stop) {
    static const Callsite kStopSite{"replica check: stop decision across pipeline stages", -1};
    at::Tensor flag = torch::full({1}, stop ? 1 : 0, torch::dtype(torch::kLong).device(row.device()));
    mesh_.world().allReduce(flag, ReduceOp::Max, kStopSite, probes::Phase::Optimizer);
    if (flag.item<int64_t>() != 0 && !stop) {
      if (probes::Sink* s = probes::sink()) s->flush();
      throw NonFiniteStop(fmt::format("rank {} step {}: every rank stops on silent data corruption found on another "
                                      "pipeline stage", mesh_.rank(), step));
    }
  }
  if (!incident || reported_) return;
  reported_ = true;
  for (int s : incident->vote.suspects)
    if (s == mesh_.rank())
      rules.silentCorruption(incident->step, layout_.layers[incident->tensor], layout_.names[incident->tensor],
                             rules::describeSdcIncident(layout_, *incident),
                             rules::sdcEvidence(layout_, *incident, rules::healthPolicyName(policy)));
  if (stop) {  // every rank of the stage decides the same from the same table
    if (probes::Sink* s = probes::sink()) s->flush();
    throw NonFiniteStop(fmt::format("rank {} step {}: every rank stops on silent data corruption: {}", mesh_.rank(),
                                    step, rules::describeSdcIncident(layout_, *incident)));
  }
}

}  // namespace tpscope::core
