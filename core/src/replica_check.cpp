#include "tpscope/core/replica_check.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <type_traits>

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

// Calls f(Int{}) with the signed integer type of an element `bytes` wide: its bits, as fingerprint() and flipBit()
// read them.
template <typename F>
decltype(auto) withIntOfWidth(int64_t bytes, const char* who, F&& f) {
  switch (bytes) {
    case 8:
      return f(int64_t{});
    case 4:
      return f(int32_t{});
    case 2:
      return f(int16_t{});
    case 1:
      return f(int8_t{});
    default: break;
  }
  TORCH_CHECK(false, who, ": elements of ", bytes, " bytes are not supported");
}

at::ScalarType intTypeOfWidth(int64_t bytes, const char* who) {
  return withIntOfWidth(bytes, who, [](auto v) { return c10::CppTypeToScalarType<decltype(v)>::value; });
}

// The elements' bit patterns as int64, sign-extended.
at::Tensor bitsAsLong(const at::Tensor& flat) {
  return flat.view(intTypeOfWidth(flat.element_size(), "fingerprint")).to(at::kLong);
}

uint64_t saltOf(const at::Tensor& t) {
  uint64_t salt = splitmix(static_cast<uint64_t>(t.scalar_type()) + 1);
  for (int64_t s : t.sizes()) salt = splitmix(salt ^ static_cast<uint64_t>(s));
  return splitmix(salt ^ static_cast<uint64_t>(t.dim()));
}

// fingerprint()'s formula on the host, in one pass over the elements' bits (`x`: n elements of `Int`, sign-extended).
template <typename Int>
uint64_t hostSum(const Int* x, int64_t n) {
  uint64_t h = 0;
  for (int64_t row = 0; row * kChunk < n; ++row) {
    const int64_t end = std::min(n, (row + 1) * kChunk);
    uint64_t sum = 0, col = kColumnMul;  // c_j = (2j+1)·K1: K1, then + 2·K1 per element
    for (int64_t i = row * kChunk; i < end; ++i, col += 2 * kColumnMul)
      sum += static_cast<uint64_t>(static_cast<int64_t>(x[i])) * col;
    h += sum * ((2 * static_cast<uint64_t>(row) + 1) * kRowMul);
  }
  return h;
}

// The fingerprint of a contiguous CPU tensor, computed on the host (wrapping uint64 arithmetic is int64's).
int64_t hostFingerprint(const at::Tensor& t) {
  const void* p = t.data_ptr();
  const int64_t n = t.numel();
  const uint64_t h = withIntOfWidth(t.element_size(), "fingerprint",
                                    [&](auto v) { return hostSum(static_cast<const decltype(v)*>(p), n); });
  return asSigned(h * kFinalMul + saltOf(t));
}

bool onHost(const at::Tensor& t) {
  return t.device().is_cpu() && t.is_contiguous() && !t.is_conj() && !t.is_neg();
}

}  // namespace

at::Tensor fingerprint(const at::Tensor& t) {
  at::NoGradGuard ng;
  if (onHost(t)) return torch::scalar_tensor(hostFingerprint(t), torch::kLong);  // one pass, no temporaries
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
  return h * asSigned(kFinalMul) + asSigned(saltOf(t));
}

FingerprintBatch::FingerprintBatch(std::vector<at::Tensor> tensors) : tensors_(std::move(tensors)) {
  at::NoGradGuard ng;
  if (tensors_.empty()) return;
  const c10::Device device = tensors_.front().device();
  const auto longs = torch::dtype(torch::kLong);
  std::map<at::ScalarType, size_t> groupOf;
  std::vector<int64_t> smallIndex, salts;
  std::vector<std::vector<int64_t>> segments;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const at::Tensor& t = tensors_[i];
    TORCH_CHECK(t.device() == device, "FingerprintBatch: tensors on ", device, " and ", t.device());
    if (t.numel() > kChunk) {
      large_.push_back(i);
      continue;
    }
    auto [it, added] = groupOf.emplace(t.scalar_type(), groups_.size());
    if (added) {
      groups_.emplace_back();
      segments.emplace_back();
    }
    groups_[it->second].members.push_back(i);
    segments[it->second].insert(segments[it->second].end(), static_cast<size_t>(t.numel()),
                                static_cast<int64_t>(smallIndex.size()));
    smallIndex.push_back(static_cast<int64_t>(i));
    salts.push_back(asSigned(saltOf(t)));
  }
  const at::Tensor& col = columnMultipliers(device);
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::vector<at::Tensor> w;
    for (size_t i : groups_[g].members) w.push_back(col.narrow(0, 0, tensors_[i].numel()));
    groups_[g].weights = torch::cat(w);
    groups_[g].segment = torch::tensor(segments[g], longs).to(device);
  }
  smallCount_ = static_cast<int64_t>(smallIndex.size());
  smallIndex_ = torch::tensor(smallIndex, longs).to(device);
  smallSalt_ = torch::tensor(salts, longs).to(device);
}

