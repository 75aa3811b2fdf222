#!/usr/bin/env python3
"""Live stall lines, measured (issue #30 §3): how soon `tpscope capture` names an injected fault while the job runs,
and whether it names the right rank and collective; and how many live lines healthy runs print.

Every case is one real `tpscope capture` of tpscope-train (tiny config) or of a Python DTensor program, with a fault
injected at a seeded place (rank, step, phase drawn from --seed):

  hang        TP 2, TP 2 x DP 2     hang:rank=R,step=S,phase=P: rank R never enters a collective; its peers block
  p2p         PP 2, TP 2 x PP 2     the same on a pipeline: a stage's peer blocks in a send/recv
  python      DTensor MLP, TP 2     samples/python/dtensor_mlp.py --skip-collective R:S (a rank skips a forward)
  compute     TP 2, TP 2 x DP 2     slow:rank=R,step=S,ms=6000: rank R is stuck in compute (one span open 6 s) at the
                                    start of step S; its peers block in the step's first collective
  crash       TP 2, TP 2 x DP 2     crash:rank=R,step=S (SIGABRT)
  desync      TP 2                  mismatch:rank=R,step=S,phase=P: rank R's all-reduce carries one element more
  healthy     TP 2, TP 2 x DP 2, PP 2, a plain TP 2: every rank computes --slow-ms longer in every step (slow on
              every rank: each step is a slow whole-job step, as a checkpoint save or an evaluation pass is)

The right line and the fault's moment, from the rank files the capture leaves (each rank's own wall clock: one host):
  hang, p2p, python, compute: a WAITING line for (group G, seq s) that names rank R as "has not entered it" (compute:
    "has not entered it: stuck in compute"), where some peer
    of R in G entered seq s and R's newest seq in G is below s. The fault's moment: the last of the
    peers blocked at (G, s) entering it (enqueue time). A stall line printed before it that names another rank as
    the one missing is a wrong line.
  crash: capture's "rank R (pid N) ended: ..." line; the moment: rank R's recorded end (its crash handler's dump).
  desync: a DESYNC line for the mismatched (G, s) — where Gloo aborts on the size mismatch, capture names it from
    the ranks' dumps as they die, just after its line for the first rank that died; the moment: the last of the
    members entering (G, s).
  healthy: every WAITING / STUCK / DESYNC line is a false line.

Prints per kind: cases, named right, median and worst time from the fault to the right line (a desync with no
DESYNC line: to the abort line, not counted as named), wrong first lines, `abort`: cases whose first line was
capture's crash line for a rank Gloo aborted on the mismatch; and for the healthy runs the false lines. Targets (issue #30): every fault named live with the right rank and
collective, median <= 2 s, worst <= 5 s, 0 false lines.

Usage: python3 bench/live/run_live.py [--build build] [--seed 1] [--per-kind 4] [--stall-after 1.5] [--json FILE]
(build first: cmake --build build --target tpscope tpscope-train tpscope_python_native)
"""
import argparse
import json
import os
import random
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STALL_RE = re.compile(r"^(WAITING|DESYNC|STUCK)\s+(\S+) seq (\d+) \(")
MISSING_RE = re.compile(r"rank (\d+) has not entered it")
ENDED_RE = re.compile(r"rank (\d+) \(pid \d+\) ended: (.*)")


def layouts():
    """kind -> list of (name, capture layout args, world size)."""
    tp2 = ("TP2", ["--nproc", "2", "--tp", "2"], 2)
    tpdp = ("TP2xDP2", ["--nproc", "4", "--tp", "2", "--dp", "2"], 4)
    pp2 = ("PP2", ["--nproc", "2", "--tp", "1", "--pp", "2", "--microbatches", "2"], 2)
    tppp = ("TP2xPP2", ["--nproc", "4", "--tp", "2", "--pp", "2", "--microbatches", "2"], 4)
    return {"hang": [tp2, tpdp], "p2p": [pp2, tppp], "python": [tp2], "compute": [tp2, tpdp], "crash": [tp2, tpdp],
            "desync": [tp2],
            "healthy": [tp2, tpdp, pp2]}


