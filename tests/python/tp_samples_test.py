#!/usr/bin/env python3
"""`tpscope capture` of PyTorch's own TP programs with sequence parallelism and a 2-D TP x FSDP2 mesh (label multiproc).

    tp_samples_test.py --case CASE --tpscope BIN --python PY --samples samples/python --work DIR

llama_healthy  samples/python/llama_tp.py at 2 ranks (RowwiseParallel embedding, SequenceParallel norms,
               PrepareModuleInput, Colwise/Rowwise attention and SwiGLU): the all-gathers, reduce-scatters and
               all-reduces DTensor issues, the same (group, seq, op) on both ranks, completed, with call sites in module
               terms in both phases; forward and backward spans per block; grad_stats of the local shards, whose
               norms combine (root sum of squares for a Shard placement, equal on each rank for Replicate: the
               sequence-parallel norms' weights) to the norms the same program records at world size 1;
               param_placements; no warning
llama_nan      rank 1 puts a NaN into layer 1's feed-forward hidden slice at step 3: nan_origin names rank 1, step 3,
               layer 1, its spread to rank 0 by a reduce-scatter; the first nonfinite_activation alert is rank 1's w2
               output, printed live by capture
llama_hang     rank 0 stalls before step 3: the hang names rank 0 as the one that never entered the embedding's
               reduce-scatter; the live WAITING line names it before the watchdog fires
fsdp2d_healthy samples/python/fsdp_tp_2d.py at 4 ranks, TP 2 x DP 2: FSDP2's all-gathers (forward and backward)
               and reduce-scatters in the dp groups, DTensor's collectives in the tp groups, matched across the members
               and completed; each parameter's local shard a quarter of it (dp:S(0) tp:S(0)), or a half for the
               tp-replicated norms (dp:S(0) tp:R); no warning
fsdp2d_nan     rank 3 (tp 1, dp 1) puts the NaN into layer 1 at step 3: nan_origin names rank 3, step 3, layer 1, and
               its spread: to rank 2 by w2's tp-1 reduce-scatter, to the other DP replica (ranks 0, 1) by FSDP2's
               gradient reduce-scatters in dp-0 and dp-1; no second origin
fsdp2d_replay  the same NaN with the sample's step given to tpscope (--replay-hook): the replay before step 3's update
               names rank 3's operator in layers.1.feed_forward's forward, verdict reproducible — not rank 0 or 1,
               whose first bad values arrive by FSDP2's gradient reduce-scatter (Gloo copies the reduced chunk into
               the output inside the call: what a recorded ProcessGroup call runs is the collective's), nor rank 2
               (w2's tp-1 reduce-scatter)
fsdp2d_hang    rank 2 stalls before step 3: the hang names rank 2 as the one that never entered FSDP2's root all-gather
               in dp-0 (its tp-1 peer's wait is a consequence); the live WAITING line names it before the watchdog
"""

import argparse
import json
import math
import os
import subprocess
import sys

from dtensor_test import diagnose, fail, open_db  # the python_dtensor_* tests' helpers

STEPS = 4
DIM, HIDDEN = 32, 64
SAMPLE_ARGS = ["--steps", str(STEPS), "--dim", str(DIM), "--heads", "4", "--hidden", str(HIDDEN), "--layers", "2",
               "--seq", "8", "--batch", "2", "--vocab", "64", "--timeout", "8"]
COLLECTIVE_OPS = ("all_gather", "reduce_scatter", "all_reduce")


def capture(args, sample, out, nproc, extra, fault_args, expect_status):
    cmd = [args.tpscope, "capture", "--nproc", str(nproc), "--out", out] + extra + \
          ["--", args.python, os.path.join(args.samples, sample)] + SAMPLE_ARGS + fault_args
    env = dict(os.environ, TPSCOPE_SAMPLE_DEVICE="cpu")
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=100, env=env)
    logs = ""
    for r in range(nproc):
        path = os.path.join(out, "logs", "rank-%d.log" % r)
        if os.path.exists(path):
            logs += "\n---- rank %d log ----\n" % r + open(path).read()[-3000:]
    if p.returncode != expect_status:
        fail("capture exited %d, expected %d\n%s" % (p.returncode, expect_status, " ".join(cmd)), p.stdout + logs)
    print(p.stdout)
    return os.path.join(out, "run.db"), p.stdout, p.stdout + logs


