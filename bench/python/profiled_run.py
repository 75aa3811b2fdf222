#!/usr/bin/env python3
"""Runs a Python script unchanged under torch.profiler, as `python3 -m tpscope.run` runs one under tpscope.

    python3 bench/python/profiled_run.py [--trace FILE] SCRIPT ARGS

The script runs as `python3 SCRIPT ARGS` would (as __main__, sys.argv = [SCRIPT, ARGS], its folder first on sys.path)
inside `torch.profiler.profile(activities=[CPU], record_shapes=False)`: every op of the whole run is recorded, as
tpscope records every module call, collective and step. What stopping the profiler costs (it builds its event tree
then) and, with --trace, the Chrome trace's export are timed and printed to stderr; they come after the script's last
step, so the step times the script reports do not include them.
"""
import os
import runpy
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile


def main():
    argv = sys.argv[1:]
    trace = None
    if len(argv) >= 2 and argv[0] == "--trace":
        trace, argv = argv[1], argv[2:]
    if not argv:
        raise SystemExit("usage: profiled_run.py [--trace FILE] SCRIPT ARGS")
    script = os.path.abspath(argv[0])
    sys.argv = [script] + argv[1:]
    sys.path[0] = os.path.dirname(script)
    prof = profile(activities=[ProfilerActivity.CPU], record_shapes=False)
    prof.start()
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        t0 = time.perf_counter()
        prof.stop()
        t1 = time.perf_counter()
        if trace:
            prof.export_chrome_trace(trace)
        sys.stderr.write("profiled_run: stop %.3f s, export %.3f s\n" % (t1 - t0, time.perf_counter() - t1))


if __name__ == "__main__":
    main()
