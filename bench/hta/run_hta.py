#!/usr/bin/env python3
"""tpscope side by side with Holistic Trace Analysis (HTA) on the same Kineto traces (issue #29 §3).

For each trace set — the shared HTA traces in ../shared/testdata/kineto and trace sets that bench/hta/gen_kineto.py
generates (--gen RANKSxSTEPS, default 8x10 and 64x100) — this runs, alternately and --runs times:
  tpscope: `tpscope import kineto FILES -o run.db`, `tpscope report --json run.db`, `tpscope diagnose --json run.db`
  HTA:     TraceAnalysis(trace_dir) (parse + align + filter), get_temporal_breakdown, get_comm_comp_overlap,
           get_potential_stragglers (num_candidates=1) and get_idle_time_breakdown (its default: rank 0)
and prints the wall time and peak memory of each (HTA in its own virtual environment, .venv-hta, with the Python
start-up and imports a user pays; tpscope's three commands one after another), their ratios, and both answers side
by side:
  compute     HTA compute_time        tpscope compute_ns          same definition (∪ non-NCCL, non-memory kernels)
  non-compute HTA non_compute_time    tpscope exposed_comm + other  same: GPU busy with no compute kernel running
  busy        HTA kernel_time − idle  tpscope step − idle         same: ∪ of all GPU work
  overlap %   HTA comp_comm_overlap   tpscope (comm − exposed) / comm
  idle        HTA: [first kernel, last kernel] − busy; tpscope: the ProfilerStep windows − busy (different windows)
  stragglers  HTA: the rank whose last long ncclKernel* starts latest; tpscope: diagnose's straggler findings
HTA leaves the last ProfilerStep out by default (its kernels may outlive the profiler's window); tpscope counts
every step, so tpscope's per-step rows are summed over the steps HTA kept. docs/formats.md ("HTA side by side")
says where the definitions differ and why.

Time: wall clock of the whole process (tree). Memory: the peak of the summed resident set of the process tree,
sampled every 50 ms from /proc, and at least the tool's own ru_maxrss as /usr/bin/time reports it (a child forked
from this Python process would count the Python image before its exec) — HTA parses ranks in a fork pool, tpscope
in threads of one process. Beside it, the sampled peak of the tree's anonymous resident memory (RssAnon: heaps and
stacks; what a mapped file or a shared library holds is left out), the memory no other process or the kernel's page
cache could have. A run of HTA past --hta-timeout seconds or --hta-max-gib of memory
is stopped and recorded as capped (the table then says "> X").

Set-up: HTA must be installed by `./scripts/setup --hta` (it makes .venv-hta; nothing is downloaded here).
Usage:
  python3 bench/hta/run_hta.py [--runs 3] [--gen 8x10,64x100] [--no-shared] [--work DIR] [--out results.json]
                               [--tpscope build/cli/tpscope] [--hta-timeout 480] [--hta-max-gib 12]
Exit: 0 done; 2 a tool failed on a set or HTA is not installed.
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "testdata", "kineto")
SHARED_SETS = {  # one set per job: the two trace_filter_sampled files are ranks 0 and 1 of one run
    "hta:cpu_only_rank-34": ["cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"],
    "hta:nccl_parser_config": ["nccl_parser_config_nccl_data.json.gz"],
    "hta:negative_queue_length": ["negative_queue_length_values_check_rank0.json.gz"],
    "hta:trace_filter_sampled (2 ranks)": ["trace_filter_sampled_rank-0.json.gz",
                                           "trace_filter_sampled_rank-1.json.gz"],
}


# ----------------------------------------------------------------------------------------------------------------
# HTA worker: runs inside .venv-hta
def hta_worker(trace_dir, out_path):
    t = {}
    t0 = time.monotonic()
    import logging
    from hta.trace_analysis import TraceAnalysis
    logging.getLogger("hta").setLevel(logging.ERROR)
    t["import_s"] = time.monotonic() - t0
    res = {"errors": {}}
    t1 = time.monotonic()
    try:
        ta = TraceAnalysis(trace_dir=trace_dir)
    except Exception as e:  # HTA cannot read this set at all: say so, with the time it took
        res["errors"]["load"] = f"{type(e).__name__}: {e}"
        res["phases"] = {**t, "load_s": time.monotonic() - t1}
        with open(out_path, "w") as f:
            json.dump(res, f)
        return
    t["load_s"] = time.monotonic() - t1

    def step(name, fn):
        s = time.monotonic()
        try:
            return fn()
        except Exception as e:  # recorded, not fatal: an analysis HTA cannot do on these traces is an answer too
            res["errors"][name] = f"{type(e).__name__}: {e}"
            return None
        finally:
            t[name + "_s"] = time.monotonic() - s

    tb = step("temporal_breakdown", lambda: ta.get_temporal_breakdown(visualize=False))
    if tb is not None:
        res["temporal"] = {int(r["rank"]): {k: float(r[k]) for k in
                                            ("idle_time(us)", "compute_time(us)", "non_compute_time(us)",
                                             "kernel_time(us)")} for _, r in tb.iterrows()}
    ov = step("comm_comp_overlap", lambda: ta.get_comm_comp_overlap(visualize=False))
    if ov is not None:
        res["overlap_pct"] = {int(r["rank"]): (None if r["comp_comm_overlap_pctg"] != r["comp_comm_overlap_pctg"]
                                               else float(r["comp_comm_overlap_pctg"])) for _, r in ov.iterrows()}
    steps = step("profiler_steps", lambda: ta.get_profiler_steps())
    res["steps"] = [int(s) for s in steps] if steps is not None else None
    st = step("stragglers", lambda: ta.get_potential_stragglers(num_candidates=1))
    res["stragglers"] = [int(r) for r in st] if st is not None else None
    ranks = sorted(ta.t.get_all_traces().keys())
    idle = step("idle_time_breakdown", lambda: ta.get_idle_time_breakdown(ranks=[ranks[0]], visualize=False)[0])
    if idle is not None:
        res["idle_rank"] = int(ranks[0])
        res["idle_breakdown"] = {str(c): float(v) for c, v in idle.groupby("idle_category")["idle_time"].sum().items()}
    t["total_in_process_s"] = time.monotonic() - t0
    res["phases"] = t
    res["ranks"] = [int(r) for r in ranks]
    with open(out_path, "w") as f:
        json.dump(res, f)


# ----------------------------------------------------------------------------------------------------------------
# Measuring a process tree
def _tree(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def _rss(pid):
    """(resident bytes, of them anonymous: the heap and stacks, what no file backs) of one process."""
    try:
        with open(f"/proc/{pid}/status") as f:
            kb = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f if line.startswith("Rss"))}
        return kb.get("RssAnon", 0) * 1024 + kb.get("RssFile", 0) * 1024 + kb.get("RssShmem", 0) * 1024, \
            kb.get("RssAnon", 0) * 1024
    except (OSError, IndexError, ValueError):
        return 0, 0


def measured(cmd, timeout=None, max_bytes=None, stdout=None):
    """Runs cmd; returns dict(wall_s, peak_bytes, anon_peak_bytes, rc, capped). Peak: sampled tree sum, at least
    wait4's maxrss; anon_peak_bytes: the sampled peak of the tree's anonymous resident memory alone."""
    # /usr/bin/time (a small C program) forks and execs the tool and reports its ru_maxrss: the tool's own peak.
    # wait4 on a child forked from this Python process would count the forked Python image (~30 MB) before the exec.
    gnu_time = os.access("/usr/bin/time", os.X_OK)
    hwm = tempfile.NamedTemporaryFile(prefix="run_hta-maxrss-", delete=False)
    hwm.close()
    if gnu_time:
        cmd = ["/usr/bin/time", "-q", "-f", "%M", "-o", hwm.name, *cmd]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=stdout or subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    peak, anon_peak, capped, done = 0, 0, None, threading.Event()
    err = []
    threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True).start()

    def sample():
        nonlocal peak, anon_peak, capped
        while not done.is_set():
            sizes = [_rss(q) for q in _tree(p.pid)]
            total = sum(r for r, _ in sizes)
            peak = max(peak, total)
            anon_peak = max(anon_peak, sum(a for _, a in sizes))
            if max_bytes and total > max_bytes and capped is None:
                capped = f"memory > {max_bytes / 2**30:.0f} GiB"
                os.killpg(p.pid, signal.SIGKILL)
            if timeout and time.monotonic() - t0 > timeout and capped is None:
                capped = f"time > {timeout:.0f} s"
                os.killpg(p.pid, signal.SIGKILL)
            done.wait(0.05)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    done.set()
    th.join()
    try:
        os.killpg(p.pid, signal.SIGKILL)  # a pool worker left behind
    except ProcessLookupError:
        pass
    time.sleep(0.05)
    single = usage.ru_maxrss * 1024
    if gnu_time:
        try:
            with open(hwm.name) as f:
                single = int(f.read().split()[-1]) * 1024
        except (OSError, ValueError, IndexError):
            single = 0  # killed before it wrote: the sampled peak stands
    os.remove(hwm.name)
    # Sampled every 50 ms: a shorter run's anonymous peak is not seen (its RSS peak is, through ru_maxrss).
    return {"wall_s": wall, "peak_bytes": max(peak, single), "anon_peak_bytes": anon_peak if wall >= 0.5 else None,
            "rc": os.waitstatus_to_exitcode(status),
            "capped": capped, "stderr": (err[0] if err else b"").decode(errors="replace")[-2000:]}


# ----------------------------------------------------------------------------------------------------------------
def run_tpscope(tp, files, work):
    db = os.path.join(work, "run.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.remove(db + suffix)
    out = {"wall_s": 0.0, "peak_bytes": 0, "anon_peak_bytes": None, "phases": {}, "peaks": {}}
    rep_path, diag_path = os.path.join(work, "report.json"), os.path.join(work, "diagnose.json")
    for name, cmd, dest in (("import", [tp, "import", "kineto", *files, "-o", db], None),
                            ("report", [tp, "report", "--json", db], rep_path),
                            ("diagnose", [tp, "diagnose", "--json", db], diag_path)):
        with open(dest or os.devnull, "w") as f:
            m = measured(cmd, stdout=f)
        if m["rc"] not in (0, 7):
            sys.exit(f"run_hta: tpscope {name} failed (exit {m['rc']}): {' '.join(cmd)}\n{m['stderr']}")
        out["wall_s"] += m["wall_s"]
        out["peak_bytes"] = max(out["peak_bytes"], m["peak_bytes"])
        if m["anon_peak_bytes"] is not None:
            out["anon_peak_bytes"] = max(out["anon_peak_bytes"] or 0, m["anon_peak_bytes"])
        out["phases"][name + "_s"] = m["wall_s"]
        out["peaks"][name + "_bytes"] = m["peak_bytes"]
    with open(rep_path) as f:
        out["report"] = json.load(f)
    with open(diag_path) as f:
        out["diagnose"] = json.load(f)
    return out


def run_hta(py, trace_dir, work, timeout, max_bytes):
    res_path = os.path.join(work, "hta.json")
    if os.path.exists(res_path):
        os.remove(res_path)
    m = measured([py, os.path.abspath(__file__), "--hta-worker", trace_dir, res_path], timeout, max_bytes)
    if m["capped"]:
        return {"wall_s": m["wall_s"], "peak_bytes": m["peak_bytes"], "anon_peak_bytes": m["anon_peak_bytes"],
                "capped": m["capped"]}
    if m["rc"] != 0:
        sys.exit(f"run_hta: HTA failed (exit {m['rc']}) on {trace_dir}\n{m['stderr']}")
    with open(res_path) as f:
        r = json.load(f)
    return {"wall_s": m["wall_s"], "peak_bytes": m["peak_bytes"], "anon_peak_bytes": m["anon_peak_bytes"],
            "capped": None, "result": r}


# ----------------------------------------------------------------------------------------------------------------
def compare(tp, hta):
    """Both answers side by side, per rank, over the steps HTA kept."""
    rep, diag = tp["report"], tp["diagnose"]
    steps = set(hta.get("steps") or [])
    lanes = {r["rank"]: r["lanes"] for r in rep["ranks"]}
    per = {}
    for s in rep["steps"]:
        if steps and s["step"] not in steps:
            continue
        a = per.setdefault(s["rank"], dict.fromkeys(("step", "compute", "comm", "exposed", "other", "idle"), 0))
        a["step"] += s["step_ns"] / 1e3
        a["compute"] += s["compute_ns"] / 1e3
        a["comm"] += s["comm_ns"] / 1e3
        a["exposed"] += s["exposed_comm_ns"] / 1e3
        a["other"] += s["other_ns"] / 1e3
        a["idle"] += s["idle_ns"] / 1e3
    rows = []
    for rank in sorted(set(per) | set(int(k) for k in (hta.get("temporal") or {}))):
        h = (hta.get("temporal") or {}).get(str(rank)) or (hta.get("temporal") or {}).get(rank)
        t = per.get(rank)
        ov = (hta.get("overlap_pct") or {}).get(str(rank), (hta.get("overlap_pct") or {}).get(rank))
        row = {"rank": rank, "lanes": lanes.get(rank)}
        if h:
            row["hta"] = {"compute_us": h["compute_time(us)"], "non_compute_us": h["non_compute_time(us)"],
                          "busy_us": h["kernel_time(us)"] - h["idle_time(us)"], "idle_us": h["idle_time(us)"],
                          "window_us": h["kernel_time(us)"], "overlap_pct": ov}
        if t:
            row["tpscope"] = {"compute_us": t["compute"], "non_compute_us": t["exposed"] + t["other"],
                              "busy_us": t["step"] - t["idle"], "idle_us": t["idle"], "window_us": t["step"],
                              "overlap_pct": round(100 * (t["comm"] - t["exposed"]) / t["comm"], 2)
                              if t["comm"] > 0 else None}
        rows.append(row)
    stragglers = sorted({f["rank"] for f in diag.get("findings", []) if f["kind"] == "straggler"
                         and f["severity"] in ("warning", "error", "critical")})
    return {"rows": rows, "tpscope_stragglers": stragglers, "hta_stragglers": hta.get("stragglers"),
            "hta_errors": hta.get("errors", {}), "hta_steps": sorted(steps)}


def agreement(rows, key):
    """Largest |tpscope − HTA| over ranks, relative to HTA's value (None where one side has no number)."""
    worst = None
    for r in rows:
        a, b = (r.get("hta") or {}).get(key), (r.get("tpscope") or {}).get(key)
        if a is None or b is None or r.get("lanes") != "device":  # host lanes: not HTA's GPU-kernel definitions
            continue
        d = abs(b - a) if key == "overlap_pct" else abs(b - a) / max(abs(a), 1e-9)
        worst = d if worst is None else max(worst, d)
    return worst


