#!/usr/bin/env python3
"""A rank killed by a signal after its program and its recording ended is not a crash of the run (label multiproc):

    shutdown_test.py --tpscope BIN --python PY --work DIR

shutdown_program.py at 2 ranks under `tpscope capture`, rank 1 aborting (SIGABRT):
  --abort exit     in the interpreter's shutdown, after tpscope.run stopped the recorder with "ok": capture exits 0,
                   warns that rank 1 finished and then died while shutting down, keeps its exit reason "ok", and keeps
                   the signal in meta capture_rank_exit:1
  --abort program  inside the program, before it returned: a crash (exit 4), the rank's exit reason says so
"""

import argparse
import os
import sqlite3
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def capture(args, how):
    out = os.path.join(args.work, how)
    cmd = [args.tpscope, "capture", "--nproc", "2", "--out", out, "--", args.python,
           os.path.join(HERE, "shutdown_program.py"), "--abort", how]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=100)
    db = sqlite3.connect("file:%s?mode=ro" % os.path.join(out, "run.db"), uri=True)
    reasons = dict(db.execute("SELECT rank, exit_reason FROM ranks").fetchall())
    meta = dict(db.execute("SELECT key, value FROM meta WHERE key LIKE 'capture_rank_exit:%'").fetchall())
    return r, reasons, meta


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tpscope", required=True)
    p.add_argument("--python", required=True)
    p.add_argument("--work", required=True)
    args = p.parse_args()
    problems = []
    r, reasons, meta = capture(args, "exit")
    if r.returncode != 0:
        problems.append("abort at exit: capture exited %d" % r.returncode)
    if "rank 1" not in r.stdout or "then was killed by SIGABRT while shutting down" not in r.stdout:
        problems.append("abort at exit: no warning naming rank 1's shutdown")
    if reasons != {0: "ok", 1: "ok"}:
        problems.append("abort at exit: exit reasons %s" % reasons)
    if "SIGABRT" not in meta.get("capture_rank_exit:1", ""):
        problems.append("abort at exit: meta %s" % meta)
    if "ended: killed by signal" in r.stdout:
        problems.append("abort at exit: reported as a rank that ended early")
    r2, reasons2, _ = capture(args, "program")
    if r2.returncode != 4:
        problems.append("abort in the program: capture exited %d, expected 4 (crash)" % r2.returncode)
    if "crash" not in reasons2.get(1, ""):
        problems.append("abort in the program: rank 1's exit reason %r" % reasons2.get(1))
    if problems:
        sys.exit("FAIL:\n  " + "\n  ".join(problems) + "\n---- abort at exit ----\n" + r.stdout +
                 "\n---- abort in the program ----\n" + r2.stdout)
    print("PASS python_capture_shutdown")


if __name__ == "__main__":
    main()
