#!/usr/bin/python3
"""Benchmark of core/: tpscope-train against the same GPT in PyTorch eager, TP scaling, and FLOP/s.

Prints, for samples/configs/bench.json (fp32, one thread per rank):
  1. the single-core fp32 matmul rate (the practical ceiling), measured here with PyTorch (same BLAS as LibTorch);
  2. step time of the PyTorch eager model (bench/core/gpt_reference.py) and of tpscope-train at TP=1, and the ratio
     (target: tpscope <= 0.85x eager);
  3. TP=2 (two processes, loopback Gloo) against TP=1: scaling efficiency = T(TP=1) / (2 x T(TP=2)) (target >= 85%);
  4. achieved model FLOP/s at TP=1 against the matmul ceiling (target >= 60%).
Step times: best and median over the measured steps (the first `--skip` steps are warm-up); the ratios use the
best step, the least disturbed one when other jobs share the cores. The load average is printed with the figures.

usage: run_bench.py --train build/core/tpscope-train [--config samples/configs/bench.json] [--steps 8] [--skip 2]
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

try:
    import torch  # noqa: F401  (python3-torch from Debian lives in the system interpreter)
except ImportError:
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    sys.exit("run_bench.py needs python3-torch (apt-get install python3-torch)")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def model_flops(cfg, batch):
    """Matmul FLOPs of one forward+backward (3x forward) for `batch` sequences; same formula as GptImpl."""
    b, s, h, f = batch, cfg["seq_len"], cfg["hidden"], cfg["ffn_hidden"]
    per_layer = 2 * b * s * (3 * h * h + h * h + 2 * h * f) + 2 * 2 * b * s * s * h
    head = 2 * b * s * h * cfg["vocab_size"]
    return 3.0 * (cfg["layers"] * per_layer + head)


def matmul_rate(n=1024, reps=10):
    import torch
    torch.set_num_threads(1)
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(2):
        a @ b
    best, best_cpu = float("inf"), float("inf")
    for _ in range(reps):
        t, c = time.perf_counter(), time.process_time()
        a @ b
        best = min(best, time.perf_counter() - t)
        best_cpu = min(best_cpu, time.process_time() - c)
    return 2.0 * n ** 3 / best, 2.0 * n ** 3 / best_cpu


def eager_step_time(cfg, steps, skip):
    import torch
    sys.path.insert(0, HERE)
    import gpt_reference as ref
    torch.set_num_threads(1)
    torch.manual_seed(cfg["seed"])
    model = ref.Gpt(cfg["layers"], cfg["hidden"], cfg["heads"], cfg["ffn_hidden"], cfg["seq_len"], cfg["vocab_size"])
    opt = ref.make_optimizer(model, cfg)
    b, s = cfg["micro_batch_size"], cfg["seq_len"]
    corpus = b"".join(open(os.path.join(ROOT, "samples", "corpus", f), "rb").read()
                      for f in sorted(os.listdir(os.path.join(ROOT, "samples", "corpus"))) if f.endswith(".txt"))
    data = torch.tensor(list(corpus), dtype=torch.long)
    times, cpus, losses = [], [], []
    for step in range(steps):
        starts = torch.randint(0, len(data) - s - 1, (b,))
        ids = torch.stack([data[i:i + s] for i in starts])
        tg = torch.stack([data[i + 1:i + s + 1] for i in starts])
        t, c = time.perf_counter(), time.process_time()
        losses.append(ref.train_step(model, opt, ids, tg, cfg.get("clip", 1.0), ref.learning_rate(cfg, step + 1)))
        times.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return step_stats(times[skip:]) + (statistics.median(cpus[skip:]),), losses


def step_stats(times):
    """(best, median) step time. Ratios use the best step: on a shared machine it is the least disturbed one."""
    return min(times), statistics.median(times)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tpscope_step_time(train, config, tp, steps, skip):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        port = free_port()
        procs = []
        for r in range(tp):
            env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(tp), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            args = [train, "--config", config, "--tp", str(tp), "--steps", str(steps), "--threads", "1",
                    "--log-every", "0", "--metrics-jsonl", metrics]
            procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        for p in procs:
            out, _ = p.communicate(timeout=1800)
            if p.returncode != 0:
                sys.exit(f"tpscope-train tp={tp} failed ({p.returncode}):\n{out.decode()}")
        rows = [json.loads(line) for line in open(metrics)]
    times = [r["step_time_s"] for r in rows]
    cpus = [r["step_cpu_s"] for r in rows]
    return step_stats(times[skip:]) + (statistics.median(cpus[skip:]),), [r["loss"] for r in rows]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", required=True, help="path to tpscope-train")
    ap.add_argument("--config", default=os.path.join(ROOT, "samples", "configs", "bench.json"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--skip", type=int, default=2)
    a = ap.parse_args()
    cfg = json.load(open(a.config))
    cfg["steps"] = a.steps  # both sides run the same LR schedule over the same number of steps
    flops = model_flops(cfg, cfg["micro_batch_size"])
    print(f"config {a.config}: layers {cfg['layers']} hidden {cfg['hidden']} heads {cfg['heads']} "
          f"ffn {cfg['ffn_hidden']} seq {cfg['seq_len']} micro_batch {cfg['micro_batch_size']} -> "
          f"{flops / 1e9:.1f} GFLOP per step; {os.cpu_count()} cores; fp32; 1 thread per rank")
    ceiling, ceiling_cpu = matmul_rate()
    print(f"matmul ceiling (1 core, fp32 1024^3, best of 10): {ceiling / 1e9:.1f} GFLOP/s wall, "
          f"{ceiling_cpu / 1e9:.1f} GFLOP/s of CPU time")
    (t_eager, m_eager, c_eager), l_eager = eager_step_time(cfg, a.steps, a.skip)
    print(f"PyTorch eager (python3-torch):  best {t_eager * 1e3:8.1f} ms  median {m_eager * 1e3:8.1f} ms  "
          f"cpu {c_eager * 1e3:8.1f} ms   loss {l_eager[0]:.3f} -> {l_eager[-1]:.3f}")
    (t1, m1, c1), l1 = tpscope_step_time(a.train, a.config, 1, a.steps, a.skip)
    print(f"tpscope-train TP=1:             best {t1 * 1e3:8.1f} ms  median {m1 * 1e3:8.1f} ms  "
          f"cpu {c1 * 1e3:8.1f} ms   loss {l1[0]:.3f} -> {l1[-1]:.3f}")
    (t2, m2, c2), l2 = tpscope_step_time(a.train, a.config, 2, a.steps, a.skip)
    print(f"tpscope-train TP=2 (2 procs):   best {t2 * 1e3:8.1f} ms  median {m2 * 1e3:8.1f} ms  "
          f"cpu {c2 * 1e3:8.1f} ms (rank 0)")
    load = os.getloadavg()[0]
    print(f"load average while measuring: {load:.1f} on {os.cpu_count()} cores")
    ok = lambda b: "met" if b else "MISSED"
    print()
    print("wall clock (best step; what a user sees on THIS machine now):")
    ratio, eff, frac = t1 / t_eager, t1 / (2 * t2), flops / t1 / ceiling
    print(f"  step-time ratio tpscope TP=1 / PyTorch eager: {ratio:.3f}   (target <= 0.85: {ok(ratio <= 0.85)})")
    print(f"  TP=2 scaling efficiency T1/(2*T2):           {eff * 100:.1f}%  (target >= 85%: {ok(eff >= 0.85)})")
    print(f"  achieved {flops / t1 / 1e9:.1f} GFLOP/s at TP=1 = {frac * 100:.1f}% of the matmul ceiling "
          f"(target >= 60%: {ok(frac >= 0.60)})")
    print("CPU time (median step; insensitive to other jobs; single-threaded ranks, so ~ wall time when idle):")
    cratio, ceff = c1 / c_eager, c1 / (2 * c2)
    print(f"  step-time ratio tpscope TP=1 / PyTorch eager: {cratio:.3f}   (target <= 0.85: {ok(cratio <= 0.85)})")
    print(f"  TP=2 compute efficiency C1/(2*C2), no waits: {ceff * 100:.1f}%  (target >= 85%: {ok(ceff >= 0.85)})")
    print(f"  achieved {flops / c1 / 1e9:.1f} GFLOP/s of CPU time at TP=1 = {flops / c1 / ceiling_cpu * 100:.1f}% of "
          f"the matmul ceiling (target >= 60%: {ok(flops / c1 / ceiling_cpu >= 0.60)})")


if __name__ == "__main__":
    main()
