#!/usr/bin/env python3
"""Scale benchmark (issue #13): for each N, tpscope_scale_gen writes a capture folder of N simulated ranks (TP 8 ×
DP N/8, 50 steps, 8 layers: 68 spans and 33 collectives per rank and step) with a straggler, a hang and a NaN origin
(where: bench/scale/scale_gen.cpp), then `tpscope merge DIR -o run.db`, `tpscope diagnose run.db --json` and
`tpscope diagnose DIR --json` (straight from the rank files, no merged file) run, each timed (wall clock) with its
peak resident memory (the child's own ru_maxrss, from wait4). Diagnose must name the three faults on the ranks the
generator placed them on, and diagnose DIR must give exactly the findings and chain of diagnose run.db. One line per
N that a script can read:

  n=1024 merge_s=… merge_rss_mb=… diagnose_s=… diagnose_rss_mb=… dir_s=… dir_rss_mb=… dir_same=1 faults_found=3/3
         gen_s=… spans=… run_db_mb=… stragglers=… (straggler findings of warning or worse: 1 when only the injected
         rank is named)

Targets (on the 2-core build machine): N = 1024: merge ≤ 60 s, diagnose ≤ 10 s, peak memory ≤ 4 GB each, 3/3;
N = 4096: diagnose DIR ≤ 60 s and ≤ 4 GB. --no-merge runs diagnose DIR alone (faults checked, no comparison).
Exits 1 when a fault is missed or diagnose DIR differs (after finishing every N), 2 when a command fails.

Usage: python3 bench/scale/run_scale.py --build build [--ranks 64,128,256,512,1024] [--work DIR] [--keep]
       [--json out.json]
       python3 bench/scale/run_scale.py --gen GEN --tpscope TPSCOPE --ranks 16 --work DIR   (the ctest check)
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def timed(cmd):
    """Runs cmd; returns (stdout, wall seconds, peak RSS in MB of that process alone). Exits 2 if it fails."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(p.pid, 0)  # reaped here, so ru_maxrss is this child's own peak
        wall = time.monotonic() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if p.returncode != 0:
        print(f"failed ({p.returncode}): {' '.join(cmd)}\n{stdout}\n{stderr}", file=sys.stderr)
        sys.exit(2)
    return stdout, wall, usage.ru_maxrss / 1024  # Linux: ru_maxrss in KiB


def check_faults(diag, placed):
    """The faults diagnose found on the right ranks, and the straggler findings (warning or worse) it made."""
    f = diag["findings"]
    serious = ("critical", "error", "warning")
    stragglers = [x for x in f if x["kind"] == "straggler" and x["severity"] in serious]
    found = {
        "straggler": any(x["rank"] == placed["straggler_rank"] for x in stragglers),
        "hang": any(x["kind"] == "hang" and x["severity"] == "critical" and placed["hang_rank"] in x["ranks"]
                    and (x["collective"] or {}).get("group") == placed["hang_group"]
                    and x["collective"].get("seq") == placed["hang_seq"] for x in f),
        "nan": any(x["kind"] == "nan_origin" and x["severity"] == "critical" and x["rank"] == placed["nan_rank"]
                   and x["step"] == placed["nan_step"] and x["layer"] == placed["nan_layer"] for x in f),
    }
    return found, len(stragglers)


def without_file(diag):
    """The diagnosis without the name of what was diagnosed."""
    return {k: v for k, v in diag.items() if k != "file"}


def run_one(gen, tpscope, n, work, keep, merge):
    folder = os.path.join(work, f"n{n}")
    shutil.rmtree(folder, ignore_errors=True)
    t0 = time.monotonic()
    out, _, gen_rss = timed([gen, "--ranks", str(n), "--out", folder])
    gen_s = time.monotonic() - t0
    placed = json.loads(out)
    dir_out, dir_s, dir_rss = timed([tpscope, "diagnose", folder, "--json"])
    dir_diag = json.loads(dir_out)
    row = {"n": n, "dir_s": round(dir_s, 2), "dir_rss_mb": round(dir_rss), "gen_s": round(gen_s, 2),
           "gen_rss_mb": round(gen_rss)}
    if merge:
        run_db = os.path.join(folder, "run.db")
        merge_out, merge_s, merge_rss = timed([tpscope, "merge", folder, "-o", run_db])
        diag_out, diag_s, diag_rss = timed([tpscope, "diagnose", run_db, "--json"])
        diag = json.loads(diag_out)
        row.update({"merge_s": round(merge_s, 2), "merge_rss_mb": round(merge_rss), "diagnose_s": round(diag_s, 2),
                    "diagnose_rss_mb": round(diag_rss),
                    "spans": int(merge_out.split("(")[1].split()[0]) if "(" in merge_out else -1,
                    "run_db_mb": round(os.path.getsize(run_db) / 2**20),
                    "dir_same": int(without_file(diag) == without_file(dir_diag))})
    else:
        diag = dir_diag
    found, stragglers = check_faults(diag, placed)
    row.update({"faults_found": sum(found.values()), "stragglers": stragglers,
                "missed": [k for k, v in found.items() if not v] + ([] if row.get("dir_same", 1) else ["dir_same"])})
    if not keep:
        shutil.rmtree(folder, ignore_errors=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", help="the build folder (gives --gen and --tpscope)")
    ap.add_argument("--gen", help="tpscope_scale_gen")
    ap.add_argument("--tpscope", help="the tpscope CLI")
    ap.add_argument("--ranks", default="64,128,256,512,1024")
    ap.add_argument("--work", help="where the folders go (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep each N's folder and run.db")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--no-merge", action="store_true", help="only diagnose DIR (no merged file, no comparison)")
    a = ap.parse_args()
    gen = a.gen or (a.build and os.path.join(a.build, "bench", "scale", "tpscope_scale_gen"))
    tpscope = a.tpscope or (a.build and os.path.join(a.build, "cli", "tpscope"))
    if not gen or not tpscope:
        ap.error("give --build, or --gen and --tpscope")
    work = a.work or tempfile.mkdtemp(prefix="tpscope-scale-")
    os.makedirs(work, exist_ok=True)
    rows, missed = [], False
    for n in (int(x) for x in a.ranks.split(",")):
        row = run_one(gen, tpscope, n, work, a.keep, not a.no_merge)
        rows.append(row)
        missed = missed or bool(row["missed"])
        order = ["n", "merge_s", "merge_rss_mb", "diagnose_s", "diagnose_rss_mb", "dir_s", "dir_rss_mb", "dir_same",
                 "faults_found", "gen_s", "gen_rss_mb", "spans", "run_db_mb", "stragglers"]
        line = " ".join(f"{k}={row[k]}" + ("/3" if k == "faults_found" else "") for k in order if k in row)
        extra = f" missed={','.join(row['missed'])}" if row["missed"] else ""
        print(line + extra, flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
