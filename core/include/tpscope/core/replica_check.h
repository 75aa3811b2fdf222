// Silent data corruption detection: fingerprints of the state that is bitwise identical on every rank of a group by
// construction, compared across the ranks (issue #15, part 1; docs/diagnosis.md#silent_corruption).
//
// Design: every rank fingerprints (fingerprint(), on the tensor's device) its replicated parameters after each
// optimizer step into a short local history, and every parameter at a check; a check all-gathers the fingerprints
// once and every rank runs the same vote on the same table (rules/replica_vote.h), so every rank takes the same
// stop decision without another collective. What is compared, and why, is at ReplicaTensor; when and at what cost,
// at ReplicaCheck.
//
// Threading: the training thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tpscope/rules/config.h"
#include "tpscope/rules/replica_vote.h"

namespace tpscope::core {

class Mesh;
class StepHooks;

// A 64-bit hash of a tensor's bits, computed where it lives (a contiguous CPU tensor in one host pass without
// temporaries, others with ATen operators on their device, no copy to the host): a 0-dim int64 tensor on `t`'s
// device. Any dtype of 1, 2, 4 or 8 bytes per element. The elements' bit patterns as integers x_i (sign-extended to
// int64), h = Σ x_i · c_(i mod 2^16) · r_(i div 2^16) in wrapping int64 arithmetic, with odd multipliers
// c_j = (2j+1)·K1 and r_k = (2k+1)·K2, then h·K3 + salt, the salt a host-side hash of the dtype and the shape. Every
// single-bit flip changes x_i by ±2^b, so h by ±2^b·(odd) ≠ 0 mod 2^64: a single-bit flip ALWAYS changes the
// fingerprint. Equal tensors have equal fingerprints; tensors of another dtype or shape differ by the salt.
at::Tensor fingerprint(const at::Tensor& t);
// The fingerprints of a fixed list of tensors (their shapes, dtypes and device fixed; their values read at each
// compute()), equal to fingerprint() of each: an int64 tensor [n] on their device. On the CPU each is one host pass.
// On an accelerator the tensors of at most 2^16 elements — a model's norms and biases — are hashed together, a few
// ATen operators for all of them (concatenated by dtype, one product and one segment sum) where fingerprint() takes
// about six each; larger ones one by one.
class FingerprintBatch {
 public:
  explicit FingerprintBatch(std::vector<at::Tensor> tensors);
  at::Tensor compute() const;
  size_t size() const { return tensors_.size(); }

 private:
  struct Group {                  // the small tensors of one dtype
    std::vector<size_t> members;  // indices into tensors_
    at::Tensor weights;           // the column multipliers of each member's elements, concatenated
    at::Tensor segment;           // each element's position among the small tensors (its member's)
  };
  std::vector<at::Tensor> tensors_;
  std::vector<Group> groups_;
  std::vector<size_t> large_;  // tensors hashed one by one
  at::Tensor smallIndex_;      // the positions of the small tensors in the result
  at::Tensor smallSalt_;       // their salts
  int64_t smallCount_ = 0;
};

// Flips bit `bit` (counted from the least significant bit of the element's bit pattern; taken modulo the element's
// width) of element `index` of `t` in place, on its device. Returns the bit flipped.
int flipBit(const at::Tensor& t, int64_t index, int bit);

// What is compared (the list and why, verified on real runs: tests/capture/sdc_test.cpp, docs/diagnosis.md):
//   - TP-replicated parameters (`replicated`: layer norms, row-parallel biases, the position embedding — everything
//     tpShardedParams does not list) after the optimizer step: identical on every rank of the world. Their inputs
//     are identical by construction: activations leave each TP all-reduce identical on every member, the
//     sequence-parallel gradients are summed by one all-reduce, the DP reduction is one all-reduce per replica
//     group, AdamW is elementwise, ZeRO-1 broadcasts the owner's update. Fingerprinted EVERY step into a local
//     history (replica.every steps deep) that dates a mismatch to the first step a rank disagreed.
//   - Every parameter (sharded ones included) at a check: identical on the DP replicas of one TP shard. With one
//     DP replica a sharded tensor has no copy: it is not fingerprinted (its column holds 0 on every rank).
//   - All-reduce results are witnessed through the state they produce (a flipped result on one rank changes that
//     rank's update): the loss all-reduce, which feeds no state, is not.
// Gradients are NOT compared: pre-reduction they differ by design, and reduction orders may differ in the last bit.
struct ReplicaTensor {
  std::string name;
  int layer = -1;
  at::Tensor tensor;
  bool replicated = false;  // identical on every rank of the world (else: on the DP replicas of its TP shard)
};

// A check (every `replica.every` steps, at every step that saves a checkpoint — so `replica=stop` stops before the
// corrupted state is written — and at the last step) costs one all-gather on the world group of the fingerprints
// (history + current: a few KB), host work on the gathered table only. Pipeline stages (PP > 1) hold different
// tensors: the copies that must agree are those of one stage (its TP x DP ranks), rows are padded to the widest
// stage's (the stages' counts are gathered once, at the first check), each stage votes on its own rows, and under
// `replica=stop` one MAX all-reduce of a flag makes every stage stop together. The check runs when the ranks record
// (TPSCOPE_OUT) or a policy can act, and the `replica` health policy is not off.
class ReplicaCheck {
 public:
  // `tensors`: the parameters in model order (identical names and order on every rank). `hooks`: the health options
  // and rules (policy `replica`, `replica.every`) and the fault injector (bitflip).
  ReplicaCheck(const rules::TrainConfig& config, Mesh& mesh, std::vector<ReplicaTensor> tensors, StepHooks& hooks);
  ~ReplicaCheck();

  // After the optimizer update of `step`, on every rank (a collective on check steps). Applies an injected
  // parameter bitflip of this step, records the history and, on a check step, compares. Throws NonFiniteStop on
  // every rank when a mismatch is found and the policy is stop.
  void afterStep(int64_t step);

  bool enabled() const { return enabled_; }
  bool checkDue(int64_t step) const;

 private:
  void check(int step);
  size_t paddedRowSize(size_t historySteps);
  c10::Device device() const;

  rules::TrainConfig config_;
  Mesh& mesh_;
  StepHooks& hooks_;
  std::vector<ReplicaTensor> tensors_;
  rules::FingerprintLayout layout_;  // this rank's pipeline stage (ranks counted from stageBase_)
  int stageBase_ = 0, stageSize_ = 1;
  std::vector<int64_t> stageCounts_;  // PP > 1: per global rank, its history tensors and tensors (from the first check)
  bool enabled_ = false;
  int every_ = 10;
  std::vector<at::Tensor> history_;  // one int64 [history tensors] per step since the last check
  std::unique_ptr<FingerprintBatch> historyBatch_;  // the replicated tensors (made at the first step)
  std::unique_ptr<FingerprintBatch> checkBatch_;    // the tensors a check compares (all, or with DP 1 the replicated)
  at::Tensor checkIndex_;                           // their indices among tensors_
  std::vector<int> historySteps_;
  int lastCheck_ = 0;
  bool reported_ = false;  // an incident was raised: the state stays diverged, later checks raise nothing more
};

}  // namespace tpscope::core
