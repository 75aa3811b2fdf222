#!/usr/bin/env python3
"""What recording costs a Python training step, measured inside one process so that other load on the machine hits
both sides alike: samples/python/tp_train.py's model (one rank, TP = 1), hooks installed, trained in blocks of
--block steps that alternate recording ON (tpscope.start(): every span, grad health, step stats, alerts into a rank
file) and OFF (the hooks stay installed and return after their one check of tpscope._native.recording(), which the
benchmark answers False; the recorder stays started: a new file and flusher per block would put start-up work into
the ON steps that a capture pays once). The first step of each block is dropped, and so are the first two blocks
(warm-up). Reported: median wall and CPU time per step of each side
(CPU: the process, every thread — the recorder's flusher included — and the main thread alone), ON vs OFF; the
fastest step of each side (on a shared machine the least disturbed estimate of what a step costs); and the median of
paired differences (each ON step minus the OFF step beside it: slow drifts of the machine cancel; with --block 2
every measured step has a neighbour of the other side).

--walks adds a third side, recording ON with the backward regions walked in Python instead of C++
(tpscope._autograd), rotated with the other two: what the C++ walk saves, side by side.

OFF is not an uninstrumented run: the installed hooks still cost a Python call per module call. run_overhead.py
compares against a plain process (no tpscope at all) but needs a quiet machine to resolve a few percent.

Usage: PYTHONPATH=<build>/python /usr/bin/python3 bench/python/overhead_in_process.py [--blocks 10] [--block 4]
       [--walks] [-- tp_train.py model arguments]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import sample_model  # noqa: E402


def main():
    argv, model_args = sample_model.split_argv(sys.argv[1:])
    p = argparse.ArgumentParser()
    p.add_argument("--blocks", type=int, default=10)
    p.add_argument("--block", type=int, default=4)
    p.add_argument("--walks", action="store_true",
                   help="a third side: recording ON with the Python walk of backward regions (the ON side uses the "
                        "C++ one, tpscope._autograd, where it loaded)")
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist
    import tpscope

    out = tempfile.mkdtemp(prefix="tpscope-overhead-")
    os.environ["TPSCOPE_OUT"] = out
    for k in ("RANK", "WORLD_SIZE", "TPSCOPE_CLOCK_STORE"):
        os.environ.pop(k, None)
    tpscope.instrument()
    tpscope.start()
    from tpscope import _modules, _native
    margs, model = sample_model.build(model_args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    on_name = "ON (%s walk)" % _modules.walk()
    sides = [on_name, "OFF (hooked)"] + (["ON (Python walk)"] if args.walks and _modules.walk() != "Python" else [])
    times = {side: [] for side in sides}
    step = 0
    for b in range(len(sides) * (args.blocks + 1)):  # the first block of each side warms up and is not counted
        side = sides[b % len(sides)]
        _native.set_paused(side == "OFF (hooked)")  # every hook's gate (tpscope._native.recording)
        _modules.select_walk(side != "ON (Python walk)")
        for i in range(args.block):
            step += 1
            t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
            sample_model.train_step(margs, model, optimizer, step)
            sample_ = (time.perf_counter() - t0, time.process_time() - c0, time.thread_time() - m0)
            if i > 0 and b >= len(sides):
                times[side].append(sample_)
    _native.set_paused(False)
    _modules.select_walk(True)
    tpscope.stop()
    med = {side: [statistics.median(x[k] for x in times[side]) * 1e3 for k in range(3)] for side in sides}
    low = {side: [min(x[k] for x in times[side]) * 1e3 for k in range(3)] for side in sides}
    off = "OFF (hooked)"
    print("model: %s; %d blocks of %d steps per side (first of each dropped)" % (" ".join(model_args), args.blocks,
                                                                                 args.block))
    for side in sides:
        print("%-17s wall %.2f ms  process CPU %.2f ms  main thread CPU %.2f ms per step" % (side, *med[side]))
    for side in sides:
        if side == off:
            continue
        print("%s vs OFF: wall %+.2f %%, process CPU %+.2f %%, main thread CPU %+.2f %% (medians)"
              % (side, *((med[side][k] / med[off][k] - 1) * 100 for k in range(3))))
        print("  fastest steps: %.2f / OFF %.2f ms main thread CPU (%+.2f %%, %+.2f ms): the least disturbed estimate"
              % (low[side][2], low[off][2], (low[side][2] / low[off][2] - 1) * 100, low[side][2] - low[off][2]))
        # Paired: each step against the OFF step measured next to it (the same place in the neighbouring block), so
        # that slow drifts of the machine cancel; the median of those differences over the OFF median.
        paired = [statistics.median(a[k] - o[k] for a, o in zip(times[side], times[off])) * 1e3 for k in range(3)]
        print("  paired (each step minus the OFF step beside it, median): wall %+.2f ms (%+.2f %%), main thread CPU "
              "%+.2f ms (%+.2f %%)" % (paired[0], paired[0] / med[off][0] * 100, paired[2],
                                       paired[2] / med[off][2] * 100))
    if "ON (Python walk)" in times:
        saved = statistics.median(py[0] - c[0] for c, py in zip(times[on_name], times["ON (Python walk)"])) * 1e3
        print("the C++ walk saves %+.2f ms per step against the Python walk (paired median of wall time, %+.2f %% "
              "of OFF)" % (saved, saved / med[off][0] * 100))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
