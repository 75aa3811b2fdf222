// Forward-pass health: which output of this rank's forward pass first turned non-finite, and when.
//
// The model notes each stage's output while it runs forward (the embedding output, every transformer layer's output,
// the output logits), and at TP > 1 each rank's partial sums before the collective that adds them (the embedding's
// rows, each row-parallel layer's products: activeActivationWatch below). A note keeps the output's sum — one fast
// reduction, no host sync: a NaN or ±Inf anywhere in the output makes its sum non-finite — with the time it was
// produced and the micro-batch. After the step's last backward, `firstNonFinite` reads every sum back in one host sync
// and returns the first non-finite one in forward order. The time is what lets the diagnosis tell the rank that
// produced a NaN (layer L's output on that rank) from the ranks it reached through the next all-reduce (layer L+1's
// output there, produced later).
//
// Threading: the training thread only. Cost: a sum over each noted output (~1/ (24 · hidden) of the layer's FLOPs).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tpscope/rules/health_rules.h"

namespace tpscope::core {

class ActivationWatch;

// The watch of the forward pass running on this thread, or null: Gpt sets it while it runs its embedding and layers
// (ActivationWatchScope), so that a tensor-parallel layer also notes its own partial sums before the collective that
// adds the other ranks' — where a value born inside a layer is still this rank's alone. Not set during backward (an
// activation-checkpointed layer's recompute notes nothing).
ActivationWatch* activeActivationWatch();
class ActivationWatchScope {
 public:
  explicit ActivationWatchScope(ActivationWatch* watch);
  ~ActivationWatchScope();
  ActivationWatchScope(const ActivationWatchScope&) = delete;
  ActivationWatchScope& operator=(const ActivationWatchScope&) = delete;

 private:
  ActivationWatch* previous_;
};

class ActivationWatch {
 public:
  // Start of a step: forget the last one's notes.
  void beginStep();
  // Before each micro-batch's forward pass (numbered from 0).
  void setMicroBatch(int microBatch) { microBatch_ = microBatch; }
  // The forward pass produced `output`, the output of `where` (transformer layer `layer`, or -1 outside the layers).
  // `where` must outlive the step (a string literal or a member of the model).
  void note(const at::Tensor& output, int layer, const std::string* where);
  // The first non-finite output of the step in forward order (micro-batch by micro-batch), or nullopt. One host sync.
  std::optional<rules::ActivationFault> firstNonFinite();

 private:
  struct Note {
    at::Tensor sum;  // fp32 scalar on the output's device
    int layer;
    const std::string* where;
    int microBatch;
    uint64_t ticks;
  };
  std::vector<Note> notes_;
  int microBatch_ = 0;
};

}  // namespace tpscope::core
