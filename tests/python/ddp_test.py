#!/usr/bin/env python3
"""`tpscope capture --dp 2 -- python3 ddp_program.py`: DistributedDataParallel's bucketed gradient all-reduces are
recorded (label multiproc).

    ddp_test.py --hook none|python|builtin --tpscope BIN --python PY --program ddp_program.py --work DIR

The program checks DDP's arithmetic itself (its parameters against a reference trained without DDP; exit 1 on a
mismatch), so a recording hook that changed what DDP computes fails here. This test checks the trace against figures
taken from the model, not from the recorder: every step's DDP all-reduces carry the model's parameter bytes exactly
once (281,604 parameters, float32, or float16 under fp16 compression), on both ranks with the same (group, seq), in
the backward phase, completed (DDP never calls wait(): completion comes from the future); and the diagnosis of the
healthy run has nothing of warning or worse.
"""

import argparse
import json
import os
import sqlite3
import subprocess
import sys

STEPS = 4
PARAMS = (32 * 512 + 512) + (512 * 512 + 512) + (512 * 4 + 4)  # ddp_program.make_model()


def fail(message, output=""):
    sys.stderr.write("FAIL: %s\n" % message)
    if output:
        sys.stderr.write("---- output ----\n%s\n" % output[-6000:])
    sys.exit(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hook", choices=["none", "python", "builtin"], required=True)
    p.add_argument("--tpscope", required=True)
    p.add_argument("--python", required=True)
    p.add_argument("--program", required=True)
    p.add_argument("--work", required=True)
    args = p.parse_args()
    out = os.path.join(args.work, "run")
    cmd = [args.tpscope, "capture", "--nproc", "2", "--dp", "2", "--out", out, "--",
           args.python, args.program, "--steps", str(STEPS), "--hook", args.hook]
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=100)
    logs = run.stdout
    for r in (0, 1):
        path = os.path.join(out, "logs", "rank-%d.log" % r)
        if os.path.exists(path):
            logs += "\n---- rank %d log ----\n" % r + open(path).read()[-3000:]
    if run.returncode != 0:
        fail("capture exited %d\n%s" % (run.returncode, " ".join(cmd)), logs)
    if logs.count("DDP_PARAMS_MAX_DIFF") != 2:
        fail("the program did not check its parameters on both ranks", logs)

    db = sqlite3.connect("file:%s?mode=ro" % os.path.join(out, "run.db"), uri=True)
    ddp = db.execute("SELECT rank, group_name, seq, op, dtype, bytes, step, phase, state FROM collectives "
                     "WHERE callsite LIKE 'DDP bucket % gradient all-reduce' ORDER BY rank, seq").fetchall()
    if not ddp:
        fail("no DDP all-reduce was recorded", logs)
    elem = 2 if args.hook != "none" else 4
    dtype = "float16" if args.hook != "none" else "float32"
    for rank in (0, 1):
        mine = [r for r in ddp if r[0] == rank]
        per_step = {}
        for _, group, _, op, dt, nbytes, step, phase, state in mine:
            if (group, op, dt, phase, state) != ("world", "all_reduce", dtype, 2, "completed"):
                fail("rank %d: a DDP all-reduce recorded as %s" % (rank, (group, op, dt, phase, state)), logs)
            per_step[step] = per_step.get(step, 0) + nbytes
        if per_step != {s: PARAMS * elem for s in range(1, STEPS + 1)}:
            fail("rank %d: DDP all-reduce bytes per step %s, expected %d in each of steps 1..%d"
                 % (rank, per_step, PARAMS * elem, STEPS), logs)
    keys = [[(g, s, b) for r, g, s, _, _, b, _, _, _ in ddp if r == rank] for rank in (0, 1)]
    if keys[0] != keys[1]:
        fail("the ranks' DDP records disagree on (group, seq, bytes): %s / %s" % (keys[0], keys[1]), logs)
    if len(keys[0]) <= STEPS:
        fail("expected several buckets after DDP's first step, got %d all-reduces in %d steps"
             % (len(keys[0]), STEPS), logs)

    d = subprocess.run([args.tpscope, "diagnose", os.path.join(out, "run.db"), "--json"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    if d.returncode != 0:
        fail("tpscope diagnose exited %d: %s" % (d.returncode, d.stderr))
    bad = [f for f in json.loads(d.stdout)["findings"] if f["severity"] in ("warning", "error", "critical")]
    if bad:
        fail("a healthy DDP run has findings: %s" % json.dumps(bad, indent=1), logs)
    print("PASS python_ddp_%s (%d DDP all-reduces per rank)" % (args.hook, len(keys[0])))


if __name__ == "__main__":
    main()
