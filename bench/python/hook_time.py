#!/usr/bin/env python3
"""Where a recorded Python step's instrumentation time goes: the time spent inside each of tpscope's entry points per
step (module pre- and post-hooks, the backward-region start and end hooks, the loss, gradient health), timed around
each call while samples/python/tp_train.py's model (one rank, TP = 1) trains with recording on.

What step-time comparisons (overhead_in_process.py) cannot resolve on a noisy machine this attributes: each entry's
own time is measured directly, so a change to one hook shows in its line. Not included: autograd calling the node
hooks (about a microsecond each, in C++), the node hooks of the C++ walk (tpscope._autograd: C++ hooks autograd runs
without Python; --walk python times the Python walk's instead), the recorder's flusher thread, and what the hooks'
memory traffic costs the model's own work. The timer adds about 0.3 µs per call (measured warm): under 0.1 ms for the ~190 calls of a step.

Usage: PYTHONPATH=<build>/python /usr/bin/python3 bench/python/hook_time.py [--steps 40] [-- tp_train.py model args]
"""
import argparse
import collections
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import overhead_stats  # noqa: E402
import sample_model  # noqa: E402


def main():
    argv, model_args = sample_model.split_argv(sys.argv[1:])
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--walk", choices=("default", "python"), default="default",
                   help="python: walk backward regions in Python even where tpscope._autograd loaded (its node "
                        "hooks are then timed here; the C++ walk's run inside autograd and are not)")
    args = p.parse_args(argv)

    import torch
    import tpscope
    from tpscope import _modules, _training

    spent = collections.defaultdict(lambda: [0.0, 0])  # label -> [seconds, calls]

    def timed(owner, name, label):
        overhead_stats.timed(owner, name, spent, label, time.perf_counter)

    # Before instrument(), which registers the module hooks (C with the C++ walk, Python with the Python walk).
    overhead_stats.timed_hooks(_modules, spent, ("module pre-hook (forward span begins)",
                                                 "module post-hook (span, output check, backward-region walk)"),
                               time.perf_counter)
    timed(_modules, "_watch_output", "  of which the output check (Python walk)")
    timed(_modules, "_attach_backward", "  of which the backward-region walk (Python walk)")
    timed(_modules, "_start", "backward start hooks")
    timed(_modules._Backward, "node_done", "backward end hooks (region sinks)")
    timed(_modules, "backward_finished", "backward() returned")
    timed(_training, "_on_loss", "loss and the outputs' check")
    timed(_training, "_grad_health", "gradient health")

    os.environ["TPSCOPE_OUT"] = tempfile.mkdtemp(prefix="tpscope-hook-time-")
    for k in ("RANK", "WORLD_SIZE", "TPSCOPE_CLOCK_STORE"):
        os.environ.pop(k, None)
    tpscope.instrument()
    walk = _modules.select_walk(args.walk == "default")
    margs, model = sample_model.build(model_args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tpscope.start()
    t_steps = 0.0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            spent.clear()
        t0 = time.perf_counter()
        sample_model.train_step(margs, model, optimizer, step)
        if step >= args.warmup:
            t_steps += time.perf_counter() - t0
    tpscope.stop()
    n = args.steps
    print("model: %s; %d steps, %.2f ms per step (wall); %s walk of backward regions"
          % (" ".join(model_args), n, t_steps / n * 1e3, walk))
    seconds = sorted(((label, s) for label, (s, _) in spent.items()), key=lambda kv: -kv[1])
    for label, s in seconds:
        if label.startswith(" "):
            continue
        print("  %-60s %6.3f ms per step" % (label, s / n * 1e3))
        if label.startswith("module post-hook"):
            for part, t in seconds:
                if part.startswith(" "):
                    print("  %-60s %6.3f ms per step" % (part, t / n * 1e3))
    total = sum(s for label, s in seconds if not label.startswith(" ")) / n  # "of which": inside another
    print("  %-60s %6.3f ms per step (%.2f %% of the step)" % ("total inside tpscope's hooks", total * 1e3,
                                                               total / (t_steps / n) * 100))


if __name__ == "__main__":
    main()