def fmt_mb(b):
    if b < 2**20:
        return f"{b / 2**10:.0f} kB"
    if b < 10 * 2**20:
        return f"{b / 2**20:.1f} MB"
    return f"{b / 2**20:,.0f} MB" if b < 10 * 2**30 else f"{b / 2**30:.1f} GB"


def main():
    ap = argparse.ArgumentParser(description="tpscope vs Holistic Trace Analysis on the same Kineto traces")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--gen", default="8x10,64x100", help="generated sets RANKSxSTEPS, comma-separated ('' for none)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-shared", action="store_true", help="leave out the shared HTA traces")
    ap.add_argument("--tpscope", default=os.path.join(ROOT, "build", "cli", "tpscope"))
    ap.add_argument("--hta-python", default=os.path.join(ROOT, ".venv-hta", "bin", "python3"))
    ap.add_argument("--hta-timeout", type=float, default=480)
    ap.add_argument("--hta-max-gib", type=float, default=12)
    ap.add_argument("--work", help="folder for the generated traces and run files (default: a temporary one)")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--hta-worker", nargs=2, metavar=("TRACE_DIR", "OUT_JSON"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.hta_worker:
        hta_worker(*a.hta_worker)
        return 0

    if not (os.access(a.hta_python, os.X_OK) and
            subprocess.run([a.hta_python, "-c", "import hta.trace_analysis"], capture_output=True).returncode == 0):
        venv = os.path.dirname(os.path.dirname(a.hta_python))
        sys.exit(f"run_hta: Holistic Trace Analysis is not installed in {venv}; install it with `./scripts/setup --hta` (it makes .venv-hta; this benchmark downloads nothing)")
    if not os.access(a.tpscope, os.X_OK):
        sys.exit(f"run_hta: no tpscope binary at {a.tpscope} (build it, or pass --tpscope)")
    work = a.work or tempfile.mkdtemp(prefix="tpscope-hta-")
    os.makedirs(work, exist_ok=True)

    sets = []  # (name, dir, files, info)
    if not a.no_shared:
        if not os.path.isdir(SHARED):
            sys.exit(f"run_hta: no shared traces at {SHARED} (pass --no-shared)")
        for name, names in SHARED_SETS.items():
            d = os.path.join(work, "shared", name.split(":")[1].split(" ")[0])
            os.makedirs(d, exist_ok=True)
            for n in names:
                link = os.path.join(d, n)
                if not os.path.exists(link):
                    os.symlink(os.path.join(SHARED, n), link)
            files = [os.path.join(d, n) for n in names]
            sets.append((name, d, files, {"ranks": len(files), "steps": None}))
    for spec in filter(None, a.gen.split(",")):
        ranks, steps = (int(x) for x in spec.lower().split("x"))
        d = os.path.join(work, f"gen-r{ranks}-s{steps}-seed{a.seed}")
        info_path = os.path.join(d, "gen.txt")
        if not os.path.exists(info_path):
            shutil.rmtree(d, ignore_errors=True)
            line = subprocess.run([sys.executable, os.path.join(HERE, "gen_kineto.py"), "--ranks", str(ranks),
                                   "--steps", str(steps), "--seed", str(a.seed), "--out", d],
                                  check=True, capture_output=True, text=True).stdout.strip()
            with open(info_path, "w") as f:
                f.write(line)
        with open(info_path) as f:
            kv = dict(x.split("=", 1) for x in f.read().split())
        files = sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".json.gz"))
        sets.append((f"generated {ranks} ranks x {steps} steps", d, files,
                     {"ranks": ranks, "steps": steps, "straggler": int(kv["straggler"]),
                      "events": int(kv["events"]), "json_bytes": int(kv["bytes"])}))

    results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": a.runs,
               "loadavg_start": os.getloadavg(), "sets": []}
    for name, d, files, info in sets:
        results["sets"].append({"name": name, "info": info, "gz_bytes": sum(os.path.getsize(f) for f in files),
                                "tpscope": [], "hta": []})
    for run in range(a.runs):
        for s, (name, d, files, info) in zip(results["sets"], sets):
            w = os.path.join(work, "runs", os.path.basename(d))
            os.makedirs(w, exist_ok=True)
            tp = run_tpscope(a.tpscope, files, w)
            print(f"[{run + 1}/{a.runs}] {name}: tpscope {tp['wall_s']:.2f} s {fmt_mb(tp['peak_bytes'])}",
                  end="", flush=True)
            if s["hta"] and s["hta"][-1].get("capped"):
                ht = None  # capped once: not rerun
            else:
                ht = run_hta(a.hta_python, d, w, a.hta_timeout, a.hta_max_gib * 2**30)
            if ht:
                print(f"; HTA {ht['wall_s']:.2f} s {fmt_mb(ht['peak_bytes'])}"
                      + (f" (stopped: {ht['capped']})" if ht["capped"] else ""), flush=True)
            else:
                print("; HTA not rerun (capped)", flush=True)
            s["tpscope"].append({k: tp[k] for k in ("wall_s", "peak_bytes", "anon_peak_bytes", "phases", "peaks")})
            if ht:
                s["hta"].append({k: ht[k] for k in ("wall_s", "peak_bytes", "anon_peak_bytes", "capped")} |
                                ({"phases": ht["result"]["phases"]} if "result" in ht else {}))
            if run == 0:
                s["answers"] = compare(tp, ht["result"]) if ht and "result" in ht else \
                    compare(tp, {"temporal": None, "steps": None, "stragglers": None})
    results["loadavg_end"] = os.getloadavg()

    # ---- the table ------------------------------------------------------------------------------------------------
    print(f"\nmedians of {a.runs} alternating runs (tpscope: import + report --json + diagnose --json; "
          f"HTA: load + temporal breakdown + comm/comp overlap + stragglers + idle breakdown of rank 0); "
          f"load average {results['loadavg_start'][0]:.1f} → {results['loadavg_end'][0]:.1f}")
    hdr = ("set", "gz", "tpscope s", "tpscope mem", "HTA s", "HTA mem", "HTA/tpscope time", "tpscope/HTA mem",
           "anonymous: tpscope / HTA")
    print("| " + " | ".join(hdr) + " |\n|" + "---|" * len(hdr))
    for s in results["sets"]:
        ts = statistics.median(x["wall_s"] for x in s["tpscope"])
        tm = statistics.median(x["peak_bytes"] for x in s["tpscope"])
        capped = any(x.get("capped") for x in s["hta"])
        hs = statistics.median(x["wall_s"] for x in s["hta"])
        hm = statistics.median(x["peak_bytes"] for x in s["hta"])
        anons = [x["anon_peak_bytes"] for x in s["tpscope"]], [x["anon_peak_bytes"] for x in s["hta"]]
        ta, ha = (statistics.median(a) if a and None not in a else None for a in anons)
        gt = "> " if capped else ""
        s["median"] = {"tpscope_s": ts, "tpscope_bytes": tm, "hta_s": hs, "hta_bytes": hm, "hta_capped": capped,
                       "time_ratio": hs / ts, "mem_ratio": tm / hm, "tpscope_anon_bytes": ta, "hta_anon_bytes": ha}
        anon = f"{fmt_mb(ta)} / {gt}{fmt_mb(ha)} = 1/{ha / ta:.1f}" if ta and ha else "—"
        print(f"| {s['name']} | {fmt_mb(s['gz_bytes'])} | {ts:.2f} | {fmt_mb(tm)} | {gt}{hs:.1f} | {gt}{fmt_mb(hm)} | "
              f"{gt}{hs / ts:.1f}× | {'< ' if capped else ''}1/{hm / tm:.1f} | {anon} |")
    print("\nanswers (µs summed over HTA's steps; tpscope − HTA: the largest difference over ranks)")
    for s in results["sets"]:
        ans = s.get("answers") or {}
        rows = ans.get("rows", [])
        print(f"\n{s['name']}: HTA steps {ans.get('hta_steps')[:3] if ans.get('hta_steps') else '—'}"
              f"{'…' if len(ans.get('hta_steps') or []) > 3 else ''}")
        agree = {}
        for key, label in (("compute_us", "compute"), ("non_compute_us", "non-compute"), ("busy_us", "busy"),
                           ("overlap_pct", "overlap %"), ("idle_us", "idle"), ("window_us", "window")):
            w = agreement(rows, key)
            agree[key] = w
            tot_h = sum((r.get("hta") or {}).get(key) or 0 for r in rows)
            tot_t = sum((r.get("tpscope") or {}).get(key) or 0 for r in rows)
            if key == "overlap_pct":
                n = max(1, len([r for r in rows if (r.get("hta") or {}).get(key) is not None]))
                tot_h, tot_t = tot_h / n, tot_t / max(1, len(rows))
            diff = "—" if w is None else (f"{w:.2f} points" if key == "overlap_pct" else f"{100 * w:.3f} %")
            print(f"  {label:12s} HTA {tot_h:>16,.1f}  tpscope {tot_t:>16,.1f}  max diff {diff}")
        ans["agreement"] = agree
        host = [r["rank"] for r in rows if r.get("lanes") == "host"]
        if host:
            print(f"  ranks {host}: no GPU work, tpscope reads their host lanes (not comparable with HTA's kernels)")
        hp = [x.get("phases") for x in s["hta"] if x.get("phases")]
        if hp:
            ph = {k: statistics.median(p.get(k, 0) for p in hp) for k in hp[0]}
            print("  HTA phases (median s): " + ", ".join(f"{k[:-2]} {v:.2f}" for k, v in ph.items()))
        tph = {k: statistics.median(x["phases"][k] for x in s["tpscope"]) for k in s["tpscope"][0]["phases"]}
        tpk = {k: statistics.median(x["peaks"][k] for x in s["tpscope"]) for k in s["tpscope"][0]["peaks"]}
        print("  tpscope phases (median s): " + ", ".join(f"{k[:-2]} {v:.2f}" for k, v in tph.items())
              + "; peak memory: " + ", ".join(f"{k[:-6]} {fmt_mb(v)}" for k, v in tpk.items()))
        print(f"  stragglers   HTA {ans.get('hta_stragglers')}  tpscope {ans.get('tpscope_stragglers')}"
              + (f"  (injected: rank {s['info']['straggler']})" if s["info"].get("straggler") is not None else ""))
        for k, v in (ans.get("hta_errors") or {}).items():
            print(f"  HTA {k} failed: {v[:160]}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"\nresults: {a.out}")
    if not a.keep and not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
