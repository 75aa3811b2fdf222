#!/usr/bin/env python3
"""The pipeline bubble, measured vs analytic: tpscope capture of tpscope-train on bench/pipeline/balanced.json at
p stages and m micro-batches, then `tpscope report --json`'s `pipeline` object. For each (schedule, p, m) it prints
the analytic bubble, the measured bubble per stage (mean over the measured steps and the stage's ranks) and its
split into warm-up/cool-down, dependency wait and transfer, and the difference measured − analytic of the stage
mean. Target (issue 14): within ±2 percentage points for p in {2, 4}, m in {4, 8, 16} on a balanced config.

Usage: python3 bench/pipeline/run_bubble.py --build build [--steps 6] [--schedules 1f1b,gpipe] [--p 2,4]
       [--m 4,8,16] [--json out.json]
With more ranks than cores (p = 4 on a 2-core machine) the ranks take turns on the cores: a stage that is runnable
but not scheduled counts as computing (its pass span is open) while its neighbours wait, which inflates the bubble.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run_one(build, schedule, p, m, steps):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run")
        cmd = [os.path.join(build, "cli", "tpscope"), "capture", "--nproc", str(p), "--pp", str(p), "--schedule",
               schedule, "--microbatches", str(m), "--steps", str(steps), "--config",
               os.path.join(HERE, "balanced.json"), "--out", out]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"capture failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
        rep = subprocess.run([os.path.join(build, "cli", "tpscope"), "report", os.path.join(out, "run.db"), "--json"],
                             capture_output=True, text=True, check=True)
        return json.loads(rep.stdout)["pipeline"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--schedules", default="1f1b,gpipe")
    ap.add_argument("--p", default="2,4")
    ap.add_argument("--m", default="4,8,16")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    print(f"{'schedule':<8} {'p':>2} {'m':>3} {'analytic':>9} {'measured':>9} {'diff pp':>8}  per stage "
          "(bubble = warm-up/cool-down + dependency + transfer)")
    for schedule in a.schedules.split(","):
        for p in (int(x) for x in a.p.split(",")):
            for m in (int(x) for x in a.m.split(",")):
                pl = run_one(a.build, schedule, p, m, a.steps)
                stages = pl["per_stage"]
                measured = sum(s["bubble_pct"] for s in stages) / len(stages)
                diff = measured - pl["analytic_bubble_pct"]
                detail = "  ".join(f"s{s['stage']} {s['bubble_pct']:.1f}={s['warmup_cooldown_pct']:.1f}+"
                                   f"{s['dependency_wait_pct']:.1f}+{s['transfer_pct']:.1f}" for s in stages)
                print(f"{schedule:<8} {p:>2} {m:>3} {pl['analytic_bubble_pct']:>8.1f}% {measured:>8.1f}% "
                      f"{diff:>+8.1f}  {detail}", flush=True)
                rows.append({"schedule": schedule, "p": p, "m": m, "analytic_pct": pl["analytic_bubble_pct"],
                             "measured_pct": measured, "diff_pp": diff, "pipeline": pl})
    within = sum(1 for r in rows if abs(r["diff_pp"]) <= 2.0)
    print(f"within ±2 points: {within} of {len(rows)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
