#!/usr/bin/env python3
"""tpscope capture against torch.profiler on the same PyTorch 2.x program: step time plain, profiled, captured.

  P  plain      every rank runs `python3 SAMPLE ARGS` (torchrun's variables, set here), no tool at all
  T  profiler   the same under torch.profiler (bench/python/profiled_run.py: CPU activities, record_shapes=False,
                the whole run recorded)
  S  tpscope    `tpscope capture --nproc N --tp N --out DIR -- python3 SAMPLE ARGS`: every module call,
                collective (DTensor's functional collectives included), gradient row and live rule, with capture's
                own live monitoring running beside the ranks

SAMPLE is samples/python/llama_tp.py (PyTorch's TP API, sequence parallel, DTensor collectives) unless --sample
names another script that takes --steps and --metrics-jsonl. Each run is fresh processes of --steps steps; the
first --warmup steps are dropped; rank 0's step times (the sample's perf_counter around one step, and its process
CPU time: every thread) are what is compared. Rounds are interleaved, the order rotating (P T S, T S P, S P T, ...),
so drift on a shared machine hits the three alike. Reported per variant: the median step time over all kept steps;
per tool: the median of the per-round ratios to P with a bootstrap 95 % confidence interval over the rounds
(bench/capture/run_overhead.py's ratio_ci). The profiler's stop (building its event tree, after the last step) is
not in the step times; its median is printed beside them. Target (issue #28): S ≤ +3 % where T is higher; under
each table a verdict line says met, missed or unresolved (and why) from the per-round CI (verdict()).

Usage: .venv/bin/python3 bench/python/profiler_compare.py [--tpscope build/cli/tpscope] [--rounds 8] [--steps 12]
       [--nproc 2] [--sample PATH] [-- sample arguments]
"""
import argparse
import datetime
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
SAMPLE = os.path.join(ROOT, "samples", "python", "llama_tp.py")
PROFILED = os.path.join(HERE, "profiled_run.py")
sys.path.insert(0, HERE)
import overhead_stats  # noqa: E402
DEFAULT_ARGS = ["--dim", "256", "--heads", "8", "--hidden", "768", "--layers", "4", "--seq", "64", "--batch", "8",
                "--vocab", "512"]
VARIANTS = ("P plain", "T torch.profiler", "S tpscope capture")


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ("TPSCOPE_OUT", "TPSCOPE_HEALTH", "TPSCOPE_INJECT"):
        env.pop(k, None)
    return env


