#!/usr/bin/env python3
"""The what-if benchmark: does `tpscope whatif` predict the step time a run would have without its problem?

Seeded pairs of real captures (tpscope capture of tpscope-train, --config tiny by default, loopback Gloo). Per pair, the seed picks
the faulty rank (or stage) and the injected milliseconds; the two captures of a pair run in an order the seed picks
too (so that a drift of the machine's load does not favour one side).

  straggler   capture with --inject slow:rank=R,ms=M; `whatif --json`'s straggler change predicts the step time
              without it; the same run without the fault is captured and its measured step time (whatif's
              measured_step_ms, the same definition) is the truth. Also counted: the change names rank R.
  imbalance   pipeline runs: stage S of 2 made slower by 2M ms (every rank of it), against the same total work spread
              evenly (every rank of both stages M ms slower); `whatif`'s stage_imbalance change (every stage's compute
              at the stages' mean) predicts the balanced run's step time.
  noise       the floor under both: two captures of the same healthy run, the first's measured step time taken as
              the prediction of the second's. No model can predict closer than the machine repeats itself.

Layouts: tp2 (2 ranks), tp2dp2 and tp2pp2 (4 ranks), pp2 (2 ranks, TP 1). On a machine with fewer cores than ranks
the ranks take turns on the cores, and a change to one rank's work changes how fast the others run: the model assumes
every rank has its own device (docs/diagnosis.md); the 2-rank layouts are the check without that effect.

Prints a table (error = (predicted − measured) / measured): median |error|, median signed error, worst |error|, the
share of pairs where the straggler change named the injected rank, and the pairs. Writes results.json and results.md
into --out. Target (issue #33): median |error| <= 5 % over >= 20 pairs.

--repeat K captures each side of a pair K times, interleaved, and compares the sides' medians (the floor under a
prediction is how far two captures of one run differ: the medians of K move it down). --config small (a step of
80-270 ms, compute-bound) puts the scheduler's wake-ups, which dominate the tiny config's 14 ms step on 2 cores, in
proportion.

Usage: python3 bench/whatif/run_whatif.py --build build [--pairs 20] [--seed 1] [--steps 20] [--config tiny|small]
       [--repeat 1] [--only straggler:tp2dp2,imbalance:pp2,...] [--out bench-out/whatif]
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# name -> (nproc, tp, dp, pp)
LAYOUTS = {"tp2": (2, 2, 1, 1), "tp2dp2": (4, 2, 2, 1), "tp2pp2": (4, 2, 1, 2), "pp2": (2, 1, 1, 2)}
CASES = ["straggler:tp2", "straggler:tp2dp2", "straggler:tp2pp2", "imbalance:pp2", "imbalance:tp2pp2", "noise:tp2",
         "noise:tp2dp2", "noise:tp2pp2"]


def capture(tpscope, config, layout, steps, injects, out):
    nproc, tp, dp, pp = LAYOUTS[layout]
    cmd = [tpscope, "capture", "--nproc", str(nproc), "--tp", str(tp), "--dp", str(dp), "--config",
           os.path.join(ROOT, "samples/configs", config + ".json"), "--steps", str(steps), "-o", out]
    if pp > 1:
        cmd += ["--pp", str(pp), "--microbatches", "4"]
    for spec in injects:
        cmd += ["--inject", spec]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"capture failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    run = subprocess.run([tpscope, "whatif", os.path.join(out, "run.db"), "--json"], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"whatif failed: {run.stderr}")
    return json.loads(run.stdout)


def change(report, name):
    for ch in report["changes"]:
        if ch["change"] == name:
            return ch
    return None


def pair(tpscope, config, case, seed, steps, repeat, work):
    kind, layout = case.split(":")
    nproc, tp, dp, pp = LAYOUTS[layout]
    rng = random.Random(seed)
    ms = rng.choice([10, 20, 30, 40])
    if kind == "straggler":
        rank = rng.randrange(nproc)
        faulty, clean = [f"slow:rank={rank},ms={ms}"], []
        target = rank
    elif kind == "noise":
        faulty, clean, target = [], [], None
    else:
        stage = rng.randrange(pp)
        per_stage = nproc // pp
        faulty = [f"slow:rank={stage * per_stage + k},ms={2 * ms}" for k in range(per_stage)]
        clean = [f"slow:rank={r},ms={ms}" for r in range(nproc)]
        target = stage
    # `repeat` captures per side, interleaved (faulty, clean, faulty, ...) in an order the seed picks: each side's
    # figure is the median over its captures, so that one capture's draw of the machine's state does not decide it.
    order = [("faulty", faulty), ("clean", clean)]
    if rng.random() < 0.5:
        order.reverse()
    reports = {"faulty": [], "clean": []}
    for k in range(repeat):
        for side, injects in order:
            out = os.path.join(work, f"{case.replace(':', '-')}-{seed}-{side}-{k}")
            reports[side].append(capture(tpscope, config, layout, steps, injects, out))
            shutil.rmtree(out, ignore_errors=True)
    med = lambda side, key: statistics.median(r[key] for r in reports[side])
    changes = [None if kind == "noise" else change(r, "straggler" if kind == "straggler" else "stage_imbalance")
               for r in reports["faulty"]]
    if kind == "noise":
        predicted = med("faulty", "measured_step_ms")
    else:
        predicted = statistics.median(c["predicted_step_ms"] if c else r["measured_step_ms"]
                                      for c, r in zip(changes, reports["faulty"]))
    measured = med("clean", "measured_step_ms")
    named = kind == "noise" or all(c is not None and c.get("rank" if kind == "straggler" else "stage") == target
                                   for c in changes)
    return {"case": case, "seed": seed, "ms": ms, "target": target, "repeat": repeat,
            "faulty_step_ms": med("faulty", "measured_step_ms"), "faulty_replayed_ms": med("faulty", "replayed_step_ms"),
            "predicted_ms": predicted, "clean_step_ms": measured, "clean_replayed_ms": med("clean", "replayed_step_ms"),
            "error_pct": 100.0 * (predicted - measured) / measured, "named": named}


def summarise(rows):
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        rs = [r for r in rows if r["case"] == case]
        errs = [r["error_pct"] for r in rs]
        gaps = [100.0 * (r["faulty_replayed_ms"] - r["faulty_step_ms"]) / r["faulty_step_ms"] for r in rs]
        out.append({"case": case, "pairs": len(rs), "median_abs_error_pct": statistics.median(abs(e) for e in errs),
                    "median_error_pct": statistics.median(errs), "worst_abs_error_pct": max(abs(e) for e in errs),
                    "named_pct": 100.0 * sum(r["named"] for r in rs) / len(rs),
                    "median_replay_gap_pct": statistics.median(gaps),
                    "median_faulty_ms": statistics.median(r["faulty_step_ms"] for r in rs),
                    "median_clean_ms": statistics.median(r["clean_step_ms"] for r in rs)})
    return out


def table(summary):
    lines = ["| case | pairs | median \\|error\\| | median error | worst \\|error\\| | fault named | replay gap (faulty run) | step faulty → clean (median) |",
             "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['case']} | {s['pairs']} | {s['median_abs_error_pct']:.1f} % | {s['median_error_pct']:+.1f} % | "
                     f"{s['worst_abs_error_pct']:.1f} % | {s['named_pct']:.0f} % | {s['median_replay_gap_pct']:+.1f} % | "
                     f"{s['median_faulty_ms']:.1f} → {s['median_clean_ms']:.1f} ms |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=1, help="captures per side of a pair; each side's median is taken")
    ap.add_argument("--config", default="tiny", help="samples/configs/NAME.json (default: tiny)")
    ap.add_argument("--only", default=",".join(CASES), help="comma-separated cases: " + ", ".join(CASES))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench-out", "whatif"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    # A private copy of the two programs: a build in the shared tree may relink them while the pairs run.
    bindir = tempfile.mkdtemp(prefix="tpscope-whatif-bin-")
    for sub, name in (("cli", "tpscope"), ("core", "tpscope-train")):
        os.makedirs(os.path.join(bindir, sub))
        shutil.copy2(os.path.join(args.build, sub, name), os.path.join(bindir, sub, name))
    tpscope = os.path.join(bindir, "cli", "tpscope")
    rows = []
    start = time.time()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="tpscope-whatif-") as work:
        for case in args.only.split(","):
            for i in range(args.pairs):
                seed = args.seed * 1000 + i
                row = pair(tpscope, args.config, case, seed, args.steps, args.repeat, work)
                rows.append(row)
                print(f"{case} seed {seed}: {row['ms']} ms on {row['target']}: faulty {row['faulty_step_ms']:.2f}, "
                      f"predicted {row['predicted_ms']:.2f}, clean {row['clean_step_ms']:.2f} ms "
                      f"({row['error_pct']:+.1f} %){'' if row['named'] else ' [other rank/stage named]'}", flush=True)
    summary = summarise(rows)
    md = table(summary)
    meta = {"date": time.strftime("%Y-%m-%d"), "seconds": round(time.time() - start), "load_before": load,
            "load_after": os.getloadavg(), "steps": args.steps, "config": args.config, "repeat": args.repeat, "pairs": args.pairs, "seed": args.seed}
    print(md)
    print(f"load average before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, after {meta['load_after'][0]:.2f}; "
          f"{meta['seconds']} s")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"meta": meta, "summary": summary, "pairs": rows}, f, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md + "\n")
    shutil.rmtree(bindir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
