#!/usr/bin/env python3
"""`tpscope capture -- python3 samples/python/tp_train.py` at TP=2, and what the diagnosis says (label multiproc).

    capture_test.py --case healthy|nan|skip|stop|trace|replay|transient|hang --tpscope BIN --python PY --sample tp_train.py --work DIR

healthy  exit 0; every kind of record is there (module spans in both phases, TP collectives with their per-group
         sequence numbers, grad_stats, step_stats, rank coordinates); the diagnosis has nothing of warning or worse
nan      rank 1 puts a NaN into layer 1's MLP activation at step 3; the row-parallel all-reduce spreads it to rank 0:
         nan_origin names rank 1, step 3, layer 1 (from the nonfinite_activation alert's time, not a guess)
skip     the same NaN under --on-nonfinite skip-step: every rank votes, step 3's update is dropped on both ranks (the
         step recorded as skipped, the parameters left as they were), the run goes on to its last step with finite
         losses and exits 0
stop     the same NaN under --on-nonfinite stop: every rank votes (an int64 all-reduce over world each step), stops
         at step 3 with status 5, the step recorded as skipped
trace    the same NaN under --on-nonfinite trace-ops: the run goes on (warn), and the op check armed after step 3
         names, once per rank, the first operator of step 4 whose output is NaN — the embedding lookup, whose weight
         the NaN update of step 3 left NaN — with the parameter that carried it (alert op_check, evidence live);
         diagnose hangs it under the origin
replay   the same NaN, the sample giving tpscope its step (--replay-hook: tpscope.set_step_replay): before step 3's
         update every rank replays the step under the op check; verdict reproducible, rank 1 named with the operator
         that wrote the NaN in layers.1.mlp's forward (not rank 0, whose first NaN arrived by the all-reduce); one
         `replay` alert, every step recorded once, the run goes on; diagnose hangs the replay under the origin
transient the NaN once only (--flip-at: a flipped bit), with the hook: the replay is clean on both ranks, verdict
         transient (a warning), the origin still rank 1
hang     rank 1 leaves out layer 0's MLP all-reduce at step 3 and blocks: capture's watchdog stops the run (exit 3);
         the hang names rank 1 and (tp-0, seq 18): 8 TP all-reduces per step at 2 layers, the 2nd of step 3
"""

import argparse
import json
import os
import sqlite3
import subprocess
import sys

STEPS, LAYERS = 6, 2
SAMPLE_ARGS = ["--steps", str(STEPS), "--layers", str(LAYERS), "--hidden", "64", "--heads", "4", "--seq", "16"]


def fail(message, output=""):
    sys.stderr.write("FAIL: %s\n" % message)
    if output:
        sys.stderr.write("---- output ----\n%s\n" % output[-6000:])
    sys.exit(1)


def capture(args, out, extra, fault_args, expect_status):
    cmd = [args.tpscope, "capture", "--nproc", "2", "--tp", "2", "--out", out] + extra + \
          ["--", args.python, args.sample] + SAMPLE_ARGS + fault_args
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=100)
    logs = ""
    for r in (0, 1):
        path = os.path.join(out, "logs", "rank-%d.log" % r)
        if os.path.exists(path):
            logs += "\n---- rank %d log ----\n" % r + open(path).read()[-3000:]
    if p.returncode != expect_status:
        fail("capture exited %d, expected %d\n%s" % (p.returncode, expect_status, " ".join(cmd)), p.stdout + logs)
    print(p.stdout)
    return p.stdout + logs