def make_cases(per_kind, seed, slow_ms):
    rng = random.Random(seed)
    cases = []
    lay = layouts()
    for kind in ("hang", "p2p", "python", "compute", "crash", "desync"):
        for i in range(per_kind):
            name, args, world = lay[kind][i % len(lay[kind])]
            rank = rng.randrange(world)
            step = rng.randint(3, 5)
            phase = rng.choice(["fwd", "bwd"])
            if kind in ("hang", "p2p"):
                spec = ["--inject", f"hang:rank={rank},step={step},phase={phase}"]
            elif kind == "compute":
                spec = ["--inject", f"slow:rank={rank},step={step},ms=6000"]
            elif kind == "crash":
                spec = ["--inject", f"crash:rank={rank},step={step}"]
            elif kind == "desync":
                spec = ["--inject", f"mismatch:rank={rank},step={step},phase={phase}"]
            else:
                spec = ["PYTHON", "--skip-collective", f"{rank}:{step}"]
                phase = "fwd"
            cases.append({"kind": kind, "layout": name, "args": args, "world": world, "rank": rank, "step": step,
                          "phase": phase, "spec": spec, "steps": 8})
    for i, (name, args, world) in enumerate(lay["healthy"] + [lay["healthy"][0]]):
        slow = [] if i == len(lay["healthy"]) else [
            x for r in range(world) for x in ("--inject", f"slow:rank={r},ms={slow_ms}")]
        cases.append({"kind": "healthy", "layout": name + ("" if slow else " (no slow step)"), "args": args,
                      "world": world, "rank": -1, "step": -1, "phase": "", "spec": slow, "steps": 5})
    return cases


def run_capture(a, case, out_dir):
    cmd = [os.path.join(a.build, "cli", "tpscope"), "capture"] + case["args"] + [
        "--out", out_dir, "--hang-timeout", str(a.hang_timeout), "--grace", "1",
        "--stall-after", str(a.stall_after), "--steps", str(case["steps"])]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if case["spec"] and case["spec"][0] == "PYTHON":
        env["PYTHONPATH"] = os.path.join(a.build, "python")
        cmd += ["--", a.python, os.path.join(ROOT, "samples", "python", "dtensor_mlp.py"), "--steps", "8",
                "--timeout", "30"] + case["spec"][1:]
    else:
        cmd += ["--config", os.path.join(ROOT, "samples", "configs", "tiny.json")] + case["spec"]
    lines = []
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True, bufsize=1)

    def reader():
        for line in p.stdout:
            lines.append((time.time(), line.rstrip("\n")))
    t = threading.Thread(target=reader)
    t.start()
    try:
        status = p.wait(timeout=300)
    except subprocess.TimeoutExpired:
        p.kill()
        status = p.wait()
    t.join()
    return status, lines


def rank_files(out_dir, world):
    dbs = {}
    for r in range(world):
        f = os.path.join(out_dir, f"rank-{r}.db")
        if os.path.exists(f):
            dbs[r] = sqlite3.connect(f"file:{f}?mode=ro", uri=True)
    return dbs


def epoch(db):
    row = db.execute("SELECT value FROM meta WHERE key = 'epoch_unix_ns'").fetchone()
    return int(row[0]) if row else 0


def blocked_sites(dbs, culprit):
    """{(group, seq): unix time (s) the last peer entered it} for the collectives peers of `culprit` entered at a seq
    the culprit never reached."""
    groups = {}
    for db in dbs.values():
        for name, ranks in db.execute("SELECT name, ranks FROM process_groups"):
            groups[name] = [int(x) for x in ranks.split(",") if x.strip()]
    sites = {}
    for g, members in groups.items():
        if culprit not in members or culprit not in dbs:
            continue
        mine = dbs[culprit].execute("SELECT max(seq) FROM collectives WHERE group_name = ?", (g,)).fetchone()[0]
        mine = -1 if mine is None else mine
        for r in members:
            if r == culprit or r not in dbs:
                continue
            # Any state: a buffered send can complete later without the culprit's recv, yet the culprit never
            # entered that seq.
            for seq, enq in dbs[r].execute("SELECT seq, enqueue_ns FROM collectives WHERE group_name = ? AND "
                                           "seq > ?", (g, mine)):
                t = (epoch(dbs[r]) + enq) * 1e-9
                sites[(g, seq)] = max(sites.get((g, seq), 0), t)
    return sites


