#!/usr/bin/env python3
"""Step time of a captured Python training run vs the same run without capture (target: within 3 %).

  A  recorded    every rank runs `python3 -m tpscope.run samples/python/tp_train.py ...` with TPSCOPE_OUT set —
                 what `tpscope capture -- python3 ...` runs: module hooks, collectives, grad health, step stats
  B  plain       `python3 samples/python/tp_train.py ...`, the same environment, no tpscope at all

Both are launched here the same way (torchrun's variables, OMP_NUM_THREADS=1, one intra-op thread per rank),
interleaved A B, B A, ... so drift on a shared machine hits both alike. Each run is fresh processes of --steps steps;
the first --warmup steps are dropped; rank 0's step times (the script's own perf_counter around one step) are
pooled per variant. Reported: the median step time per variant, A vs B, and the median and range of per-round ratios;
also rank 0's process CPU time per step (time.process_time around the step: every thread, the recorder's flusher
included), which other processes on the machine move far less than wall time.

Usage: PYTHONPATH=<build>/python /usr/bin/python3 bench/python/run_overhead.py [--rounds 6] [--steps 12] [--nproc 2]
       [-- extra tp_train.py arguments]
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = os.path.join(HERE, "..", "..", "samples", "python", "tp_train.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(recorded, args, extra):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        port = free_port()
        procs = []
        for rank in range(args.nproc):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                       WORLD_SIZE=str(args.nproc), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1",
                       TPSCOPE_TP=str(args.nproc), TPSCOPE_DP="1")
            cmd = [sys.executable]
            if recorded:
                env["TPSCOPE_OUT"] = os.path.join(tmp, "trace")
                cmd += ["-m", "tpscope.run"]
            else:
                env.pop("TPSCOPE_OUT", None)
            cmd += [SAMPLE, "--tp", str(args.nproc), "--steps", str(args.steps), "--metrics-jsonl", metrics] + extra
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        for p in procs:
            _, err = p.communicate(timeout=600)
            if p.returncode != 0:
                raise SystemExit("a rank failed (%d): %s" % (p.returncode, err[-2000:]))
        rows = [json.loads(line) for line in open(metrics)][args.warmup:]
        return [r["step_time_s"] for r in rows], [r["step_cpu_s"] for r in rows]


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--nproc", type=int, default=2)
    args = p.parse_args(argv)
    if not extra:
        extra = ["--layers", "4", "--hidden", "256", "--heads", "8", "--seq", "64", "--batch", "8"]
    pooled = {True: [], False: []}
    cpu = {True: [], False: []}
    ratios = []
    for r in range(args.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        medians = {}
        for recorded in order:
            times, c = run_once(recorded, args, extra)
            pooled[recorded] += times
            cpu[recorded] += c
            medians[recorded] = statistics.median(times)
        ratios.append(medians[True] / medians[False] - 1)
        print("round %d: recorded %.2f ms, plain %.2f ms (%+.2f %%)"
              % (r + 1, medians[True] * 1e3, medians[False] * 1e3, ratios[-1] * 100), flush=True)
    a, b = statistics.median(pooled[True]), statistics.median(pooled[False])
    ca, cb = statistics.median(cpu[True]), statistics.median(cpu[False])
    print("sample args: %s; %d rounds x %d kept steps, nproc %d" % (" ".join(extra), args.rounds,
                                                                    args.steps - args.warmup, args.nproc))
    print("A recorded: %.2f ms per step   B plain: %.2f ms per step   A vs B %+.2f %% (per-round median %+.2f %%, "
          "range %+.2f … %+.2f %%)" % (a * 1e3, b * 1e3, (a / b - 1) * 100, statistics.median(ratios) * 100,
                                      min(ratios) * 100, max(ratios) * 100))
    print("rank 0's process CPU time per step (every thread, the recorder's flusher included): A %.2f ms, "
          "B %.2f ms (%+.2f %%)" % (ca * 1e3, cb * 1e3, (ca / cb - 1) * 100))


if __name__ == "__main__":
    main()
