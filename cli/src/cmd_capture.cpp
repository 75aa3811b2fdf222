// `tpscope capture`: command-line front of capture/launcher.h (docs/capture.md).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "capture/launcher.h"
#include "command.h"

namespace tpscope::cli {

namespace {

constexpr const char* kCaptureFooter = R"(
Runs N ranks of tpscope-train (or of -- PROGRAM ARGS..., any program that links the tpscope probes runtime) with
torchrun's environment; each rank writes DIR/rank-K.db, capture merges them into DIR/run.db and prints the diagnosis.
Rank output goes to DIR/logs/rank-K.log.

Watchdog: no new span, collective or step on any rank for --hang-timeout seconds → every rank is told to dump
(SIGUSR1), then stopped (SIGTERM, then SIGKILL). A rank that crashes → the others dump and stop. Ctrl-C: the same
(a second Ctrl-C kills at once).

--inject SPEC (repeatable): nan:rank=R,step=S[,layer=L][,phase=fwd|bwd]  inf:... (the same with +Inf)
  spike:rank=R,step=S,factor=F  hang:rank=R,step=S[,phase=fwd|bwd]  mismatch:rank=R,step=S[,phase=fwd|bwd]
  slow:rank=R,ms=M  delay:rank=R,ms=M  crash:rank=R,step=S
  bitflip:rank=R,step=S[,tensor=NAME|allreduce][,bit=B][,phase=fwd|bwd]  (one bit of a parameter after the update,
  or of an all-reduce result: silent data corruption, found by the replica fingerprint check)
  (nan/inf phase=fwd: into layer L's output activation; bwd, the default: into its first parameter's gradient)
--health KEY=VALUE,...: nonfinite, grad_spike, loss_spike (off|warn|skip-step|stop), replica (off|warn|stop),
  grad_spike.factor|mads|window|warmup, loss_spike.*, replica.every|rtol, skip_window, skip_max
  (replica: the policy of the replica checks, silent_corruption included; replica.every: their period N, default 10)

Exit status:
  0    every rank finished
  1    capture itself failed (no rank wrote a trace, the merge failed)
  2    bad arguments, config or --inject/--health spec (also: a rank refused its config)
  3    hang: no progress for --hang-timeout, or a rank's collective timed out / failed
  4    crash: a rank died (signal, abort, runtime error)
  5    the ranks stopped on a health policy (--on-nonfinite stop, too many skipped steps, replica=stop)
  130  interrupted (Ctrl-C / SIGTERM)
)";

std::filesystem::path selfPath() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : p;
}

void addCapture(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<capture::CaptureOptions>();
  auto steps = std::make_shared<int>(0);
  CLI::App* sub = app.add_subcommand("capture", "launch N ranks, record every rank, watch for hangs and crashes, "
                                                "merge and diagnose");
  sub->add_option("--nproc,-n", opts->nproc, "number of ranks")->required();
  sub->add_option("--tp", opts->tp, "tensor-parallel size (default: nproc / dp)");
  sub->add_option("--dp", opts->dp, "data-parallel size (default: nproc / tp, else 1)");
  sub->add_option("--config", opts->config, "training config for tpscope-train (samples/configs/tiny.json, ...)");
  sub->add_option("--steps", *steps, "optimizer steps (passed to tpscope-train)");
  sub->add_option("--out,-o", opts->out, "capture folder: rank-K.db, run.db, logs/")->required();
  sub->add_option("--inject", opts->inject, "fault to inject (repeatable), e.g. nan:rank=1,step=3")
      ->allow_extra_args(false);
  sub->add_option("--hang-timeout", opts->hangTimeoutS, "seconds without progress before the watchdog fires")
      ->default_val(300);
  sub->add_option("--on-nonfinite", opts->onNonfinite, "policy on a NaN/Inf: warn, skip-step or stop")
      ->check(CLI::IsMember({"warn", "skip-step", "stop"}));
  sub->add_option("--health", opts->health, "health-rule options, e.g. grad_spike=stop,grad_spike.factor=8");
  sub->add_option("--html", opts->html, "also write the self-contained HTML report of the merged run to FILE "
                                        "(as tpscope report RUN --html FILE)")
      ->type_name("FILE");
  sub->add_option("--grace", opts->termGraceS, "seconds between SIGTERM and SIGKILL when stopping")->default_val(5);
  sub->add_option("program", opts->program, "-- PROGRAM ARGS...: run this instead of tpscope-train");
  sub->footer(kCaptureFooter);
  sub->callback([&ctx, opts, steps, sub] {
    if (sub->count("--steps") > 0) opts->steps = *steps;
    opts->self = selfPath();
    ctx.exitCode = capture::runCapture(*opts, stdout, stderr, ::isatty(STDOUT_FILENO) == 1);
  });
}

}  // namespace

TPS_REGISTER_COMMAND(5, addCapture);

}  // namespace tpscope::cli