def late_sites(dbs, culprit, late_s=1.0):
    """{(group, seq): unix time (s) the last peer entered it} for the collectives `culprit` entered more than `late_s`
    after all its peers (a rank stuck in compute enters late, so every collective completes in the end)."""
    enq = {}  # (group, seq) -> {rank: unix s}
    for r, db in dbs.items():
        for g, seq, e in db.execute("SELECT group_name, seq, enqueue_ns FROM collectives"):
            enq.setdefault((g, seq), {})[r] = (epoch(db) + e) * 1e-9
    sites = {}
    for site, by_rank in enq.items():
        if culprit not in by_rank or len(by_rank) < 2:
            continue
        peers = max(t for r, t in by_rank.items() if r != culprit)
        if by_rank[culprit] - peers > late_s:
            sites[site] = peers
    return sites


def mismatch_sites(dbs):
    """{(group, seq): when the last member entered} for collectives whose members recorded different numel."""
    rows = {}
    for r, db in dbs.items():
        for g, seq, numel, enq in db.execute("SELECT group_name, seq, numel, enqueue_ns FROM collectives"):
            rows.setdefault((g, seq), []).append((numel, (epoch(db) + enq) * 1e-9))
    return {k: max(t for _, t in v) for k, v in rows.items() if len({n for n, _ in v}) > 1}


def judge(case, status, lines, dbs):
    """-> dict: named (bool), latency_s, wrong (stall lines before the right one that blame someone else), false."""
    stall_lines = [(t, l) for t, l in lines if STALL_RE.match(l)]
    res = {"status": status, "named": False, "latency_s": None, "wrong": 0, "false": 0, "line": "", "abort": False}
    res["tail"] = [l for _, l in lines[-6:]]  # what capture said last (kept in --json)
    res["live"] = [l for _, l in lines if STALL_RE.match(l) or l.startswith("RESUMED")]
    kind, culprit = case["kind"], case["rank"]
    if kind == "healthy":
        res["false"] = len(stall_lines)
        res["named"] = status == 0
        res["line"] = stall_lines[0][1] if stall_lines else ""
        return res
    if kind == "crash":
        if culprit in dbs:
            row = dbs[culprit].execute("SELECT end_ns FROM ranks").fetchone()
            t0 = (epoch(dbs[culprit]) + row[0]) * 1e-9 if row and row[0] is not None else None
        else:
            t0 = None
        for t, l in lines:
            m = ENDED_RE.search(l)
            if m:
                if int(m.group(1)) == culprit and t0 is not None:
                    res.update(named=True, latency_s=t - t0, line=l)
                else:
                    res["wrong"] += 1
                    res["line"] = l
                break
        return res
    if kind == "desync":
        sites = mismatch_sites(dbs)
        for t, l in lines:
            m = STALL_RE.match(l)
            if m and m.group(1) == "DESYNC" and (m.group(2), int(m.group(3))) in sites:
                res.update(named=True, latency_s=t - sites[(m.group(2), int(m.group(3)))], line=l)
                break
            if m:
                res["wrong"] += 1
        for t, l in lines:  # what came first: the abort (Gloo's, on the size mismatch) or the DESYNC line
            e = ENDED_RE.search(l)
            if e and sites:
                res.update(abort=res["latency_s"] is None or t - max(sites.values()) < res["latency_s"],
                           abort_s=t - max(sites.values()), abort_names_culprit=int(e.group(1)) == culprit)
                if not res["named"]:
                    res.update(latency_s=t - max(sites.values()), line=l + "  [the abort, no DESYNC line]")
                break
        return res
    sites = late_sites(dbs, culprit) if kind == "compute" else blocked_sites(dbs, culprit)
    for t, l in stall_lines:
        m = STALL_RE.match(l)
        site = (m.group(2), int(m.group(3)))
        missing = [int(x) for x in MISSING_RE.findall(l)]
        if m.group(1) == "WAITING" and site in sites and culprit in missing and "a consequence" not in l and (
                kind != "compute" or f"rank {culprit} has not entered it: stuck in compute" in l):
            res.update(named=True, latency_s=t - sites[site], line=l)
            break
        if culprit not in missing and "a consequence" not in l:  # a consequence line blames no one
            res["wrong"] += 1
    if not res["named"]:
        res["line"] = stall_lines[0][1] if stall_lines else "(no stall line; sites: %s)" % sorted(sites)
    return res