def _launch_ranks(a, prefix, sample_args, tmp):
    """Runs the ranks as torchrun would (no agent process); returns rank 0's stderr."""
    port = overhead_stats.free_port()
    procs = []
    for rank in range(a.nproc):
        env = dict(_env(), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(a.nproc),
                   LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(a.nproc), TPSCOPE_SAMPLE_DEVICE="cpu")
        procs.append(subprocess.Popen([sys.executable] + prefix + [a.sample] + sample_args, env=env, cwd=tmp,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    errs = []
    for rank, p in enumerate(procs):
        _, err = p.communicate(timeout=900)
        if p.returncode > 0 or (p.returncode < 0 and not _finished(tmp, sample_args)):
            raise SystemExit("a rank failed (%d): %s" % (p.returncode, err[-2000:]))
        if p.returncode < 0:  # every step ran: PyTorch's Gloo threads abort the interpreter's shutdown now and then
            print("  (rank %d killed by signal %d after its last step, at shutdown: the round is complete)"
                  % (rank, -p.returncode))
        errs.append(err)
    return errs[0]


def _finished(tmp, sample_args):
    """Whether rank 0 wrote a metrics row for every step (the collectives of each need every rank)."""
    steps = int(sample_args[sample_args.index("--steps") + 1])
    try:
        with open(os.path.join(tmp, "metrics.jsonl")) as f:
            return sum(1 for line in f if line.strip()) >= steps
    except OSError:
        return False


def run_once(a, variant, extra):
    """(wall seconds, CPU seconds) per kept step of rank 0, and the profiler's stop time (None but for T)."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        sample_args = ["--steps", str(a.steps), "--metrics-jsonl", metrics] + extra
        stop = None
        if variant == "P plain":
            _launch_ranks(a, [], sample_args, tmp)
        elif variant == "T torch.profiler":
            err = _launch_ranks(a, [PROFILED], sample_args, tmp)
            m = re.search(r"profiled_run: stop ([0-9.]+) s", err)
            stop = float(m.group(1)) if m else None
        else:
            env = dict(_env(), TPSCOPE_SAMPLE_DEVICE="cpu")
            cmd = [a.tpscope, "capture", "--nproc", str(a.nproc), "--tp", str(a.nproc), "--out",
                   os.path.join(tmp, "run"), "--", sys.executable, a.sample] + sample_args
            p = subprocess.run(cmd, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=900)
            if p.returncode != 0:
                raise SystemExit("tpscope capture failed (%d): %s" % (p.returncode, p.stdout[-3000:]))
        with open(metrics) as f:
            rows = [json.loads(line) for line in f if line.strip()][a.warmup:]
        return [r["step_time_s"] for r in rows], [r["step_cpu_s"] for r in rows], stop


TARGET = 0.03  # issue #28: tpscope's overhead at most 3 % where the profiler's is higher


def verdict(captured, profiled, target=TARGET):
    """What the rounds say of the target, from the per-round ratios to plain of tpscope (CAPTURED) and of the
    profiler (PROFILED): "met" only where the 95 % CI of tpscope's per-round median is at or under TARGET and the
    profiler's median is higher; "missed" where the whole CI is over it; otherwise "unresolved", saying why. A CI
    wholly under zero — tpscope's steps faster than plain — is the machine's scatter (process placement, a drifting
    clock speed), not a measurement: unresolved, whatever the medians say."""
    if len(captured) < 3 or len(profiled) < 3:
        return "unresolved: too few rounds for an interval (--rounds 3 or more)"
    lo, hi = overhead_stats.ratio_ci(captured)
    s, t = statistics.median(captured), statistics.median(profiled)
    span = "tpscope %+.2f %% (95 %% CI %+.2f … %+.2f %%), the profiler %+.2f %%" % (
        100 * s, 100 * lo, 100 * hi, 100 * t)
    if hi < 0:
        return ("unresolved: %s — tpscope faster than plain beyond its CI: the machine's scatter; rerun on a quiet "
                "machine" % span)
    if lo > target:
        return "missed: %s — the whole CI over %+.0f %%" % (span, 100 * target)
    if hi <= target:
        if t > s:
            return "met: %s" % span
        return "unresolved: %s — tpscope under %+.0f %% but the profiler not higher" % (span, 100 * target)
    return "unresolved: %s — the CI spans %+.0f %%, the median %s it: more --rounds, or a quieter machine" % (
        span, 100 * target, "over" if s > target else "at or under")


def report(label, pooled, rounds):
    base = statistics.median(pooled["P plain"])
    print("\n%s time per step (median over %d kept steps each):" % (label, len(pooled["P plain"])))
    ratios = {v: [rd[v] / rd["P plain"] - 1 for rd in rounds] for v in VARIANTS if v != "P plain"}
    for v in VARIANTS:
        m = statistics.median(pooled[v])
        line = "  %-18s %9.2f ms" % (v, m * 1e3)
        if v != "P plain":
            r = ratios[v]
            line += "   vs plain %+6.2f %%   per-round median %+6.2f %% (%s; min %+.2f, max %+.2f)" % (
                100 * (m / base - 1), 100 * statistics.median(r), overhead_stats.ci_text(r), 100 * min(r),
                100 * max(r))
        print(line)
    print("  target (S <= %+.0f %% where T is higher): %s" % (
        100 * TARGET, verdict(ratios["S tpscope capture"], ratios["T torch.profiler"])))


def main():
    argv = sys.argv[1:]
    extra = None
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tpscope", default=os.path.join(ROOT, "build", "cli", "tpscope"))
    ap.add_argument("--sample", default=SAMPLE)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--nproc", type=int, default=2)
    a = ap.parse_args(argv)
    extra = DEFAULT_ARGS if extra is None else extra
    a.sample = os.path.abspath(a.sample)
    a.tpscope = shutil.which(a.tpscope) or a.tpscope
    if not os.access(a.tpscope, os.X_OK):
        sys.exit("missing %s: cmake --build build --target tpscope tpscope_python_native" % a.tpscope)
    import torch
    print("%s  %s  torch %s  load average %s" % (datetime.datetime.now(datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC"), socket.gethostname(), torch.__version__, "%.2f %.2f %.2f" % os.getloadavg()))
    print("sample %s %s; nproc %d (TP = %d); %d rounds x %d kept steps" % (
        os.path.relpath(a.sample, ROOT), " ".join(extra), a.nproc, a.nproc, a.rounds, a.steps - a.warmup))
    wall = {v: [] for v in VARIANTS}
    cpu = {v: [] for v in VARIANTS}
    rounds_wall, rounds_cpu, stops = [], [], []
    for r in range(a.rounds):
        order = VARIANTS[r % 3:] + VARIANTS[:r % 3]
        med_wall, med_cpu = {}, {}
        for v in order:
            w, c, stop = run_once(a, v, extra)
            wall[v] += w
            cpu[v] += c
            med_wall[v], med_cpu[v] = statistics.median(w), statistics.median(c)
            if stop is not None:
                stops.append(stop)
        rounds_wall.append(med_wall)
        rounds_cpu.append(med_cpu)
        print("round %d: %s" % (r + 1, "  ".join("%s %.2f ms" % (v.split()[0], med_wall[v] * 1e3)
                                                  for v in VARIANTS)), flush=True)
    report("wall", wall, rounds_wall)
    report("rank 0's process CPU", cpu, rounds_cpu)
    if stops:
        print("\ntorch.profiler's stop after the last step (rank 0, not in the step times): median %.3f s"
              % statistics.median(stops))
    print("load average at the end: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
