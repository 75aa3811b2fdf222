#!/usr/bin/env python3
"""Checks one GPU capture for scripts/gpu-check: device lanes recorded, correlated, NCCL kernels matched to the
collectives that launched them, and the probe overhead against a plain run of the same command.

    gpu_check_run.py RUN_DB [--plain METRICS.jsonl --captured METRICS.jsonl] [--expect-nccl]

Prints one line per check (name, value, target, ok/MISS) and exits 1 on any miss.
"""
import argparse
import json
import sqlite3
import statistics
import sys


def median_step_s(path, skip=3):
    times = [json.loads(line)["step_time_s"] for line in open(path) if line.strip()]
    times = times[skip:]
    return statistics.median(times) if times else float("nan")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("run")
    p.add_argument("--plain")
    p.add_argument("--captured")
    p.add_argument("--expect-nccl", action="store_true")
    args = p.parse_args()
    db = sqlite3.connect("file:%s?mode=ro" % args.run, uri=True)
    one = lambda sql: db.execute(sql).fetchone()[0]
    rows = []
    kernels = one("SELECT count(*) FROM spans WHERE kind = 6")
    rows.append(("kernel records", kernels, "> 0", kernels > 0))
    copies = one("SELECT count(*) FROM spans WHERE kind IN (7, 8)")
    rows.append(("memcpy/memset records", copies, "(info)", True))
    lanes = one("SELECT count(*) FROM threads WHERE kind = 'cuda-stream'")
    rows.append(("stream lanes", lanes, "> 0", lanes > 0))
    device = one("SELECT count(*) FROM spans WHERE kind IN (6, 7, 8, 9)")
    corr = one("SELECT count(*) FROM spans k JOIN spans h ON h.id = k.correlation AND h.rank = k.rank "
               "WHERE k.kind IN (6, 7, 8, 9)")
    share = corr / device if device else 0.0
    rows.append(("correlated to a host span", "%.1f %%" % (100 * share), ">= 95 %", share >= 0.95))
    nccl = one("SELECT count(*) FROM spans WHERE kind = 9")
    matched = one("SELECT count(*) FROM spans k JOIN spans h ON h.id = k.correlation WHERE k.kind = 9 AND h.kind = 1 "
                  "AND EXISTS (SELECT 1 FROM collectives c WHERE c.rank = k.rank AND c.start_ns <= h.begin_ns + h.dur_ns "
                  "AND c.end_ns >= h.begin_ns)")
    colls = one("SELECT count(*) FROM collectives WHERE state = 'completed'")
    if args.expect_nccl:
        rows.append(("NCCL kernels", nccl, "> 0", nccl > 0))
        rows.append(("NCCL kernels in a collective", "%d of %d (%d collectives)" % (matched, nccl, colls), "all",
                     nccl > 0 and matched == nccl))
    else:
        rows.append(("NCCL kernels (world size 1)", "%d, %d collectives" % (nccl, colls), "(info)", True))
    if args.plain and args.captured:
        plain, captured = median_step_s(args.plain), median_step_s(args.captured)
        over = captured / plain - 1
        rows.append(("probe overhead (median step)", "%+.2f %% (%.2f vs %.2f ms)" % (100 * over, captured * 1e3,
                                                                             plain * 1e3), "<= 1 %", over <= 0.01))
    ok = True
    for name, value, target, good in rows:
        print("%-32s %-36s %-10s %s" % (name, value, target, "ok" if good else "MISS"))
        ok &= good
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
