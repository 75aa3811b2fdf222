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

Live stall lines, long before the watchdog: a rank blocked in a collective for --stall-after seconds (10 s until
every rank has finished a step) while a peer has not entered it prints
  WAITING  tp-0 seq 53 (embedding VocabParallel forward all-reduce, step 5): rank 0 blocked 1.7 s;
    rank 1 has not entered it (last: seq 52 ..., step 4; span "data loading" step 5, silent 1.3 s)
and DESYNC (the members entered it with different ops, sizes or dtypes) or STUCK (all entered, none completed);
RESUMED when the job moves again. The lines never stop anything; run.db keeps them as alerts of kind 'stall'.

--inject SPEC (repeatable): nan:rank=R,step=S[,layer=L][,phase=fwd|bwd]  inf:... (the same with +Inf)
  spike:rank=R,step=S,factor=F  hang:rank=R,step=S[,phase=fwd|bwd]  mismatch:rank=R,step=S[,phase=fwd|bwd]
  slow:rank=R,ms=M  delay:rank=R,ms=M  crash:rank=R,step=S
  bitflip:rank=R,step=S[,tensor=NAME|allreduce][,bit=B][,phase=fwd|bwd]  (one bit of a parameter after the update,
  or of an all-reduce result: silent data corruption, found by the replica fingerprint check)
  (nan/inf phase=fwd: into layer L's output activation; bwd, the default: into its first parameter's gradient)
  Pipeline placement (--pp > 1): stage=S in place of rank=R (stage S's first rank); mb=K (nan, inf, hang): only in
  micro-batch K's passes (0-based), e.g. nan:stage=1,step=3,layer=2,phase=fwd,mb=1
--health KEY=VALUE,...: nonfinite, grad_spike, loss_spike (off|warn|skip-step|stop), replica (off|warn|stop),
  grad_spike.factor|mads|window|warmup, loss_spike.*, replica.every|rtol, skip_window, skip_max
  (replica: the policy of the replica checks, silent_corruption included; replica.every: their period N, default 10)

Exit status:
  0    every rank finished
  1    capture itself failed (no rank wrote a trace, the merge failed, a node did not join within
       --rendezvous-timeout)
  2    bad arguments, config or --inject/--health spec (also: a rank refused its config, a refused token)
  3    hang: no progress for --hang-timeout, or a rank's collective timed out / failed
  4    crash: a rank died (signal, abort, runtime error)
  5    the ranks stopped on a health policy (--on-nonfinite stop, too many skipped steps, replica=stop)
  130  interrupted (Ctrl-C / SIGTERM)

Many nodes: one capture per node, the same arguments but --node-rank, e.g. two nodes of 4 ranks:
  node 0: tpscope capture --nnodes 2 --node-rank 0 --master-addr node0 --master-port 29500 --nproc-per-node 4 ...
  node 1: TPSCOPE_TOKEN=<node 0's token> tpscope capture --nnodes 2 --node-rank 1 --master-addr node0 ...
Node 0 serves the control channel at master-port + 1 (only the job's token gets in; a connection that has not
presented it within 5 s is dropped) and waits --rendezvous-timeout seconds (default 900) for the other nodes, then
exits 1 naming the nodes that never came; no rank starts before every node is in. A hang, crash or Ctrl-C on one
node stops every node with the same exit status. Each node writes its own ranks into its --out folder; join them
with: tpscope merge DIR0 DIR1 ... -o run.db
)";

void addCapture(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<capture::CaptureOptions>();
  auto steps = std::make_shared<int>(0);
  CLI::App* sub = app.add_subcommand("capture", "launch N ranks, record every rank, watch for hangs and crashes, "
                                                "merge and diagnose");
  sub->add_option("--nproc,--nproc-per-node,-n", opts->nproc, "number of ranks (on this node)")->required();
  sub->add_option("--tp", opts->tp, "tensor-parallel size (default: nproc / dp)");
  sub->add_option("--dp", opts->dp, "data-parallel size (default: nproc / (tp x pp), else 1)");
  sub->add_option("--pp", opts->pp, "pipeline-parallel size: stages (passed to tpscope-train)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--schedule", opts->schedule, "pipeline schedule: gpipe, 1f1b or interleaved")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"}));
  sub->add_option("--microbatches", opts->microbatches, "micro-batches per step (passed to tpscope-train)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--virtual-stages", opts->virtualStages, "model chunks per stage, interleaved schedule")
      ->check(CLI::PositiveNumber);
  sub->add_option("--config", opts->config, "training config for tpscope-train (samples/configs/tiny.json, ...)");
  sub->add_option("--steps", *steps, "optimizer steps (passed to tpscope-train)");
  sub->add_option("--out,-o", opts->out, "capture folder: rank-K.db, run.db, logs/")->required();
  sub->add_option("--inject", opts->inject, "fault to inject (repeatable), e.g. nan:rank=1,step=3")
      ->allow_extra_args(false);
  sub->add_option("--hang-timeout", opts->hangTimeoutS, "seconds without progress before the watchdog fires")
      ->default_val(300);
  sub->add_option("--stall-after", opts->stallAfterS,
                  "seconds a rank is blocked in a collective before the live stall line names who it waits for")
      ->default_val(1.5)
      ->check(CLI::PositiveNumber);
  sub->add_option("--on-nonfinite", opts->onNonfinite,
                  "policy on a NaN/Inf: warn, skip-step, stop or trace-ops (warn, then name the first operator that "
                  "makes the next one)")
      ->check(CLI::IsMember({"warn", "skip-step", "stop", "trace-ops"}));
  sub->add_option("--health", opts->health, "health-rule options, e.g. grad_spike=stop,grad_spike.factor=8");
  sub->add_option("--html", opts->html, "also write the self-contained HTML report of the merged run to FILE "
                                        "(as tpscope report RUN --html FILE)")
      ->type_name("FILE");
  sub->add_option("--grace", opts->termGraceS, "seconds between SIGTERM and SIGKILL when stopping")->default_val(5);
  // Many nodes (torchrun's names; docs/capture.md "Many nodes").
  sub->add_option("--nnodes", opts->nnodes, "nodes in the job (one capture per node; default 1)");
  sub->add_option("--node-rank", opts->nodeRank, "this node's index, 0 .. nnodes-1 (global rank = node-rank x "
                                                 "nproc + local rank)");
  sub->add_option("--master-addr", opts->masterAddr, "node 0's address: the ranks' rendezvous (MASTER_ADDR) and "
                                                     "the node captures' control channel");
  sub->add_option("--master-port", opts->masterPort, "the ranks' rendezvous port (MASTER_PORT); the control "
                                                     "channel listens on node 0 at master-port + 1");
  sub->add_option("--token", opts->token, "the job's shared token: admits only this job's nodes and ranks to the "
                                          "control channel and clock store (node 0 makes and prints one if none is "
                                          "given; one node makes its own)")
      ->envname("TPSCOPE_TOKEN");
  // --join-timeout: its name before 2026-12 (kept so that job scripts keep working).
  sub->add_option("--rendezvous-timeout,--join-timeout", opts->rendezvousTimeoutS,
                  "seconds node 0 waits for the other nodes to join (then exit 1 naming those that never came), and "
                  "the others for node 0")
      ->default_val(900)
      ->check(CLI::PositiveNumber);
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