at::Tensor FingerprintBatch::compute() const {
  at::NoGradGuard ng;
  const c10::Device device = tensors_.empty() ? c10::Device(c10::kCPU) : tensors_.front().device();
  if (device.is_cpu() && std::all_of(tensors_.begin(), tensors_.end(), onHost)) {
    at::Tensor out = torch::empty({static_cast<int64_t>(tensors_.size())}, torch::kLong);
    int64_t* h = out.data_ptr<int64_t>();
    for (size_t i = 0; i < tensors_.size(); ++i) h[i] = hostFingerprint(tensors_[i]);
    return out;
  }
  at::Tensor out = torch::zeros({static_cast<int64_t>(tensors_.size())}, torch::dtype(torch::kLong).device(device));
  if (smallCount_ > 0) {
    // A tensor of at most 2^16 elements has one row: h = Σ x_i·c_i · r_0, as fingerprint() computes it.
    at::Tensor sums = torch::zeros({smallCount_}, out.options());
    for (const Group& g : groups_) {
      std::vector<at::Tensor> flat;
      for (size_t i : g.members) flat.push_back(tensors_[i].detach().reshape({-1}));
      at::Tensor bits = torch::cat(flat);
      if (bits.scalar_type() == at::kBool) bits = bits.view(at::kByte);
      sums.index_add_(0, g.segment, bitsAsLong(bits) * g.weights);
    }
    out.index_copy_(0, smallIndex_, sums * asSigned(kRowMul * kFinalMul) + smallSalt_);
  }
  for (size_t i : large_) out[static_cast<int64_t>(i)] = fingerprint(tensors_[i]);
  return out;
}

int flipBit(const at::Tensor& t, int64_t index, int bit) {
  at::NoGradGuard ng;
  TORCH_CHECK(t.is_contiguous(), "flipBit needs a contiguous tensor");
  TORCH_CHECK(index >= 0 && index < t.numel(), "flipBit: element ", index, " of a tensor of ", t.numel());
  const int64_t width = t.element_size() * 8;
  const int b = static_cast<int>(bit % width);
  at::Tensor e = t.detach().reshape({-1}).view(intTypeOfWidth(t.element_size(), "flipBit")).narrow(0, index, 1);
  const uint64_t mask = uint64_t{1} << b;
  const int64_t m = withIntOfWidth(t.element_size(), "flipBit", [&](auto v) {  // the mask as an element of that width
    using Int = decltype(v);
    return static_cast<int64_t>(static_cast<Int>(static_cast<std::make_unsigned_t<Int>>(mask)));
  });
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

c10::Device ReplicaCheck::device() const {
  return tensors_.empty() ? c10::Device(c10::kCPU) : tensors_.front().tensor.device();
}

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
  if (!historyBatch_) {
    std::vector<at::Tensor> replicated, checked;
    std::vector<int64_t> checkedIndex;
    for (size_t i : layout_.historyTensors) replicated.push_back(tensors_[i].tensor);
    // A sharded tensor is compared on the DP replicas of its shard: with one replica it has no copy to agree with.
    for (size_t i = 0; i < tensors_.size(); ++i)
      if (mesh_.dp() > 1 || tensors_[i].replicated) {
        checked.push_back(tensors_[i].tensor);
        checkedIndex.push_back(static_cast<int64_t>(i));
      }
    historyBatch_ = std::make_unique<FingerprintBatch>(std::move(replicated));
    checkBatch_ = std::make_unique<FingerprintBatch>(std::move(checked));
    checkIndex_ = torch::tensor(checkedIndex, torch::kLong).to(device());
  }
  history_.push_back(historyBatch_->compute());
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
    const at::Tensor mine =
        torch::tensor({static_cast<int64_t>(layout_.historyTensors.size()), static_cast<int64_t>(layout_.names.size())},
                      torch::dtype(torch::kLong))
            .to(device());
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
  // Every tensor's column; those with no copy to compare (sharded, one DP replica) hold 0 on every rank.
  at::Tensor now = checkBatch_->compute();
  if (checkBatch_->size() != tensors_.size())
    now = torch::zeros({static_cast<int64_t>(tensors_.size())}, now.options()).index_copy_(0, checkIndex_, now);
  parts.push_back(now);
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
