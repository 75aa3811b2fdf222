"""bench/capture/run_overhead.py's statistics and port helper for the bench/python scripts that compare runs:
ratio_ci (a bootstrap 95 % confidence interval of a median), ci_text, free_port (loaded by path: bench/python has a
run_overhead.py of its own); and timed, the timer the scripts that attribute time put around tpscope's entry points."""
import importlib.util
import os
import types

_spec = importlib.util.spec_from_file_location(
    "capture_run_overhead", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "capture", "run_overhead.py"))
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)

ratio_ci = _module.ratio_ci
ci_text = _module.ci_text
free_port = _module.free_port


def timed(owner, name, tally, label, clock):
    """Replaces OWNER.NAME with a wrapper that adds the time each call spends inside it, on CLOCK, and the call to
    TALLY[LABEL] ([time, calls]; TALLY a defaultdict(lambda: [0, 0]))."""
    inner = getattr(owner, name)

    def call(*a, **k):
        t0 = clock()
        try:
            return inner(*a, **k)
        finally:
            entry = tally[label]
            entry[0] += clock() - t0
            entry[1] += 1

    setattr(owner, name, call)


def timed_hooks(modules, tally, labels, clock):
    """Times the global module hooks tpscope._modules.install() registers (modules.hooks(): tpscope._autograd's C
    callables or the Python ones, whichever walk is in use) as LABELS (pre-hook, post-hook). Before instrument()."""
    chosen = modules.hooks

    def hooks():
        pair = types.SimpleNamespace(pre=None, post=None)
        pair.pre, pair.post = chosen()
        timed(pair, "pre", tally, labels[0], clock)
        timed(pair, "post", tally, labels[1], clock)
        return pair.pre, pair.post

    modules.hooks = hooks