def summarize(results):
    print(f"\n{'kind':<9} {'cases':>5} {'named':>5} {'median s':>9} {'worst s':>8} {'wrong':>5} {'false':>5} "
          f"{'abort':>5}")
    table = []
    for kind in ("hang", "p2p", "python", "compute", "crash", "desync", "healthy"):
        rs = [r for r in results if r["kind"] == kind]
        if not rs:
            continue
        lat = [r["latency_s"] for r in rs if r["latency_s"] is not None]
        med = statistics.median(lat) if lat else None
        worst = max(lat) if lat else None
        row = {"kind": kind, "cases": len(rs), "named": sum(r["named"] for r in rs), "median_s": med,
               "worst_s": worst, "wrong": sum(r["wrong"] for r in rs), "false": sum(r["false"] for r in rs),
               "abort": sum(r["abort"] for r in rs),
               "layouts": sorted({r["layout"] for r in rs})}
        table.append(row)
        f = (lambda v: "-" if v is None else f"{v:.2f}")
        print(f"{kind:<9} {row['cases']:>5} {row['named']:>5} {f(med):>9} {f(worst):>8} {row['wrong']:>5} "
              f"{row['false']:>5} {row['abort']:>5}   {', '.join(row['layouts'])}")
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--python", default=os.path.join(ROOT, ".venv", "bin", "python3"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--per-kind", type=int, default=4, help="fault cases per kind")
    ap.add_argument("--stall-after", type=float, default=1.5)
    ap.add_argument("--hang-timeout", type=float, default=6)
    ap.add_argument("--slow-ms", type=int, default=2500, help="healthy runs: extra compute per step on every rank")
    ap.add_argument("--only", default="", help="comma-separated kinds to run")
    ap.add_argument("--json", default="", help="also write every case's result here")
    a = ap.parse_args()
    cases = make_cases(a.per_kind, a.seed, a.slow_ms)
    if a.only:
        cases = [c for c in cases if c["kind"] in a.only.split(",")]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(cases):
            out_dir = os.path.join(tmp, f"case{i}")
            start = time.time()
            status, lines = run_capture(a, case, out_dir)
            dbs = rank_files(out_dir, case["world"])
            r = judge(case, status, lines, dbs)
            for db in dbs.values():
                db.close()
            r.update(kind=case["kind"], layout=case["layout"], rank=case["rank"], step=case["step"],
                     phase=case["phase"], spec=" ".join(case["spec"]), wall_s=time.time() - start)
            results.append(r)
            lat = "-" if r["latency_s"] is None else f"{r['latency_s']:.2f} s"
            print(f"[{i + 1}/{len(cases)}] {case['kind']:<7} {case['layout']:<22} rank {case['rank']} step "
                  f"{case['step']} {case['phase']:<3}: exit {status}, named {r['named']}, {lat}, wrong {r['wrong']}, "
                  f"false {r['false']} ({r['wall_s']:.0f} s)\n    {r['line'][:200]}", flush=True)
    table = summarize(results)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cases": results, "table": table}, f, indent=1)
    ok = all(r["named"] for r in results) and all(r["false"] == 0 for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
