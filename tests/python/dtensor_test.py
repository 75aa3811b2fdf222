#!/usr/bin/env python3
"""`tpscope capture -- python3 samples/python/dtensor_mlp.py`: PyTorch's own TP API (DTensor) captured unchanged
(label multiproc).

    dtensor_test.py --case healthy|nan|replay|hang --tpscope BIN --python PY --sample dtensor_mlp.py --work DIR

healthy  the functional collectives DTensor issues are recorded on both ranks with the same (group, seq, op), all
         completed, with call sites in module terms (RowwiseParallel's forward all-reduce per block); grad_stats rows
         are the local shards, and an independent check: the shards' norms of a Shard parameter combine (root sum of
         squares over the ranks) to the norm the same program records at world size 1, a Replicate parameter's norm
         equals it on each rank; meta param_placements says which mesh dimension shards each parameter; the
         diagnosis has nothing of warning or worse
nan      rank 1 puts a NaN into block 1's hidden activation at step 3: nan_origin names rank 1, step 3, layer 1
replay   the same NaN with the sample's step given to tpscope (--replay-hook): the replay before step 3's update
         names rank 1's operator in block 1's forward — its first bad value made there, not arrived by DTensor's
         functional all-reduce as rank 0's did — verdict reproducible, hung under the origin
hang     rank 0 stalls before step 3: the hang names rank 0 as the one that never entered, and the collective; the
         live WAITING line names the same collective and ranks before the watchdog fires
"""

import argparse
import json
import math
import os
import sqlite3
import subprocess
import sys

STEPS = 4
ARGS = ["--steps", str(STEPS), "--dim", "32", "--hidden", "64", "--timeout", "8"]


def fail(message, output=""):
    sys.stderr.write("FAIL: %s\n" % message)
    if output:
        sys.stderr.write("---- output ----\n%s\n" % output[-6000:])
    sys.exit(1)


def capture(args, out, nproc, extra, fault_args, expect_status):
    cmd = [args.tpscope, "capture", "--nproc", str(nproc), "--out", out] + extra + \
          ["--", args.python, args.sample] + ARGS + fault_args
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=100)
    logs = ""
    for r in range(nproc):
        path = os.path.join(out, "logs", "rank-%d.log" % r)
        if os.path.exists(path):
            logs += "\n---- rank %d log ----\n" % r + open(path).read()[-3000:]
    if p.returncode != expect_status:
        fail("capture exited %d, expected %d\n%s" % (p.returncode, expect_status, " ".join(cmd)), p.stdout + logs)
    print(p.stdout)
    return os.path.join(out, "run.db"), p.stdout + logs


