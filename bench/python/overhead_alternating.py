#!/usr/bin/env python3
"""What recording costs a multi-rank PyTorch 2.x program, step against step in the same processes: every rank runs
SAMPLE (samples/python/llama_tp.py at TP = 2 unless --sample names another script that takes --steps) under
tpscope's hooks, and recording alternates ON and OFF after every optimizer step, on every rank alike (a global
optimizer step post-hook pauses and resumes tpscope._native.recording(), the gate every hook checks). OFF is not an uninstrumented
run: the hooks stay installed and return after that one check. What separate processes cannot resolve on a shared
2-core machine (rounds of bench/python/profiler_compare.py scatter by ±10 %: which process got which core, the
allocator's layout), this does: each ON step has an OFF step beside it.

Reported for rank 0, over the kept steps (the first --warmup dropped): the median wall time, main-thread CPU time and
process CPU time (every thread: Gloo's, the recorder's flusher) per step of each side, their difference, and the median of paired differences (each ON step minus the OFF step after
it) with a bootstrap 95 % confidence interval. --off lists parts to leave out of the ON side too (modules: the module
hooks, with the backward walk and the output check; funcol: the functional-collective wrappers; health: the
gradient rows; watch: the module-output check; walk: the backward-region walk), to see what each costs.

--entries attributes instead of comparing: every step records, and rank 0's thread-CPU time inside each of
tpscope's entry points is timed around every call (the module pre- and post-hooks, the functional collectives'
wrappers and their waits — less the collective or wait they wrap —, the loss and backward hooks, the gradient rows),
printed per call and per step. Thread CPU, so time the thread spent waiting for a core is not in it; each timer is
two clock_gettime(CLOCK_THREAD_CPUTIME_ID) system calls (well under a microsecond warm, more between the step's
matrix products, where every figure here is taken: those leave the caches cold, which is what the figures show).

Usage: .venv/bin/python3 bench/python/overhead_alternating.py [--build build] [--steps 152] [--nproc 2]
       [--off PART,...] [--entries] [--sample PATH] [-- sample arguments]
"""
import argparse
import collections
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
SAMPLE = os.path.join(ROOT, "samples", "python", "llama_tp.py")
sys.path.insert(0, HERE)
import overhead_stats  # noqa: E402
DEFAULT_ARGS = ["--dim", "256", "--heads", "8", "--hidden", "768", "--layers", "4", "--seq", "64", "--batch", "8",
                "--vocab", "512"]
PARTS = ("modules", "funcol", "health", "watch", "walk")
ENTRIES_WARMUP = 2  # --entries: steps before the timers count
ENTRY_LABELS = ("module pre-hook (the call's start)", "module post-hook (forward span, output check, backward walk)",
                "the loss (its value, the outputs' findings)", "backward() returned",
                "gradient rows and their rules (the optimizer step)",
                "functional collective's wrapper (less the call)",
                "functional collective's wait wrapper (less the wait)")


def _time_entries(spent):
    """Thread-CPU timers around tpscope's entry points: spent[label] = [ns, calls]. Before instrument(), which
    registers the module hooks."""
    from tpscope import _modules, _training
    clock = time.thread_time_ns

    overhead_stats.timed_hooks(_modules, spent, ENTRY_LABELS[:2], clock)
    for (owner, name), label in zip(((_training, "_on_loss"), (_modules, "backward_finished"),
                                     (_training, "_grad_health")), ENTRY_LABELS[2:]):
        overhead_stats.timed(owner, name, spent, label, clock)
    # Parts inside those (a label that starts with spaces: not added to the total again).
    from tpscope import _native
    overhead_stats.timed(_native, "host_stats", spent, "  of which the gradients' one-pass read (host_stats)", clock)


def _time_funcol(spent):
    """The functional collectives' wrappers and their wait, timed less the collective or wait inside (after
    instrument(), which installed them)."""
    import torch.distributed._functional_collectives as funcol
    from tpscope import _funcol
    clock = time.thread_time_ns
    inner_ns = [0]

    def inner(original):
        def call(*a, **k):
            t0 = clock()
            try:
                return original(*a, **k)
            finally:
                inner_ns[0] += clock() - t0
        return call

    def outer(fn, original, label):
        def call(*a, **k):
            before, t0 = inner_ns[0], clock()
            try:
                return fn(*a, **k)
            finally:
                e = spent[label]
                e[0] += clock() - t0 - (inner_ns[0] - before)
                e[1] += 1
        call.__tpscope_original__ = original
        return call

    for name, (op, group_index) in _funcol._FUNCTIONS.items():
        current = getattr(funcol, name, None)
        if current is not None and hasattr(current, "__tpscope_original__"):
            original = current.__tpscope_original__
            setattr(funcol, name, outer(_funcol._wrap(inner(original), op, group_index), original, ENTRY_LABELS[5]))
    original = getattr(funcol.wait_tensor, "__tpscope_original__", None)
    if original is not None:
        funcol.wait_tensor = outer(_funcol._wrap_wait(inner(original)), original, ENTRY_LABELS[6])


