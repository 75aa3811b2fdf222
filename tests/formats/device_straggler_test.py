#!/usr/bin/env python3
"""A straggler only the GPU shows, on imported PyTorch profiler traces (issue #29): bench/hta/gen_kineto.py writes
ranks whose NCCL kernels run on GPU streams; with --straggler-kind gpu one rank's compute kernels run slower while its
host keeps pace, so it enqueues every collective on time and its NCCL kernels start late. The import must mark the
collectives as timed by their kernels (meta collective_arrival = device) and diagnose must name that rank — the one
the generator chose, not one this test picks — as a straggler of warning severity; with a host straggler the same;
with no straggler (slowdown 1.0: seeded jitter only) no warning at all.

    device_straggler_test.py --tpscope BIN --gen bench/hta/gen_kineto.py --work DIR
"""

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    if p.returncode not in (0, 7):
        sys.exit("FAIL: %s exited %d:\n%s" % (" ".join(cmd), p.returncode, p.stdout[-4000:]))
    return p.stdout


def case(args, name, ranks, seed, kind, slowdown):
    folder = os.path.join(args.work, name)
    shutil.rmtree(folder, ignore_errors=True)
    line = run([sys.executable, args.gen, "--ranks", str(ranks), "--steps", "10", "--seed", str(seed),
                "--straggler-kind", kind, "--straggler-slowdown", str(slowdown), "--out", folder])
    chosen = int(line.split("straggler=")[1].split()[0])
    db = folder + ".db"
    run([args.tpscope, "import", "kineto"] + sorted(os.path.join(folder, f) for f in os.listdir(folder)) +
        ["-o", db])
    arrival = sqlite3.connect(db).execute("SELECT value FROM meta WHERE key = 'collective_arrival'").fetchall()
    if arrival != [("device",)]:
        sys.exit("FAIL %s: meta collective_arrival is %s, expected device" % (name, arrival))
    findings = json.loads(run([args.tpscope, "diagnose", "--json", db]))["findings"]
    warned = [f for f in findings if f["severity"] in ("warning", "error", "critical")]
    return chosen, warned


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tpscope", required=True)
    ap.add_argument("--gen", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    for ranks, seed in ((4, 11), (8, 12)):
        for kind in ("gpu", "host"):
            chosen, warned = case(args, "%s_%d" % (kind, ranks), ranks, seed, kind, 1.25)
            stragglers = [f for f in warned if f["kind"] == "straggler"]
            if [f["rank"] for f in stragglers] != [chosen]:
                sys.exit("FAIL %s straggler at %d ranks: the generator slowed rank %d, diagnose warns about %s"
                         % (kind, ranks, chosen, json.dumps(warned, indent=1)))
        _, warned = case(args, "healthy_%d" % ranks, ranks, seed, "gpu", 1.0)
        if warned:
            sys.exit("FAIL healthy at %d ranks: %s" % (ranks, json.dumps(warned, indent=1)))
    print("ok: GPU-only and host stragglers named on their ranks, healthy runs without a warning")


if __name__ == "__main__":
    main()
