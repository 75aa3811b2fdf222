// The replay's op-level check (`tpscope replay`, docs/cli.md "replay"): during one step, every ATen operator's outputs
// and every collective's result are checked for NaN and +Inf (−Inf alone is how attention masks are written: it is
// counted, never reported), and the first such value on this rank is described — the
// operator (ATen name, forward or backward, the backward function autograd was running, the span it ran in and the
// layer), the micro-batch, and each input's statistics (finite?, max |x|, which input first carried it, which
// parameter an input is). It goes to the recorder as one alert of kind `op_check` (evidence: JSON, below); a step
// with no non-finite value gives one `op_check_clean` alert with the number of operators checked. Live (health
// policy --on-nonfinite trace-ops, StepHooks): armed from the step after a non-finite alert on the rank, every step,
// until it has named an operator (evidence live = true, after_step: the alert's step); no clean alerts.
//
// Design: a global RecordFunction callback (ATen's observer API, the one the PyTorch profiler uses) with inputs and
// outputs, on operators (FUNCTION) and autograd's backward functions (BACKWARD_FUNCTION), registered for the armed
// step only: outside it the engine runs as always. The checks call ATen with RecordFunction disabled (no recursion).
// The span the operator runs in comes from the probes' range hooks (probes.h), chained to the NVTX mirror when it
// is installed. A backward function is placed by the forward operator of the same sequence number (the profiler's
// forward/backward link). Outputs of c10d's dispatcher ops are not checked when the op returns (the transfer may
// still be in flight); the communicator reports each result once it has landed (collectiveResult).
//
// Threading: the training thread and autograd's (CPU backward runs on the caller's thread); one step at a time.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

namespace tpscope::core {

class OpCheck {
 public:
  // TPSCOPE_REPLAY_STEP=S (set by `tpscope replay`): a check armed at step S; null when unset. Throws ConfigError on a
  // value that is not a positive step. `names`/`params`: the model's parameters (an input that is one is named).
  static std::unique_ptr<OpCheck> fromEnvironment(int rank, const std::vector<std::string>& names,
                                                  const std::vector<at::Tensor>& params);
  // `step`: the step checked; `live`: that step and every one after it until an operator is named, and `afterStep`
  // the step whose alert started it.
  OpCheck(int rank, int step, const std::vector<std::string>& names, const std::vector<at::Tensor>& params,
          bool live = false, int afterStep = -1);
  ~OpCheck();
  OpCheck(const OpCheck&) = delete;
  OpCheck& operator=(const OpCheck&) = delete;

  int step() const { return step_; }
  bool armed() const { return armed_; }
  bool live() const { return live_; }
  bool done() const { return done_; }
  // Trainer: the start and the end of every step. Arms at the check's step; at its end, disarms and sends the alert.
  void stepBegin(int64_t step);
  void stepEnd(int64_t step);
  // The micro-batch whose passes run now (-1: none).
  void setMicrobatch(int microbatch) { microbatch_ = microbatch; }
  // Communicator: a collective's result has landed in `result` (`what`: "tp-0 all_reduce seq 31: <callsite>").
  void collectiveResult(const std::string& what, const at::Tensor& result);

  // What the check found, for the alert and for tests. `found` false: the step ran clean.
  struct Report {
    bool found = false;
    std::string op;          // "aten::fill_", or "collective" (a result arrived non-finite)
    std::string pass;        // "forward", "backward", "optimizer", "data", "step"
    std::string backwardFn;  // the backward function autograd was running ("MmBackward0"), or ""
    std::string span;        // "layer 1 mlp forward", "after layer 1 mlp forward", ...
    int layer = -1;
    int microbatch = -1;
    bool produced = false;     // every input finite: this op made the value; false: it arrived in input `carrier`
    int carrier = -1;          // the first non-finite input, -1 when produced
    std::string carrierParam;  // the parameter that input is, if any
    std::string collective;    // op == "collective": which one
    std::string inputs;        // JSON array: [{"index","kind","dtype","shape","finite","nan","inf","max_abs","param"}]
    int64_t outputNan = 0, outputInf = 0;
    int64_t opsChecked = 0;
  };
  const Report& report() const { return report_; }

  struct State;  // the callbacks' view

 private:
  void arm();
  void disarm();
  void sendAlert(int step) const;

  int rank_;
  int step_;
  bool live_ = false;
  int afterStep_ = -1;
  bool done_ = false;
  int microbatch_ = -1;
  bool armed_ = false;
  Report report_;
  std::unique_ptr<State> state_;
};

// The check installed in this process (armed or not), or null.
OpCheck* activeOpCheck() noexcept;

}  // namespace tpscope::core