def same_collectives(db, ranks, log):
    """Each group's (seq, op, state) list identical on its members, every record completed; returns the groups."""
    by_group = {}
    for rank, group, seq, op, state in db.execute(
            "SELECT rank, group_name, seq, op, state FROM collectives ORDER BY rank, group_name, seq"):
        by_group.setdefault(group, {}).setdefault(rank, []).append((seq, op, state))
    for group, members in by_group.items():
        lists = list(members.values())
        if any(l != lists[0] for l in lists):
            fail("the members of %s recorded different collectives: %s" % (group, members), log)
        if any(state != "completed" for _, _, state in lists[0]):
            fail("collectives of %s left uncompleted: %s" % (group, lists[0]), log)
    return by_group


def no_warnings(args, run, log):
    bad = [f for f in diagnose(args, run) if f["severity"] in ("warning", "error", "critical")]
    if bad:
        fail("a healthy run has findings: %s" % json.dumps(bad, indent=1), log)


def callsites(db, group_like):
    return {s for (s,) in db.execute("SELECT DISTINCT callsite FROM collectives WHERE group_name LIKE ?",
                                     (group_like,))}


def check_spans(db, rank, name, log):
    spans = dict(db.execute("SELECT phase, count(*) FROM span_view WHERE rank = ? AND name = ? GROUP BY phase",
                            (rank, name)).fetchall())
    if spans != {"fwd": STEPS, "bwd": STEPS}:
        fail("spans of %s on rank %d: %s, expected %d forward and %d backward" % (name, rank, spans, STEPS, STEPS),
             log)


def placements_of(db, key="param_placements"):
    meta = dict(db.execute("SELECT key, value FROM meta WHERE key = ?", (key,)).fetchall())
    return json.loads(meta.get(key, "{}"))