def diagnose(args, run, part="findings"):
    p = subprocess.run([args.tpscope, "diagnose", run, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=60)
    if p.returncode != 0:
        fail("tpscope diagnose exited %d: %s" % (p.returncode, p.stderr))
    return json.loads(p.stdout)[part]


def rows(db, sql):
    return db.execute(sql).fetchall()


def check_healthy(args):
    out = os.path.join(args.work, "run")
    log = capture(args, out, [], [], 0)
    run = os.path.join(out, "run.db")
    db = sqlite3.connect("file:%s?mode=ro" % run, uri=True)
    ranks = rows(db, "SELECT rank, tp_rank, tp_size, dp_size, exit_reason FROM ranks ORDER BY rank")
    if ranks != [(0, 0, 2, 1, "ok"), (1, 1, 2, 1, "ok")]:
        fail("ranks rows: %s" % ranks, log)
    per_rank = rows(db, "SELECT rank, count(*), max(seq) FROM collectives WHERE group_name = 'tp-0' "
                        "AND state = 'completed' GROUP BY rank")
    expected_seq = STEPS * 4 * LAYERS
    if per_rank != [(0, expected_seq, expected_seq), (1, expected_seq, expected_seq)]:
        fail("tp-0 collectives per rank: %s, expected %d completed on each" % (per_rank, expected_seq), log)
    sites = rows(db, "SELECT DISTINCT callsite FROM collectives WHERE group_name = 'tp-0' ORDER BY callsite")
    want = {"layers.0.attn.proj forward all-reduce", "layers.1.mlp.fc2 forward all-reduce",
            "layers.0.mlp.fc1 backward all-reduce", "layers.1.attn.qkv backward all-reduce"}
    if not want <= {s for (s,) in sites}:
        fail("call sites %s lack some of %s" % (sites, want), log)
    shape = rows(db, "SELECT DISTINCT op, dtype, shape, bytes, layer, phase FROM collectives WHERE seq = 1 "
                     "AND group_name = 'tp-0'")
    if shape != [("all_reduce", "float32", "[8,16,64]", 8 * 16 * 64 * 4, 0, 1)]:
        fail("first TP all-reduce: %s" % shape, log)
    steps = rows(db, "SELECT rank, count(*), min(step), max(step), sum(skipped) FROM step_stats GROUP BY rank")
    if steps != [(0, STEPS, 1, STEPS, 0), (1, STEPS, 1, STEPS, 0)]:
        fail("step_stats per rank: %s" % steps, log)
    losses = rows(db, "SELECT loss FROM step_stats WHERE rank = 0 ORDER BY step")
    if not all(l is not None and 0 < l < 10 for (l,) in losses):
        fail("losses: %s" % losses, log)
    grads = rows(db, "SELECT count(DISTINCT param), sum(nan_count + inf_count) FROM grad_stats WHERE rank = 0")
    if grads[0][0] < 10 or grads[0][1] != 0:
        fail("grad_stats: %s" % grads, log)
    layer = rows(db, "SELECT layer FROM grad_view WHERE rank = 0 AND param = 'layers.1.mlp.fc2.weight' LIMIT 1")
    if layer != [(1,)]:
        fail("layer of layers.1.mlp.fc2.weight: %s" % layer, log)
    spans = rows(db, "SELECT phase, count(*) FROM span_view WHERE rank = 1 AND name = 'layers.1.mlp' GROUP BY phase")
    if dict(spans) != {"fwd": STEPS, "bwd": STEPS}:
        fail("spans of layers.1.mlp on rank 1: %s" % spans, log)
    kinds = {k for (k,) in rows(db, "SELECT DISTINCT kind FROM span_view")}
    if not {"compute", "comm", "optimizer", "step"} <= kinds:
        fail("span kinds: %s" % kinds, log)
    bad = [f for f in diagnose(args, run) if f["severity"] in ("warning", "error", "critical")]
    if bad:
        fail("a healthy run has findings: %s" % json.dumps(bad, indent=1), log)


def check_nan(args):
    out = os.path.join(args.work, "run")
    log = capture(args, out, [], ["--nan-at", "1:3:1"], 0)
    run = os.path.join(out, "run.db")
    findings = diagnose(args, run)
    origin = [f for f in findings if f["kind"] == "nan_origin"]
    if not origin:
        fail("no nan_origin finding: %s" % json.dumps(findings, indent=1), log)
    f = origin[0]
    if (f.get("rank"), f.get("step"), f.get("layer")) != (1, 3, 1):
        fail("nan_origin names rank %s step %s layer %s, expected rank 1 step 3 layer 1: %s"
             % (f.get("rank"), f.get("step"), f.get("layer"), json.dumps(f, indent=1)), log)
    db = sqlite3.connect("file:%s?mode=ro" % run, uri=True)
    alerts = rows(db, "SELECT rank, step, param FROM alerts WHERE kind = 'nonfinite_activation' ORDER BY ts_ns")
    if not alerts or alerts[0] != (1, 3, "layers.1.mlp.act output"):
        fail("nonfinite_activation alerts (by time): %s" % alerts, log)


def check_skip(args):
    out = os.path.join(args.work, "run")
    log = capture(args, out, ["--on-nonfinite", "skip-step"], ["--nan-at", "1:3:1"], 0)
    run = os.path.join(out, "run.db")
    db = sqlite3.connect("file:%s?mode=ro" % run, uri=True)
    steps = rows(db, "SELECT rank, step, skipped FROM step_stats ORDER BY rank, step")
    want = [(r, s, int(s == 3)) for r in (0, 1) for s in range(1, STEPS + 1)]
    if steps != want:
        fail("step_stats (rank, step, skipped): %s, expected step 3 skipped on both ranks of %d steps"
             % (steps, STEPS), log)
    losses = rows(db, "SELECT step, loss FROM step_stats WHERE rank = 0 AND step > 3 ORDER BY step")
    if len(losses) != STEPS - 3 or not all(l is not None and 0 < l < 10 for _, l in losses):
        fail("losses after the skipped step: %s (the NaN must not have reached the parameters)" % losses, log)
    # The NaN never reached an update: every gradient after step 3 is finite.
    later = rows(db, "SELECT count(*) FROM grad_stats WHERE step > 3 AND nan_count + inf_count > 0")
    if later != [(0,)]:
        fail("non-finite gradients after the skipped step: %s" % later, log)
    origin = [f for f in diagnose(args, run) if f["kind"] == "nan_origin"]
    if not origin or (origin[0].get("rank"), origin[0].get("step")) != (1, 3):
        fail("nan_origin: %s" % origin, log)


def check_stop(args):
    out = os.path.join(args.work, "run")
    log = capture(args, out, ["--on-nonfinite", "stop"], ["--nan-at", "1:3:1"], 5)
    run = os.path.join(out, "run.db")
    db = sqlite3.connect("file:%s?mode=ro" % run, uri=True)
    steps = rows(db, "SELECT rank, max(step), sum(skipped) FROM step_stats GROUP BY rank")
    if steps != [(0, 3, 1), (1, 3, 1)]:
        fail("step_stats (rank, last step, skipped): %s, expected both ranks to stop at step 3" % steps, log)
    votes = rows(db, "SELECT rank, count(*), min(dtype), max(dtype) FROM collectives WHERE group_name = 'world' "
                     "AND callsite LIKE 'tpscope health vote%' GROUP BY rank")
    if votes != [(0, 3, "int64", "int64"), (1, 3, "int64", "int64")]:
        fail("health votes: %s" % votes, log)
    origin = [f for f in diagnose(args, run) if f["kind"] == "nan_origin"]
    if not origin or (origin[0].get("rank"), origin[0].get("step")) != (1, 3):
        fail("nan_origin: %s" % origin, log)


def check_trace(args):
    out = os.path.join(args.work, "run")
    log = capture(args, out, ["--on-nonfinite", "trace-ops"], ["--nan-at", "1:3:1"], 0)
    run = os.path.join(out, "run.db")
    db = sqlite3.connect("file:%s?mode=ro" % run, uri=True)
    checks = rows(db, "SELECT rank, step, param, evidence FROM alerts WHERE kind = 'op_check' ORDER BY rank")
    if [(r, s, p) for r, s, p, _ in checks] != [(0, 4, "aten::embedding"), (1, 4, "aten::embedding")]:
        fail("op_check alerts (rank, step, op): %s, expected the embedding lookup of step 4 once per rank"
             % [(r, s, p) for r, s, p, _ in checks], log)
    for rank, _, _, evidence in checks:
        ev = json.loads(evidence)
        if not ev.get("live") or ev.get("after_step") != 3 or ev.get("carrier_param") != "embed.weight" \
                or ev.get("pass") != "forward":
            fail("op_check evidence of rank %d: %s" % (rank, evidence), log)
    traced = [f for f in diagnose(args, run) if f["kind"] == "replay"]
    if len(traced) != 2 or any(f["step"] != 4 for f in traced):
        fail("replay (traced) findings: %s" % json.dumps(traced, indent=1), log)


def replay_alerts(db):
    return [(r, s, sev, json.loads(e)) for r, s, sev, e in
            rows(db, "SELECT rank, step, severity, evidence FROM alerts WHERE kind = 'replay' ORDER BY rank")]


def check_replay_common(args, db, run, log):
    """What both replay cases share: every step once per rank, one replay vote per rank, the origin rank 1 step 3,
    the replay finding under it."""
    steps = rows(db, "SELECT rank, count(*), count(DISTINCT step), max(step) FROM step_stats GROUP BY rank")
    if steps != [(0, STEPS, STEPS, STEPS), (1, STEPS, STEPS, STEPS)]:
        fail("step_stats per rank (the replay must add no step): %s" % steps, log)
    votes = rows(db, "SELECT rank, step, count(*) FROM collectives WHERE callsite LIKE 'tpscope step replay vote%' "
                     "GROUP BY rank, step")
    if votes != [(0, 3, 1), (1, 3, 1)]:
        fail("replay votes (rank, step, count): %s" % votes, log)
    findings = diagnose(args, run)
    origin = [f for f in findings if f["kind"] == "nan_origin"]
    if not origin or (origin[0].get("rank"), origin[0].get("step")) != (1, 3):
        fail("nan_origin: %s" % json.dumps(origin, indent=1), log)
    replays = [f for f in findings if f["kind"] == "replay"]
    if len(replays) != 1 or replays[0]["step"] != 3:
        fail("replay findings: %s" % json.dumps(replays, indent=1), log)
    chain = diagnose(args, run, "chain")
    under = [c for root in chain if root["kind"] == "nan_origin" and root["rank"] == 1
             for c in root["consequences"] if c["kind"] == "replay"]
    verdict = replays[0]["evidence"]["numbers"]["verdict"]
    if len(under) != 1 or (under[0]["because"] or {}).get("text") != "the replay re-ran step 3: " + verdict:
        fail("the chain does not hang the replay under the origin: %s" % json.dumps(chain, indent=1), log)
    return replays[0]["evidence"]["numbers"], replays[0]


def check_replay(args):
    out = os.path.join(args.work, "run")
    log = capture(args, out, [], ["--nan-at", "1:3:1", "--replay-hook"], 0)
    run = os.path.join(out, "run.db")
    db = sqlite3.connect("file:%s?mode=ro" % run, uri=True)
    alerts = replay_alerts(db)
    if len(alerts) != 1:
        fail("replay alerts: %s" % alerts, log)
    rank, step, severity, ev = alerts[0]
    op = ev.get("op", {})
    if (rank, step, ev.get("verdict"), ev.get("source")) != (1, 3, "reproducible", "hook"):
        fail("replay alert (rank, step, verdict, source): %s" % [(rank, step, ev.get("verdict"), ev.get("source"))],
             log)
    if op.get("span") != "layers.1.mlp" or op.get("pass") != "forward" or op.get("received") \
            or op.get("layer") != 1 or op.get("ops_checked", 0) < 10:
        fail("the operator named: %s" % json.dumps(op, indent=1), log)
    numbers, finding = check_replay_common(args, db, run, log)
    if finding["rank"] != 1 or numbers.get("verdict") != "reproducible" or numbers.get("span") != "layers.1.mlp":
        fail("replay finding: %s" % json.dumps(finding, indent=1), log)
    # `tpscope replay` re-runs tpscope-train only; of a Python run it names the replay the run holds.
    p = subprocess.run([args.tpscope, "replay", run], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=60)
    if p.returncode != 2 or "set_step_replay" not in p.stderr or "replayed step 3" not in p.stderr:
        fail("tpscope replay of a Python run: exit %d: %s" % (p.returncode, p.stderr), log)


def check_transient(args):
    out = os.path.join(args.work, "run")
    log = capture(args, out, [], ["--flip-at", "1:3:1", "--replay-hook"], 0)
    run = os.path.join(out, "run.db")
    db = sqlite3.connect("file:%s?mode=ro" % run, uri=True)
    alerts = replay_alerts(db)
    if len(alerts) != 1 or alerts[0][1] != 3 or alerts[0][3].get("verdict") != "transient" \
            or alerts[0][2] != "warning" or "op" in alerts[0][3]:
        fail("replay alerts: %s" % alerts, log)
    numbers, finding = check_replay_common(args, db, run, log)
    if finding["severity"] != "warning" or numbers.get("verdict") != "transient":
        fail("replay finding: %s" % json.dumps(finding, indent=1), log)


def check_hang(args):
    out = os.path.join(args.work, "run")
    log = capture(args, out, ["--hang-timeout", "6"], ["--skip-allreduce", "1:3:0"], 3)
    run = os.path.join(out, "run.db")
    findings = diagnose(args, run)
    hangs = [f for f in findings if f["kind"] == "hang" and f["severity"] == "critical"]
    if len(hangs) != 1:
        fail("expected one critical hang: %s" % json.dumps(findings, indent=1), log)
    h = hangs[0]
    seq = 2 * 4 * LAYERS + 2
    if h.get("rank") != 1 or h.get("collective", {}).get("group") != "tp-0" or h["collective"].get("seq") != seq:
        fail("the hang names rank %s, %s; expected rank 1, tp-0 seq %d" % (h.get("rank"), h.get("collective"), seq),
             log)
    if "layers.0.mlp.fc2 forward all-reduce" not in h["message"]:
        fail("the hang's message lacks the call site: %s" % h["message"], log)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--case", choices=["healthy", "nan", "skip", "stop", "trace", "replay", "transient", "hang"],
                   required=True)
    p.add_argument("--tpscope", required=True)
    p.add_argument("--python", required=True)
    p.add_argument("--sample", required=True)
    p.add_argument("--work", required=True)
    args = p.parse_args()
    os.makedirs(args.work, exist_ok=True)
    {"healthy": check_healthy, "nan": check_nan, "skip": check_skip, "stop": check_stop, "trace": check_trace,
     "replay": check_replay, "transient": check_transient, "hang": check_hang}[args.case](args)
    print("PASS python_capture_%s" % args.case)


if __name__ == "__main__":
    main()
