#!/usr/bin/env python3
"""The backward spans of Python modules, from both walks (label unit): walk_test.py --python PY --work DIR

walk_program.py runs twice, once with the C++ walk (tpscope._autograd, the default where it was built) and once with
TPSCOPE_AUTOGRAD=python. Each run's backward spans must match, per step, the module calls the program counted itself
(a span per call that made a node needing a gradient: a module called twice has two, one that returns its input has
none), name the right module as running inside a custom Function's backward (where collectives are charged), and the
two runs must nest their spans the same way (which span lies inside which). Where the build made
tpscope._autograd for this PyTorch, the default run must have used it — a C++ walk that silently fell back to Python
fails here — and after training it must hold no autograd node and no running span. The module-output check's
findings (the C++ one in tpscope._autograd.post_hook, the Python one in _modules) must be the same, call for call:
the dict output's transposed view handed back to be summed in every forward, the NaN first found at blocks.1.poison's
output in the last step and nowhere before.
"""

import argparse
import collections
import json
import os
import shutil
import sqlite3
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def fail(message):
    sys.stderr.write("FAIL: %s\n" % message)
    sys.exit(1)


def run(python, work, walk):
    out = os.path.join(work, walk)
    os.makedirs(out)
    env = dict(os.environ)
    env.pop("TPSCOPE_AUTOGRAD", None)
    if walk == "python":
        env["TPSCOPE_AUTOGRAD"] = "python"
    p = subprocess.run([python, os.path.join(HERE, "walk_program.py"), out], env=env, capture_output=True, text=True,
                       timeout=90)
    if p.returncode != 0:
        fail("walk_program.py (%s walk) exited %d:\n%s" % (walk, p.returncode, p.stderr[-3000:]))
    report = json.loads(p.stdout.strip().splitlines()[-1])
    db = sqlite3.connect(os.path.join(out, "rank-0.db"))
    meta = db.execute("SELECT value FROM meta WHERE key = 'backward_walk'").fetchall()
    if meta != [(report["walk"],)]:
        fail("%s walk: the rank file's meta backward_walk is %r, the process used %r" % (walk, meta, report["walk"]))
    spans = db.execute("SELECT step, name, layer, begin_ns, end_ns FROM span_view WHERE phase = 'bwd' AND "
                       "kind = 'compute' AND name != 'backward' ORDER BY step, begin_ns, end_ns DESC").fetchall()
    return report, spans


def check_counts(walk, report, spans):
    for step, want in enumerate(report["expected"], start=1):
        got = collections.Counter(name for s, name, *_ in spans if s == step)
        if got != collections.Counter(want):
            fail("%s walk, step %d: backward spans per module %r, the program's own count of its calls %r"
                 % (walk, step, dict(sorted(got.items())), dict(sorted(want.items()))))
    # Double's backward runs inside blocks.1.scaled's region, then blocks.0.scaled's, once per step (layer = block).
    want_inside = [["blocks.1.scaled", 1], ["blocks.0.scaled", 0]] * len(report["expected"])
    if report["inside"] != want_inside:
        fail("%s walk: the module running during the custom Function's backward was %r, want %r"
             % (walk, report["inside"], want_inside))
    for step, name, layer, begin, end in spans:
        want_layer = int(name.split(".")[1]) if name.startswith("blocks.") else -1
        if layer != want_layer or end < begin:
            fail("%s walk: span %s of step %d has layer %d and [%d, %d]" % (walk, name, step, layer, begin, end))


def check_findings(runs):
    default, python = runs["default"][0]["watched"], runs["python"][0]["watched"]
    if default != python:
        fail("the output checks differ: %s walk %r, Python walk %r" % (runs["default"][0]["walk"], default, python))
    views = collections.Counter(step for step, name, kind in python if name.endswith(".view") and kind == "tensor")
    # steps 1 and 2: training and evaluation forwards, 2 blocks each (step 2 adds the forward that raised in block 0)
    if views != {1: 4, 2: 5, 3: 2}:
        fail("the non-contiguous view outputs handed back per step: %r" % dict(views))
    nonfinite = [(step, name) for step, name, kind in python if kind == "nonfinite"]
    if not nonfinite or nonfinite[0] != (3, "blocks.1.poison"):
        fail("the first non-finite output found: %r, want blocks.1.poison in step 3" % (nonfinite[:3],))


def nesting(spans):
    """(step, inner name, its occurrence, outer name, its occurrence) for every span inside another of its step."""
    seen = collections.Counter()
    keyed = []
    for step, name, _, begin, end in spans:
        seen[(step, name)] += 1
        keyed.append((step, name, seen[(step, name)], begin, end))
    pairs = set()
    for a in keyed:
        for b in keyed:
            if a is not b and a[0] == b[0] and b[3] <= a[3] and a[4] <= b[4] and (a[3], a[4]) != (b[3], b[4]):
                pairs.add((a[0], a[1], a[2], b[1], b[2]))
    return pairs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--python", required=True)
    p.add_argument("--work", required=True)
    args = p.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    from tpscope import _build
    runs = {walk: run(args.python, args.work, walk) for walk in ("default", "python")}
    for walk, (report, spans) in runs.items():
        check_counts(walk, report, spans)
    default = runs["default"][0]
    if _build.AUTOGRAD_TORCH_VERSION and default["walk"] != "C++":
        fail("tpscope._autograd was built for torch %s but the default run walked in %s"
             % (_build.AUTOGRAD_TORCH_VERSION, default["walk"]))
    if runs["python"][0]["walk"] != "Python":
        fail("TPSCOPE_AUTOGRAD=python did not select the Python walk")
    for walk, (report, _) in runs.items():
        if report["held"]["claimed"] or report["held"]["running"]:
            fail("the %s walk still holds %r after training" % (report["walk"], report["held"]))
    check_findings(runs)
    inner = {walk: nesting(spans) for walk, (_, spans) in runs.items()}
    if inner["default"] != inner["python"]:
        fail("the walks nest spans differently: only %s walk %r; only Python walk %r"
             % (default["walk"], sorted(inner["default"] - inner["python"])[:10],
                sorted(inner["python"] - inner["default"])[:10]))
    if not any(outer == "blocks.1" and name == "blocks.1.mix.fc" for _, name, _, outer, _ in inner["python"]):
        fail("blocks.1.mix.fc's backward span is not inside blocks.1's")
    print("PASS python_walk_test (%s and Python walks, %d spans each)" % (default["walk"], len(runs["python"][1])))


if __name__ == "__main__":
    main()