def check_llama_healthy(args):
    run, _, log = capture(args, "llama_tp.py", os.path.join(args.work, "tp2"), 2, [], [], 0)
    db = open_db(run)
    groups = same_collectives(db, (0, 1), log)
    ops = {op for _, op, _ in next(iter(groups["world"].values()))}
    if not set(COLLECTIVE_OPS) <= ops:
        fail("ops recorded: %s, expected all of %s" % (ops, COLLECTIVE_OPS), log)
    sites = callsites(db, "world")
    for want in ("Transformer forward reduce-scatter",          # the embedding's Partial -> Shard(1)
                 "layers.0.attention forward all-gather",       # PrepareModuleInput: Shard(1) -> Replicate
                 "layers.1.feed_forward forward reduce-scatter",  # w2: Partial -> Shard(1)
                 "layers.1.feed_forward backward all-gather",   # the reduce-scatter's gradient
                 "layers.0 backward reduce-scatter"):            # PrepareModuleInput's all-gather's gradient
        if want not in sites:
            fail("no collective at %r among %s" % (want, sorted(sites)), log)
    per_step = db.execute("SELECT count(*) FROM collectives WHERE rank = 0 AND callsite = "
                          "'layers.0.attention forward all-gather'").fetchone()[0]
    if per_step != STEPS:
        fail("layers.0.attention's forward all-gather recorded %d times in %d steps" % (per_step, STEPS), log)
    for name in ("layers.1.feed_forward", "layers.0.attention", "layers.0.attention_norm"):
        check_spans(db, 1, name, log)
    placements = placements_of(db)
    want = {"layers.0.feed_forward.w1.weight": "tp:S(0)", "layers.0.feed_forward.w2.weight": "tp:S(1)",
            "layers.0.attention_norm.weight": "tp:R", "tok_embeddings.weight": "tp:S(0)"}
    got = {k: placements.get(k) for k in want}
    if got != want:
        fail("param_placements: %s, expected %s" % (got, want), log)
    numel = dict(db.execute("SELECT param, numel FROM grad_view WHERE rank = 1 AND step = 1").fetchall())
    if numel.get("layers.0.feed_forward.w1.weight") != HIDDEN * DIM // 2:
        fail("layers.0.feed_forward.w1.weight's local shard: %s elements, expected %d" % (
            numel.get("layers.0.feed_forward.w1.weight"), HIDDEN * DIM // 2), log)

    # The gradients' own placements where they differ: the sequence-parallel norms' weights are Partial (each rank
    # holds its sequence shard's sum), the embedding's gradient is replicated whole on each rank.
    grad_placements = placements_of(db, "grad_placements")
    want = {"layers.0.attention_norm.weight": "tp:P(sum)", "norm.weight": "tp:P(sum)", "tok_embeddings.weight": "tp:R"}
    got = {k: grad_placements.get(k) for k in want}
    if got != want or "layers.0.feed_forward.w1.weight" in grad_placements:
        fail("grad_placements: %s, expected %s and nothing for the Colwise/Rowwise weights" % (grad_placements, want),
             log)
    no_warnings(args, run, log)

    # The same program at world size 1: the whole gradients, step 1 (before the updates could differ in rounding).
    run1, _, log1 = capture(args, "llama_tp.py", os.path.join(args.work, "tp1"), 1, [], [], 0)
    whole = dict(open_db(run1).execute("SELECT param, l2_norm FROM grad_view WHERE step = 1").fetchall())
    shards = {}
    for rank, param, norm in db.execute("SELECT rank, param, l2_norm FROM grad_view WHERE step = 1"):
        shards.setdefault(param, {})[rank] = norm
    if set(shards) != set(whole):
        fail("parameters at TP 2 %s and at TP 1 %s differ" % (sorted(shards), sorted(whole)), log + log1)
    for param, by_rank in shards.items():
        layout = grad_placements.get(param, placements.get(param, ""))
        if "P(" in layout:  # partial sums: the whole is their sum, so its norm is at most the sum of their norms
            if not whole[param] <= sum(by_rank.values()) * (1 + 1e-5):
                fail("%s (%s): the partial gradients' norms %s sum below the whole's %.7g" % (
                    param, layout, by_rank, whole[param]), log + log1)
            continue
        if "S(" in layout:
            got = math.sqrt(sum(n * n for n in by_rank.values()))
        else:
            got = by_rank[0]
            if not math.isclose(by_rank[0], by_rank[1], rel_tol=1e-5):
                fail("replicated %s differs between the ranks: %s" % (param, by_rank), log)
        if not math.isclose(got, whole[param], rel_tol=1e-4, abs_tol=1e-7):
            fail("%s (%s): the shards combine to %.7g, world size 1 records %.7g" % (param, layout, got,
                                                                                     whole[param]), log + log1)


def check_nan(args, sample, nproc, extra, rank, log_rank_param, spread_via):
    run, out, log = capture(args, sample, os.path.join(args.work, "run"), nproc, extra,
                            ["--nan-at", "%d:3:1" % rank], 0)
    origin = [f for f in diagnose(args, run) if f["kind"] == "nan_origin"]
    if not origin:
        fail("no nan_origin finding", log)
    f = origin[0]
    if (f.get("rank"), f.get("step"), f.get("layer")) != (rank, 3, 1):
        fail("nan_origin names rank %s step %s layer %s, expected rank %d step 3 layer 1: %s" %
             (f.get("rank"), f.get("step"), f.get("layer"), rank, json.dumps(f, indent=1)), log)
    # one origin: every other rank received the NaN through a collective the spread names (none is a second origin)
    if len(origin) > 1:
        fail("a second nan_origin (an affected rank the spread does not explain): %s" % json.dumps(origin[1:], indent=1),
             log)
    if sorted(f.get("ranks", [])) != [r for r in range(nproc) if r != rank]:
        fail("nan_origin's receivers: %s, expected every other rank" % f.get("ranks"), log)
    spread = " ".join(d for d in f.get("details", []) if d.startswith("spread:"))
    for via in spread_via:
        if via not in spread:
            fail("the spread does not go through %r: %s" % (via, spread), log)
    first = open_db(run).execute("SELECT rank, step, layer, param FROM alerts WHERE kind = 'nonfinite_activation' "
                                 "ORDER BY ts_ns LIMIT 1").fetchone()
    if first != (rank, 3, 1, log_rank_param):
        fail("the first nonfinite_activation alert: %s, expected %s" % (first, (rank, 3, 1, log_rank_param)), log)
    if "nonfinite_activation" not in out:
        fail("capture printed no live nonfinite_activation alert", log)


def check_replay(args, sample, nproc, extra, rank, span):
    run, out, log = capture(args, sample, os.path.join(args.work, "run"), nproc, extra,
                            ["--nan-at", "%d:3:1" % rank, "--replay-hook"], 0)
    alerts = open_db(run).execute("SELECT rank, step, evidence FROM alerts WHERE kind = 'replay'").fetchall()
    if len(alerts) != 1:
        fail("replay alerts: %s" % alerts, log)
    ev = json.loads(alerts[0][2])
    op = ev.get("op", {})
    if alerts[0][:2] != (rank, 3) or ev.get("verdict") != "reproducible" or op.get("span") != span \
            or op.get("pass") != "forward" or op.get("received"):
        fail("the replay names rank %s step %s, expected rank %d step 3 in %s's forward: %s" %
             (alerts[0][0], alerts[0][1], rank, span, json.dumps(ev, indent=1)), log)
    replays = [f for f in diagnose(args, run) if f["kind"] == "replay"]
    if len(replays) != 1 or (replays[0]["rank"], replays[0]["step"]) != (rank, 3):
        fail("replay findings: %s" % json.dumps(replays, indent=1), log)


def check_hang(args, sample, nproc, extra, rank, groups, site):
    run, out, log = capture(args, sample, os.path.join(args.work, "run"), nproc, extra + ["--hang-timeout", "5"],
                            ["--skip-collective", "%d:3" % rank], 3)
    hangs = [f for f in diagnose(args, run) if f["kind"] == "hang" and f["severity"] == "critical"]
    if len(hangs) != 1:
        fail("expected one critical hang: %s" % json.dumps(hangs, indent=1), log)
    h = hangs[0]
    c = h.get("collective", {})
    if h.get("rank") != rank or c.get("group") not in groups or "never entered" not in h["message"]:
        fail("the hang names rank %s, %s: %s; expected rank %d never entering a collective of %s" %
             (h.get("rank"), c, h["message"], rank, groups), log)
    if site is not None and site not in h["message"]:
        fail("the hang's message lacks the call site %r: %s" % (site, h["message"]), log)
    # Named live first, seconds after the peers blocked, before the watchdog's 5 s.
    live = "WAITING  %s seq %d (" % (c.get("group"), c.get("seq", -1))
    at, watchdog = out.find(live), out.find("no progress for 5 s")
    if at < 0 or watchdog < 0 or at > watchdog:
        fail("no live line %r before the watchdog" % live, log)
    line = out[at:out.find("\n", at)]
    if "rank %d has not entered it" % rank not in line:
        fail("the live line does not name rank %d: %s" % (rank, line), log)


def check_fsdp2d_healthy(args):
    run, _, log = capture(args, "fsdp_tp_2d.py", os.path.join(args.work, "run"), 4, ["--tp", "2"], [], 0)
    db = open_db(run)
    ranks = db.execute("SELECT rank, tp_rank, tp_size, dp_rank, dp_size FROM ranks ORDER BY rank").fetchall()
    if ranks != [(r, r % 2, 2, r // 2, 2) for r in range(4)]:
        fail("ranks rows: %s" % ranks, log)
    groups = same_collectives(db, range(4), log)
    for g in ("tp-0", "tp-1", "dp-0", "dp-1"):
        if g not in groups:
            fail("no collective in %s: groups %s" % (g, sorted(groups)), log)
    dp_ops = {op for _, op, _ in next(iter(groups["dp-0"].values()))}
    if not {"all_gather", "reduce_scatter"} <= dp_ops:
        fail("FSDP2's ops in dp-0: %s" % dp_ops, log)
    sites = callsites(db, "dp-%")
    # named after the module whose parameters move, wherever FSDP2 issues them (prefetch, final callback)
    for want in ("layers.0 forward all-gather", "layers.0 backward all-gather", "layers.1 backward all-gather",
                 "layers.0 backward reduce-scatter", "layers.1 backward reduce-scatter",
                 "FSDPTransformer backward reduce-scatter"):
        if want not in sites:
            fail("no FSDP2 collective at %r among %s" % (want, sorted(sites)), log)
    layers = dict(db.execute("SELECT DISTINCT callsite, layer FROM collectives WHERE group_name LIKE 'dp-%' "
                             "AND callsite LIKE 'layers.%'").fetchall())
    if any(layer != int(site.split(".")[1].split()[0]) for site, layer in layers.items()):
        fail("FSDP2 collectives' layers: %s" % layers, log)
    tp_sites = callsites(db, "tp-%")
    if "layers.1.feed_forward forward reduce-scatter" not in tp_sites:
        fail("no TP reduce-scatter at layers.1.feed_forward among %s" % sorted(tp_sites), log)
    # FSDP2 all-gathers each block's parameters once per step in forward (DP = 2: a dp-0 all-gather per block)
    ag = db.execute("SELECT count(*) FROM collectives WHERE rank = 0 AND group_name = 'dp-0' AND callsite = "
                    "'layers.0 forward all-gather'").fetchone()[0]
    if ag != STEPS:
        fail("layers.0's forward all-gather recorded %d times in %d steps" % (ag, STEPS), log)
    check_spans(db, 3, "layers.1.feed_forward", log)
    placements = placements_of(db)
    # dim 0 sharded by both: FSDP2's strided shard over dp (_S(0, 2)) of the tp shard
    want = {"layers.0.feed_forward.w1.weight": "dp:_S(0, 2) tp:S(0)", "layers.0.feed_forward.w2.weight":
            "dp:S(0) tp:S(1)", "layers.0.attention_norm.weight": "dp:S(0) tp:R"}
    got = {k: placements.get(k) for k in want}
    if got != want:
        fail("param_placements: %s, expected %s" % (got, want), log)
    numel = dict(db.execute("SELECT param, numel FROM grad_view WHERE rank = 3 AND step = 1").fetchall())
    if (numel.get("layers.0.feed_forward.w1.weight"), numel.get("layers.0.attention_norm.weight")) != \
            (HIDDEN * DIM // 4, DIM // 2):
        fail("local shards on rank 3: %s" % numel, log)
    no_warnings(args, run, log)


def main():
    p = argparse.ArgumentParser()
    cases = {
        "llama_healthy": check_llama_healthy,
        "llama_nan": lambda a: check_nan(a, "llama_tp.py", 2, [], 1, "layers.1.feed_forward.w2 output",
                                         ["reduce_scatter group world"]),
        "llama_hang": lambda a: check_hang(a, "llama_tp.py", 2, [], 0, ("world",),
                                           "Transformer forward reduce-scatter"),
        "fsdp2d_healthy": check_fsdp2d_healthy,
        # rank 3 → its tp peer 2 (w2's reduce-scatter), then each to its DP peer by FSDP2's gradient reduce-scatter
        "fsdp2d_nan": lambda a: check_nan(a, "fsdp_tp_2d.py", 4, ["--tp", "2"], 3, "layers.1.feed_forward.w2 output",
                                          ["reduce_scatter group tp-1", "reduce_scatter group dp-0",
                                           "reduce_scatter group dp-1"]),
        "fsdp2d_replay": lambda a: check_replay(a, "fsdp_tp_2d.py", 4, ["--tp", "2"], 3, "layers.1.feed_forward"),
        # rank 0 enters dp-0's all-gather first thing in step 3; rank 3 reaches tp-1 only after dp-1's
        "fsdp2d_hang": lambda a: check_hang(a, "fsdp_tp_2d.py", 4, ["--tp", "2"], 2, ("dp-0",),
                                            "FSDPTransformer forward all-gather"),
    }
    p.add_argument("--case", choices=sorted(cases), required=True)
    p.add_argument("--tpscope", required=True)
    p.add_argument("--python", required=True)
    p.add_argument("--samples", required=True)
    p.add_argument("--work", required=True)
    args = p.parse_args()
    os.makedirs(args.work, exist_ok=True)
    cases[args.case](args)
    print("PASS python_tp_samples_%s" % args.case)


if __name__ == "__main__":
    main()
