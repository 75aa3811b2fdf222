#!/usr/bin/env python3
"""Probe overhead in the real engine: step time of tpscope-train on samples/configs/bench.json

  A  recording   tpscope-train with TPSCOPE_OUT set: every span, collective, grad/step stat recorded
  B  off         the same binary, not recording (probes compiled in: one relaxed load per probe)
  C  compiled out tpscope-train-noprobes (TPSCOPE_PROBES_ENABLED=0, bench/capture/CMakeLists.txt)

Runs are interleaved (A B C, B C A, C A B, ...) so drift on a shared machine hits all three alike. Each run is a
fresh process of --steps steps; the first --warmup steps are dropped; the statistic is the median step time per
variant over all kept steps, and the median of the per-round ratios. Targets: A ≤ 1 % over C, B ≤ 0.1 % over C.

Usage: python3 bench/capture/run_overhead.py --build build-capture [--rounds 6] [--steps 10] [--nproc 1]
(build the programs first: ninja -C <build> tpscope-train tpscope-train-noprobes)
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run_once(binary, config, steps, nproc, record_dir):
    """Runs nproc ranks (TP = nproc) and returns rank 0's step times in seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        port = free_port()
        procs = []
        for rank in range(nproc):
            env = dict(os.environ)
            env.update({"OMP_NUM_THREADS": "1"})
            for k in ("TPSCOPE_OUT", "TPSCOPE_INJECT", "TPSCOPE_HEALTH"):
                env.pop(k, None)
            if nproc > 1:
                env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                            "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(rank)})
            if record_dir:
                env["TPSCOPE_OUT"] = record_dir
            args = [binary, "--config", config, "--steps", str(steps), "--tp", str(nproc)]
            if rank == 0:
                args += ["--metrics-jsonl", metrics]
            procs.append(subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        for p in procs:
            _, err = p.communicate()
            if p.returncode != 0:
                sys.exit(f"{binary} failed ({p.returncode}): {err.decode()[-2000:]}")
        with open(metrics) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return [(r["step_time_s"], r["step_cpu_s"]) for r in rows]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True)
    ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "../../samples/configs/bench.json"))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--nproc", type=int, default=1)
    a = ap.parse_args()
    train = os.path.join(a.build, "core", "tpscope-train")
    noprobes = os.path.join(a.build, "bench", "capture", "tpscope-train-noprobes")
    for b in (train, noprobes):
        if not os.access(b, os.X_OK):
            sys.exit(f"missing {b}: ninja -C {a.build} tpscope-train tpscope-train-noprobes")
    variants = {"A recording": (train, True), "B compiled in, off": (train, False), "C compiled out": (noprobes, False)}
    names = list(variants)
    wall = {n: [] for n in names}
    cpu = {n: [] for n in names}
    rounds_wall, rounds_cpu = [], []
    with tempfile.TemporaryDirectory() as rec:
        for r in range(a.rounds):
            order = names[r % 3:] + names[:r % 3]
            med_wall, med_cpu = {}, {}
            for n in order:
                binary, record = variants[n]
                t = run_once(binary, os.path.abspath(a.config), a.steps, a.nproc, rec if record else None)[a.warmup:]
                wall[n] += [w for w, _ in t]
                cpu[n] += [c for _, c in t]
                med_wall[n] = statistics.median(w for w, _ in t)
                med_cpu[n] = statistics.median(c for _, c in t)
            rounds_wall.append(med_wall)
            rounds_cpu.append(med_cpu)
            print(f"round {r + 1}: " + "  ".join(f"{n.split()[0]} {med_wall[n] * 1e3:.2f} ms" for n in names), flush=True)
    # Wall time is what the user feels; process CPU time (every thread of the rank, the recorder's flusher included)
    # is what the probes cost, and it does not move when another process takes the core for a while.
    for label, steps, rounds in (("wall", wall, rounds_wall), ("process CPU", cpu, rounds_cpu)):
        base = statistics.median(steps["C compiled out"])
        print(f"\n{label} time per step (median over {len(steps[names[0]])} steps each, nproc {a.nproc}, "
              f"{os.path.basename(a.config)}):")
        for n in names:
            m = statistics.median(steps[n])
            ratios = [rd[n] / rd["C compiled out"] - 1 for rd in rounds]
            print(f"  {n:20s} {m * 1e3:9.2f} ms   vs compiled out {100 * (m / base - 1):+6.2f} %   "
                  f"per-round median {100 * statistics.median(ratios):+6.2f} % (min {100 * min(ratios):+.2f}, "
                  f"max {100 * max(ratios):+.2f})")
    print("targets: A ≤ +1 %, B ≤ +0.1 % over C")


if __name__ == "__main__":
    main()