def _rank_main(out_json, off, script_argv):
    """One rank: hooks installed, recording flipped after every optimizer step (or, with "entries" in OFF, always on
    and its entry points timed), the sample run as __main__."""
    import runpy

    import tpscope
    from tpscope import _funcol, _modules, _native, _training
    from tpscope._native import kinds as K
    for owner, name in ((_modules, "hooks"), (_funcol, "install"), (_training, "_grad_health"),
                        (_native, "set_paused")):
        if not callable(getattr(owner, name, None)):  # renamed: leaving it out would silently leave it in
            raise SystemExit("overhead_alternating.py: %s.%s is gone; update --off" % (owner.__name__, name))
    for name in ("WATCH", "WALK"):
        if getattr(_modules, name, None) is not True:
            raise SystemExit("overhead_alternating.py: _modules.%s is gone; update --off" % name)
    if "modules" in off:
        _modules.hooks = lambda: (lambda module, inputs: None, lambda module, inputs, output: None)
    if "funcol" in off:
        _funcol.install = lambda: None
    if "health" in off:
        _training._grad_health = lambda optimizer, step: (K.ACTION_CONTINUE, 0.0)
    if "watch" in off:
        _modules.WATCH = False
    if "walk" in off:
        _modules.WALK = False
    entries = "entries" in off
    spent = collections.defaultdict(lambda: [0, 0])
    if entries:
        _time_entries(spent)
    state = {"on": True}
    tpscope.start()
    tpscope.instrument()
    if entries:
        _time_funcol(spent)
    from torch.optim.optimizer import register_optimizer_step_post_hook
    rows = []
    last = [time.perf_counter(), time.thread_time(), time.process_time()]

    def flip(optimizer, args, kwargs):
        now = [time.perf_counter(), time.thread_time(), time.process_time()]
        rows.append((state["on"], now[0] - last[0], now[1] - last[1], now[2] - last[2]))
        last[:] = now
        if not entries:
            state["on"] = not state["on"]
            _native.set_paused(not state["on"])  # the gate every hook and wrapper checks (tpscope._native.recording)
        elif len(rows) == ENTRIES_WARMUP:
            spent.clear()  # the first steps index the model and resolve the groups

    register_optimizer_step_post_hook(flip)
    sys.argv = list(script_argv)
    sys.path[0] = os.path.dirname(os.path.abspath(script_argv[0]))
    runpy.run_path(script_argv[0], run_name="__main__")
    _native.set_paused(False)
    tpscope.stop()
    if out_json:
        with open(out_json, "w") as f:
            json.dump({"rows": rows, "spent": spent} if entries else rows, f)


def _print_entries(rows, spent):
    steps = len(rows) - ENTRIES_WARMUP
    step_cpu = statistics.median(r[2] for r in rows[ENTRIES_WARMUP:])
    print("rank 0, %d steps timed (the first %d not), recording every step; main-thread CPU per step %.2f ms (median)"
          % (steps, ENTRIES_WARMUP, step_cpu * 1e3))
    print("%-66s %10s %9s %9s" % ("entry point (thread CPU inside it)", "calls/step", "µs/call", "ms/step"))
    total = 0.0
    for label, (ns, calls) in sorted(spent.items(), key=lambda kv: -kv[1][0]):
        if not label.startswith(" "):
            total += ns / steps / 1e6
        print("%-66s %10.1f %9.2f %9.3f" % (label, calls / steps, ns / max(calls, 1) / 1e3, ns / steps / 1e6))
    print("%-66s %10s %9s %9.3f  (%.2f %% of the step's main-thread CPU)" % ("total", "", "", total,
                                                                             total / (step_cpu * 1e3) * 100))
    # Every entry a recorded step of a TP program passes through must have been timed there: a renamed function
    # would otherwise leave its time out of the table without a word.
    silent = [label for label in ENTRY_LABELS if spent.get(label, [0, 0])[1] < steps]
    if silent:
        raise SystemExit("FAIL: entry points timed fewer times than steps: " + "; ".join(silent))


