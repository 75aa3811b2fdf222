#!/usr/bin/env python3
"""Every torch.distributed call, recorded once with the same (group, seq) on both ranks (label multiproc):

    collectives_test.py --tpscope BIN --python PY --work DIR

Captures collectives_program.py at --nproc 2 --tp 2 and checks the collectives table: the functional API's
collectives and p2p calls (sync, async_op=True with wait(), isend/irecv), and the functional collectives DTensor
issues, with every form of group argument, each once per rank, completed, with the logical op, the input's
dtype/shape/bytes, and a call site naming the program's line.
"""

import argparse
import os
import sqlite3
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# (group, seq, op, dtype, shape, bytes) expected on both ranks (bytes: the input of rank 0; gather/scatter differ)
EXPECTED = [
    ("tp-0", 1, "all_reduce", "float32", "[4,3]", 48),
    ("world", 1, "all_reduce", "float32", "[4,3]", 48),
    ("world", 2, "all_gather", "float32", "[4,3]", 48),
    ("world", 3, "broadcast", "float32", "[4,3]", 48),
    ("world", 4, "reduce", "float32", "[4,3]", 48),
    ("world", 5, "gather", "float32", "[4,3]", 48),
    ("world", 6, "scatter", "float32", "[4,3]", 48),
    ("world", 7, "all_gather", "int64", "[1]", 8),
    ("world", 8, "all_gather", "uint8", None, None),
    ("world", 9, "barrier", "none", "[]", 0),
    # the functional collectives: (mesh, 0) twice and the mesh (its one dimension is the default group), then the
    # ProcessGroup and its name, then an all-gather on (mesh, 0) again
    ("world", 10, "all_reduce", "float32", "[2,2]", 16),
    ("world", 11, "all_reduce", "float32", "[2,2]", 16),
    ("world", 12, "all_reduce", "float32", "[2,2]", 16),
    ("tp-0", 2, "all_reduce", "float32", "[2,2]", 16),
    ("tp-0", 3, "all_reduce", "float32", "[2,2]", 16),
    ("world", 13, "all_gather", "float32", "[2,2]", 16),
    ("world:p2p-0-1", 1, "send_recv", "float32", "[5]", 20),
    ("world:p2p-0-1", 2, "send_recv", "float32", "[6]", 24),
]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tpscope", required=True)
    p.add_argument("--python", required=True)
    p.add_argument("--work", required=True)
    args = p.parse_args()
    out = os.path.join(args.work, "run")
    cmd = [args.tpscope, "capture", "--nproc", "2", "--tp", "2", "--out", out, "--",
           args.python, os.path.join(HERE, "collectives_program.py")]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=100)
    if r.returncode != 0:
        logs = "".join(open(os.path.join(out, "logs", f)).read() for f in sorted(os.listdir(os.path.join(out, "logs"))))
        sys.exit("FAIL: capture exited %d\n%s\n%s" % (r.returncode, r.stdout, logs))
    db = sqlite3.connect("file:%s?mode=ro" % os.path.join(out, "run.db"), uri=True)
    problems = []
    for rank in (0, 1):
        got = db.execute("SELECT group_name, seq, op, dtype, shape, bytes, state, callsite FROM collectives "
                         "WHERE rank = ? ORDER BY group_name, seq", (rank,)).fetchall()
        if [(g[0], g[1]) for g in got] != [(e[0], e[1]) for e in sorted(EXPECTED)]:
            problems.append("rank %d recorded %s" % (rank, [(g[0], g[1], g[2]) for g in got]))
            continue
        for g, e in zip(got, sorted(EXPECTED)):
            if g[2] != e[2] or g[3] != e[3] or (e[4] is not None and g[4] != e[4]) or \
                    (e[5] is not None and rank == 0 and g[5] != e[5]):
                problems.append("rank %d %s seq %d: %s, expected %s" % (rank, e[0], e[1], g[2:6], e[2:]))
            if g[6] != "completed":
                problems.append("rank %d %s seq %d is %s" % (rank, e[0], e[1], g[6]))
            if "collectives_program.py:" not in g[7]:  # the program's line, also for calls torch makes for it
                problems.append("rank %d %s seq %d: call site %r" % (rank, e[0], e[1], g[7]))
    directions = db.execute("SELECT rank, callsite FROM collectives WHERE group_name = 'world:p2p-0-1' AND seq = 1 "
                            "ORDER BY rank").fetchall()
    if len(directions) != 2 or "send to rank 1" not in directions[0][1] or "recv from rank 0" not in directions[1][1]:
        problems.append("p2p call sites: %s" % directions)
    groups = dict(db.execute("SELECT name, ranks FROM process_groups").fetchall())
    if groups.get("world") != "0,1" or groups.get("tp-0") != "0,1" or groups.get("world:p2p-0-1") != "0,1":
        problems.append("process_groups: %s" % groups)
    if problems:
        sys.exit("FAIL:\n  " + "\n  ".join(problems))
    print("PASS python_collectives")


if __name__ == "__main__":
    main()
