// Internal (trainer.cpp): runs one step's pipeline schedule (pipeline_schedule.h) on this rank's model chunks.
//
// For each op of this stage, in order:
//   forward (micro-batch k, chunk c)   receive the input activation (not on virtual stage 0, which loads the tokens
//                                      and embeds them), run the chunk, keep (input, output) for the backward, send
//                                      the output on (not on the last virtual stage, which computes the loss and
//                                      adds it to the step's loss sum)
//   backward (k, c)                    receive the output's gradient (the last virtual stage starts from
//                                      loss × scale / m instead), backward through the chunk, send the input's
//                                      gradient back (not on virtual stage 0)
// Sends are posted asynchronously and waited for at the end of the step; receives block. Activations travel as
// fp32 with the shape [micro_batch, seq_len / tp with sequence parallelism, hidden].
// Spans: each pass is a compute span named "forward mb K" / "backward mb K" (" chunk C" added when
// virtual_stages > 1), phase fwd / bwd, around the chunk's compute only (the receive before it and the send after
// it are comm spans "recv" / "send wait"); the stage is the rank's (meta "pipeline"). docs/schema.md.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <memory>
#include <vector>

#include "tpscope/core/data.h"
#include "tpscope/core/gpt.h"
#include "tpscope/core/mesh.h"
#include "tpscope/rules/config.h"
#include "tpscope/rules/pipeline_schedule.h"

namespace tpscope::core {

class PipelineRunner {
 public:
  // Runs one chunk's forward under the trainer's autocast settings.
  using ForwardFn = std::function<at::Tensor(Gpt&, const at::Tensor& input, at::Tensor ids, at::Tensor targets)>;

  PipelineRunner(const rules::TrainConfig& cfg, Mesh& mesh, std::vector<Gpt> chunks, c10::Device device);
  // One step. `beforeLastBackward` runs just before this stage's last backward pass (the DP reducer arms its
  // hooks). Returns the sum of this stage's micro-batch losses ([1] fp32; zeros except on the last stage).
  at::Tensor run(int64_t step, const BatchSampler& sampler, double lossScale, const ForwardFn& forward,
                 const std::function<void(int microbatch)>& beforeForward,
                 const std::function<void()>& beforeLastBackward);
  rules::PipelineSchedule schedule() const noexcept { return kind_; }

 private:
  const rules::TrainConfig& cfg_;  // the trainer's copy: outlives the runner
  Mesh& mesh_;
  std::vector<Gpt> chunks_;
  c10::Device device_;
  rules::PipelineSchedule kind_;
  std::vector<rules::PipelineOp> ops_;  // this stage's
  int forwardPasses_ = 0;        // this stage's forward passes per step (m × its chunks)
  // Messages per step on each directed pair (src stage, dst stage): the schedule numbers them 1..n within a step,
  // the wire and the trace number them over the run (step k's message i is k·n + i), so (src, dst, seq) stays unique.
  std::map<std::pair<int, int>, uint64_t> perStep_;
  uint64_t stepsRun_ = 0;
  // Per micro-batch, the callsites of its activation and activation-gradient messages ("pipeline activation of
  // micro-batch K"): the trace's send/recv records say which micro-batch they carry, whatever the schedule.
  std::vector<std::string> siteNames_;
  std::vector<Callsite> actSites_, gradSites_;
};

}  // namespace tpscope::core