def main():
    argv = sys.argv[1:]
    if argv and argv[0] == "--rank-main":  # internal: one rank (argv: --rank-main OUT OFF SCRIPT ARGS...)
        _rank_main(argv[1], set(filter(None, argv[2].split(","))), argv[3:])
        return
    extra = None
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build whose python/ holds tpscope")
    ap.add_argument("--sample", default=SAMPLE)
    ap.add_argument("--steps", type=int, default=152)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--off", default="", help="parts left out of the ON side too: " + ", ".join(PARTS))
    ap.add_argument("--entries", action="store_true",
                    help="record every step and time rank 0's entry points instead (thread CPU per call)")
    a = ap.parse_args(argv)
    off = [p for p in a.off.split(",") if p]
    unknown = [p for p in off if p not in PARTS]
    if unknown:
        ap.error("--off %s: expected some of %s" % (",".join(unknown), ", ".join(PARTS)))
    extra = DEFAULT_ARGS if extra is None else extra
    package = os.path.abspath(os.path.join(a.build, "python"))
    if not os.path.isdir(os.path.join(package, "tpscope")):
        sys.exit("missing %s/tpscope: cmake --build %s --target tpscope_python_native" % (package, a.build))
    import torch
    print("%s  %s  torch %s  load average %s" % (datetime.datetime.now(datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC"), socket.gethostname(), torch.__version__, "%.2f %.2f %.2f" % os.getloadavg()))
    print("sample %s %s; nproc %d (TP = %d); %d steps %s%s" % (
        os.path.relpath(a.sample, ROOT), " ".join(extra), a.nproc, a.nproc, a.steps,
        "recording every step, entry points timed" if a.entries else "alternating ON/OFF",
        "; left out: " + ", ".join(off) if off else ""))
    with tempfile.TemporaryDirectory() as tmp:
        port = overhead_stats.free_port()
        out = os.path.join(tmp, "rank0.json")
        procs = []
        for rank in range(a.nproc):
            env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       RANK=str(rank), WORLD_SIZE=str(a.nproc), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(a.nproc), TPSCOPE_SAMPLE_DEVICE="cpu", TPSCOPE_TP=str(a.nproc),
                       TPSCOPE_OUT=os.path.join(tmp, "run"),
                       PYTHONPATH=os.pathsep.join(filter(None, [package, os.environ.get("PYTHONPATH")])))
            for k in ("TPSCOPE_HEALTH", "TPSCOPE_INJECT"):
                env.pop(k, None)
            cmd = [sys.executable, os.path.abspath(__file__), "--rank-main", out if rank == 0 else "",
                   ",".join(off + (["entries"] if a.entries else [])),
                   os.path.abspath(a.sample), "--steps", str(a.steps)] + extra
            procs.append(subprocess.Popen(cmd, env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                          text=True))
        for p in procs:
            _, err = p.communicate(timeout=1800)
            if p.returncode != 0:
                raise SystemExit("a rank failed (%d): %s" % (p.returncode, err[-2000:]))
        with open(out) as f:
            rows = json.load(f)
        if a.entries:
            _print_entries(rows["rows"], rows["spent"])
            return
        # What was measured is what was recorded: one step_stats row per ON step on rank 0, none for an OFF step.
        import sqlite3
        db = sqlite3.connect("file:%s?mode=ro" % os.path.join(tmp, "run", "rank-0.db"), uri=True)
        recorded = db.execute("SELECT COUNT(*) FROM step_stats").fetchone()[0]
        collectives = db.execute("SELECT COUNT(*) FROM collectives").fetchone()[0]
        # Only ON steps count steps, so an OFF step's collectives, were they recorded, would double an ON step's.
        per_step = [n for (n,) in db.execute("SELECT COUNT(*) FROM collectives WHERE step > 1 GROUP BY step "
                                             "ORDER BY step")][:-1]  # the last step may be cut short
        db.close()
        if per_step and max(per_step) > 1.5 * min(per_step):
            raise SystemExit("FAIL: collectives recorded per step %s: OFF steps recorded" % per_step[:8])
        on_steps = sum(1 for r in rows if r[0])
        print("rank 0 recorded %d steps (%d ON, %d OFF) and %d collective records" % (
            recorded, on_steps, len(rows) - on_steps, collectives))
        if recorded != on_steps or on_steps != (len(rows) + 1) // 2:
            raise SystemExit("FAIL: the recording did not follow the ON/OFF alternation")
        rows = rows[a.warmup:]
    for k, label in ((1, "wall"), (2, "main-thread CPU"), (3, "process CPU")):
        on = [r[k] for r in rows if r[0]]
        off_side = [r[k] for r in rows if not r[0]]
        paired = [rows[i][k] - rows[i + 1][k] for i in range(len(rows) - 1) if rows[i][0] and not rows[i + 1][0]]
        lo, hi = overhead_stats.ratio_ci(paired)  # ON minus the OFF step after it: a bootstrap CI of the median
        mo, mf = statistics.median(on), statistics.median(off_side)
        print("%-16s ON %7.2f ms  OFF %7.2f ms  medians %+6.2f ms (%+.2f %%)  paired %+6.2f ms (%+.2f %%; 95 %% CI "
              "%+.2f … %+.2f ms), %d pairs" % (label, mo * 1e3, mf * 1e3, (mo - mf) * 1e3, (mo / mf - 1) * 100,
                                               statistics.median(paired) * 1e3,
                                               statistics.median(paired) / mf * 100, lo * 1e3, hi * 1e3,
                                               len(paired)))
    print("load average at the end: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
