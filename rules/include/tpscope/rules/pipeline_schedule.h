// Pipeline schedules: the order in which one pipeline stage runs the forward and backward passes of its
// micro-batches, and where each pass's input comes from and its output goes. Torch-free: the trainer executes it,
// the tests simulate it.
//
// Stages s = 0 .. p-1; with `v` model chunks per stage (interleaved 1F1B) the model is cut into p·v virtual stages,
// virtual stage = chunk · p + s, so chunk c of stage p-1 feeds chunk c+1 of stage 0. A forward pass of (micro-batch,
// chunk) receives its input activation from the previous virtual stage (none on virtual stage 0: it embeds the
// tokens) and sends its output to the next (none on the last: it computes the loss). A backward pass receives the
// gradient of its output from the next virtual stage and sends the gradient of its input to the previous one.
//
// Messages: sends never block the sender (they are posted and waited for at the end of the step); receives block.
// Every message carries the sequence number of its directed pair (src stage -> dst stage) within the step, 1-based,
// counted in the SENDER's order; the receiver knows it from the schedule (every stage builds every stage's list), so
// (src, dst, seq) names one message on both sides. The trainer numbers over the run (step k's message i of a pair
// with n per step is k·n + i): that is the Gloo tag that matches the two sides and the seq in the trace.
//
// Schedules (Megatron-LM's):
//   gpipe        every forward, then every backward (micro-batch order).
//   1f1b         p-s-1 warm-up forwards, then one forward + one backward in turn, then the cool-down backwards.
//   interleaved  1F1B over m·v (micro-batch, chunk) passes: forward k runs chunk (k mod p·v) / p of micro-batch
//                (k / p·v)·p + k mod p; backward k the chunks in reverse; warm-up (p-s-1)·2 + (v-1)·p passes
//                (all of them when m = p). Needs m divisible by p.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tpscope::rules {

enum class PipelineSchedule { GPipe, OneFOneB, Interleaved };

// "gpipe", "1f1b", "interleaved" -> the schedule; throws ConfigError otherwise.
PipelineSchedule parsePipelineSchedule(const std::string& name);
const char* pipelineScheduleName(PipelineSchedule s) noexcept;

struct PipelineOp {
  bool forward = true;
  int microbatch = 0;
  int chunk = 0;
  int recvFrom = -1;     // stage the input comes from (-1: none)
  uint64_t recvSeq = 0;  // its sequence number on the pair (recvFrom -> this stage)
  int sendTo = -1;       // stage the output goes to (-1: none)
  uint64_t sendSeq = 0;  // its sequence number on the pair (this stage -> sendTo)
};

// The ops of every stage, in execution order: result[s] is stage s's list (2 · m · v ops).
std::vector<std::vector<PipelineOp>> buildPipelineSchedule(PipelineSchedule kind, int stages, int microbatches,
                                                           int chunks);

// The schedule's idle fraction of a step on balanced stages (forward and backward times equal on every stage,
// communication free): (p-1)/(m+p-1) for gpipe and 1f1b; (p-1)/(v·m+p-1) for interleaved — Megatron's
// (p-1)/(v·m) bubble-to-compute ratio expressed as a fraction of the step, like the other two.
double analyticBubbleFraction(PipelineSchedule kind, int stages, int microbatches, int chunks);

// Runs the schedule on a model clock: each pass of virtual stage vs takes fwd[vs] / bwd[vs], messages arrive when
// they are sent, a receive waits for its message. Returns per stage the begin/end of each op (same order as the
// schedule); throws std::logic_error if the schedule deadlocks (a receive whose message is never sent).
struct SimulatedOp {
  double begin = 0, end = 0;
};
std::vector<std::vector<SimulatedOp>> simulatePipeline(const std::vector<std::vector<PipelineOp>>& schedule,
                                                       const std::vector<double>& fwd,
                                                       const std::vector<double>& bwd);

}  // namespace tpscope::rules