def diagnose(args, run):
    p = subprocess.run([args.tpscope, "diagnose", run, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=60)
    if p.returncode != 0:
        fail("tpscope diagnose exited %d: %s" % (p.returncode, p.stderr))
    return json.loads(p.stdout)["findings"]


def open_db(run):
    return sqlite3.connect("file:%s?mode=ro" % run, uri=True)


def check_healthy(args):
    run, log = capture(args, os.path.join(args.work, "tp2"), 2, [], [], 0)
    db = open_db(run)
    per_rank = [db.execute("SELECT group_name, seq, op, state FROM collectives WHERE rank = ? AND op = 'all_reduce' "
                           "ORDER BY group_name, seq", (r,)).fetchall() for r in (0, 1)]
    if per_rank[0] != per_rank[1] or not per_rank[0]:
        fail("the ranks' all-reduces differ: %s vs %s" % per_rank, log)
    if any(state != "completed" for *_, state in per_rank[0]):
        fail("functional collectives left uncompleted: %s" % per_rank[0], log)
    sites = {s for (s,) in db.execute("SELECT DISTINCT callsite FROM collectives WHERE op = 'all_reduce'")}
    for want in ("blocks.0 forward all-reduce", "blocks.1 forward all-reduce"):
        if want not in sites:
            fail("no all-reduce at %r among %s" % (want, sites), log)
    forward = db.execute("SELECT count(*) FROM collectives WHERE rank = 0 AND callsite = 'blocks.0 forward "
                         "all-reduce'").fetchone()[0]
    if forward != STEPS:
        fail("blocks.0's forward all-reduce recorded %d times in %d steps" % (forward, STEPS), log)
    meta = dict(db.execute("SELECT key, value FROM meta WHERE key = 'param_placements'").fetchall())
    placements = json.loads(meta.get("param_placements", "{}"))
    if placements.get("blocks.0.in_proj.weight") != "tp:S(0)" or placements.get("blocks.0.out_proj.weight") != \
            "tp:S(1)":
        fail("param_placements: %s" % placements, log)
    numel = dict(db.execute("SELECT param, numel FROM grad_view WHERE rank = 1 AND step = 1").fetchall())
    if numel.get("blocks.0.in_proj.weight") != 64 * 32 // 2:
        fail("blocks.0.in_proj.weight's local shard: %s elements, expected %d" % (numel, 64 * 32 // 2), log)
    bad = [f for f in diagnose(args, run) if f["severity"] in ("warning", "error", "critical")]
    if bad:
        fail("a healthy run has findings: %s" % json.dumps(bad, indent=1), log)

    # The same program at world size 1: the whole gradients, step 1 (before the updates could differ in rounding).
    run1, log1 = capture(args, os.path.join(args.work, "tp1"), 1, [], [], 0)
    whole = dict(open_db(run1).execute("SELECT param, l2_norm FROM grad_view WHERE step = 1").fetchall())
    shards = {}
    for rank, param, norm in db.execute("SELECT rank, param, l2_norm FROM grad_view WHERE step = 1"):
        shards.setdefault(param, {})[rank] = norm
    for param, by_rank in shards.items():
        layout = placements.get(param, "")
        if "S(" in layout:
            got = math.sqrt(sum(n * n for n in by_rank.values()))
        else:
            got = by_rank[0]
            if not math.isclose(by_rank[0], by_rank[1], rel_tol=1e-5):
                fail("replicated %s differs between the ranks: %s" % (param, by_rank), log)
        if not math.isclose(got, whole[param], rel_tol=1e-4, abs_tol=1e-7):
            fail("%s (%s): the shards combine to %.7g, world size 1 records %.7g" % (param, layout, got,
                                                                                     whole[param]), log + log1)


def check_nan(args):
    run, log = capture(args, os.path.join(args.work, "run"), 2, [], ["--nan-at", "1:3:1"], 0)
    origin = [f for f in diagnose(args, run) if f["kind"] == "nan_origin"]
    if not origin:
        fail("no nan_origin finding", log)
    f = origin[0]
    if (f.get("rank"), f.get("step"), f.get("layer")) != (1, 3, 1):
        fail("nan_origin names rank %s step %s layer %s, expected rank 1 step 3 layer 1" %
             (f.get("rank"), f.get("step"), f.get("layer")), log)


def check_replay(args):
    run, log = capture(args, os.path.join(args.work, "run"), 2, [], ["--nan-at", "1:3:1", "--replay-hook"], 0)
    db = sqlite3.connect("file:%s?mode=ro" % run, uri=True)
    alerts = db.execute("SELECT rank, step, evidence FROM alerts WHERE kind = 'replay'").fetchall()
    if len(alerts) != 1 or alerts[0][:2] != (1, 3):
        fail("replay alerts: %s" % alerts, log)
    ev = json.loads(alerts[0][2])
    op = ev.get("op", {})
    if ev.get("verdict") != "reproducible" or op.get("span") != "blocks.1" or op.get("pass") != "forward" \
            or op.get("received"):
        fail("replay verdict: %s" % json.dumps(ev, indent=1), log)
    findings = diagnose(args, run)
    replays = [f for f in findings if f["kind"] == "replay"]
    if len(replays) != 1 or (replays[0]["rank"], replays[0]["step"]) != (1, 3):
        fail("replay findings: %s" % json.dumps(replays, indent=1), log)


def check_hang(args):
    run, log = capture(args, os.path.join(args.work, "run"), 2, ["--hang-timeout", "5"], ["--skip-collective", "0:3"],
                       3)
    hangs = [f for f in diagnose(args, run) if f["kind"] == "hang" and f["severity"] == "critical"]
    if len(hangs) != 1:
        fail("expected one critical hang: %s" % hangs, log)
    h = hangs[0]
    c = h.get("collective", {})
    if h.get("rank") != 0 or c.get("group") != "world" or "never entered" not in h["message"]:
        fail("the hang names rank %s, %s: %s; expected rank 0 never entering" % (h.get("rank"), c, h["message"]),
             log)
    if "blocks.0 forward all-reduce" not in h["message"]:
        fail("the hang's message lacks the call site: %s" % h["message"], log)
    # Named live first, seconds after rank 1 blocked, before the watchdog's 5 s.
    live = "WAITING  world seq %d (" % c.get("seq", -1)
    at, watchdog = log.find(live), log.find("no progress for 5 s")
    if at < 0 or watchdog < 0 or at > watchdog:
        fail("no live line %r before the watchdog" % live, log)
    line = log[at:log.find("\n", at)]
    if "rank 1 blocked" not in line or "rank 0 has not entered it" not in line:
        fail("the live line names the wrong ranks: %s" % line, log)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--case", choices=["healthy", "nan", "replay", "hang"], required=True)
    p.add_argument("--tpscope", required=True)
    p.add_argument("--python", required=True)
    p.add_argument("--sample", required=True)
    p.add_argument("--work", required=True)
    args = p.parse_args()
    os.makedirs(args.work, exist_ok=True)
    {"healthy": check_healthy, "nan": check_nan, "replay": check_replay, "hang": check_hang}[args.case](args)
    print("PASS python_dtensor_%s" % args.case)


if __name__ == "__main__":
    main()
