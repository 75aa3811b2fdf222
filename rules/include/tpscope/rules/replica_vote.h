// Silent data corruption: which rank's copy of replicated state disagrees, and since when — the LibTorch-free part
// of the replica check (core's replica_check.h computes and gathers the fingerprints; this decides from them).
//
// Every rank fingerprints (64-bit hash) each parameter tensor after the optimizer step. Two kinds of tensor:
//   replicated  identical on every rank of the world by construction (TP-replicated AND DP-replicated: layer norms,
//               row-parallel biases, the position embedding): fingerprinted every step into a short local history,
//               compared over the whole world.
//   sharded     identical only on the DP replicas of one TP shard (the ranks with the same TP rank): fingerprinted at
//               the check step only, compared within each DP group.
// The incident is the earliest disagreement: the first history step where some replicated tensor disagrees (exact
// step), else the first sharded tensor (in model order) that disagrees at the check (between the previous check and
// this one). Within the copies that must agree, the majority value is the reference: the ranks holding another value
// are the suspects. Without a strict majority (two copies, or an even split) every holder of a value that is not
// the strict majority is a suspect — both ranks of a pair — and `majority` is false.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace tpscope::rules {

// The vote of the copies that must agree: `values[i]` is held by rank `members[i]`.
struct ReplicaVote {
  bool agree = true;
  bool majority = false;      // a value held by more than half of the copies
  std::vector<int> suspects;  // ranks (from `members`) whose value is not the strict majority's; all when none
  int64_t majorityValue = 0;  // the strict majority's value (when `majority`)
};
ReplicaVote voteReplicas(std::span<const int64_t> values, std::span<const int> members);

struct FingerprintLayout {
  int worldSize = 1;
  std::vector<int> tpRankOf;           // per global rank
  std::vector<std::string> names;      // per tensor (model order)
  std::vector<int> layers;             // per tensor; -1 outside the transformer layers
  std::vector<bool> replicated;        // per tensor
  std::vector<size_t> historyTensors;  // the indices of the replicated tensors, in order (the history's columns)
};

// What one rank contributes to a check: the history (one row of historyTensors.size() fingerprints per step in
// `historySteps`, oldest first), then the fingerprint of every tensor at the check step.
// Size: historySteps.size() * historyTensors.size() + names.size().
size_t fingerprintRowSize(const FingerprintLayout& layout, size_t historySteps);

struct SdcIncident {
  int step = -1;           // the first step whose state disagrees (exact for replicated tensors)
  int earliestStep = -1;   // the earliest step it can have happened at (== step when dated by the history)
  int checkStep = -1;      // the check that found it
  size_t tensor = 0;       // index into the layout's names
  bool replicatedTensor = false;
  std::vector<int> group;  // the ranks whose copies must agree
  ReplicaVote vote;
  int tensorsDisagreeing = 0;  // at that step
  std::vector<int64_t> values;  // per member of `group`
};

// `rows[r]`: the row of global rank r (fingerprintRowSize each). `lastCheckStep`: the previous check (0: none).
std::optional<SdcIncident> findSdcIncident(const FingerprintLayout& layout, const std::vector<std::vector<int64_t>>& rows,
                                           const std::vector<int>& historySteps, int checkStep, int lastCheckStep);

// One line for the alert: "rank 2's copy of layers.1.ln1.weight (layer 1) disagrees with the 3 other copies ...".
std::string describeSdcIncident(const FingerprintLayout& layout, const SdcIncident& incident);
// The alert's evidence (JSON object): tensor, layer, suspects, majority, group, copies, first_step, earliest_step,
// check_step, tensors_disagreeing, fingerprints (hex, per member of the group), policy.
std::string sdcEvidence(const FingerprintLayout& layout, const SdcIncident& incident, std::string_view policy);

}  // namespace tpscope::rules
