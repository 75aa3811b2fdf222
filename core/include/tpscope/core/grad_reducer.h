// GradReducer: data-parallel gradient all-reduce in buckets, overlapped with the backward pass.
//
// Parameters are grouped into buckets of ~bucket_bytes in REVERSE registration order (roughly the order backward
// produces their gradients). During the last micro-batch's backward a hook on each parameter copies its gradient
// (plus what earlier micro-batches accumulated in .grad) into the bucket's flat fp32 buffer; when a bucket is full
// its async all-reduce is launched over the DP group while backward continues. `late` parameters (used twice, e.g.
// the tied embedding) only have a complete gradient after backward and are reduced in `finish`.
// `finish` launches what is left, waits, divides by dp and writes the mean back into each .grad.
// Gradient health is captured per bucket BEFORE its all-reduce (so a NaN stays attributed to its rank).
// All DP ranks launch buckets in the same order because their autograd graphs are identical.
// Threading: hooks run on the thread that calls backward (CPU autograd); one training thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "tpscope/core/communicator.h"
#include "tpscope/core/grad_health.h"

namespace tpscope::core {

class GradReducer {
 public:
  GradReducer(std::vector<at::Tensor> params, std::vector<bool> late, Communicator& dp, double bucketBytes,
              bool overlap);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Call before the last micro-batch's backward. `captureHealth`: record gradient health before reducing.
  void beginLastMicrobatch(bool captureHealth);
  // Call after the last backward. Returns gradient health in parameter order when captured (else undefined).
  GradHealthStats finish();
  size_t bucketCount() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpscope::core
