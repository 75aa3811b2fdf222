"""The program's step replay (`tpscope.set_step_replay(fn)`): a step whose values went non-finite, run again op by op.

The program gives a function that runs the current step's forward and backward again, on the same batch: the work
between the step's start and the training optimizer's step(). The parameters have not been updated yet when it is
called, so the function needs no state of its own; tpscope restores what else the step started from — the random
number generators (CPU and every CUDA device, as they were when the previous step ended, so dropout draws the same
masks) — and sets every gradient of the training optimizer aside, then puts them back after the replay, so the run goes
on as it would have.

When: once per run, before the update of the first step in which any rank saw a non-finite module output, loss or
gradient. Every rank must take part (the function issues the step's collectives), so the ranks agree on it: with the
hook set, the step's health vote (an all-reduce MAX over the default group, as skip-step's) also carries "a non-finite
value here" — one small collective per step, which skip-step and stop pay already.

The replay runs under the op check (_opcheck): each rank stops at its first operator whose output holds a NaN or +Inf.
Then one more all-reduce (MIN) decides what to say: the lowest rank whose first bad value did not arrive through a
collective (it made it, or read it from a parameter, a constant or the data) is named — the value was born there —,
else the lowest rank that found one. Verdict, as `tpscope replay` gives it for tpscope-train: **reproducible** (an
operator made it again: a numerical or data problem; the operator named) or **transient** (the replay is clean on every
rank: suspect the hardware of the rank where the value was born — the NaN origin says which). The verdict is one alert
of kind `replay` (by the named rank, or by the lowest rank that saw a non-finite value), which `diagnose` shows under
the origin of its step.

Cost: nothing per step but one RNG state copy (CPU, and CUDA where initialised) and the vote's extra element; the
replay itself costs one more forward and backward with every operator checked, once.
"""

import json
import sys

import torch
import torch.distributed as dist

from . import _native, _opcheck, _rank
from ._native import kinds as K
from ._state import STATE

_fn = None
_done = False
_rng = None  # (CPU generator state, [CUDA generator states] or None) when the current step began

_NOBODY = 1 << 30


def set_step_replay(fn):
    """Registers `fn` (no arguments): runs the current step's forward and backward again, on the same batch, up to
    (not including) optimizer.step(). None removes it."""
    global _fn
    if fn is not None and not callable(fn):
        raise TypeError("tpscope.set_step_replay: expected a function, got %r" % type(fn).__name__)
    _fn = fn
    if fn is not None:
        step_begins()


def armed():
    """True while a replay may still happen in this run (a function is set, none has run, the op check exists)."""
    return _fn is not None and not _done and _opcheck.available() and _native.recording()


def step_begins():
    """The next step begins: keep the generators' state it starts from."""
    global _rng
    if _fn is None or _done:
        return
    _rng = _rng_now()


def _rng_now():
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _set_rng(state):
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def run(step, optimizer, nonfinite_here, micro):
    """Replays step `step` (every rank calls this, at the same point). `nonfinite_here`: this rank saw a non-finite
    value in the step; `micro`: () -> the micro-batch the replay is in. Returns the verdict ("reproducible",
    "transient", or "failed" when some rank's function raised)."""
    global _done
    _done = True
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    params = [p for g in optimizer.param_groups for p in g["params"]]
    stash = [p.grad for p in params]
    for p in params:
        p.grad = None
    now = _rng_now()
    check = _opcheck.OpCheck(rank, step, step)
    check.micro = micro
    error = None
    t0 = _native.ticks()
    STATE.replaying = True
    try:
        if _rng is not None:
            _set_rng(_rng)
        check.step_begin(step)
        _fn()
    except Exception as e:  # the program's function: its failure is reported, never raised into the program
        error = "%s: %s" % (type(e).__name__, e)
    finally:
        check.close()
        STATE.replaying = False
        for p, g in zip(params, stash):
            p.grad = g
        _set_rng(now)
        _native.span_end(_native.site("tpscope step replay", K.SPAN_COMPUTE, K.PHASE_NONE), t0, -1)
    found = check.found is not None
    msg, ev, layer = check.describe(step) if found else (None, None, -1)
    born = found and not ev["received"]
    born_at, found_at, seen_at, failed = _rank.all_reduce_ints(
        [rank if born else _NOBODY, rank if found else _NOBODY, rank if nonfinite_here else _NOBODY,
         0 if error else 1], dist.ReduceOp.MIN, "tpscope step replay vote all-reduce")
    if error:
        sys.stderr.write("tpscope: the step replay's function raised on rank %d: %s\n" % (rank, error))
    if failed == 0:
        verdict, writer = "failed", seen_at
    elif found_at != _NOBODY:
        verdict, writer = "reproducible", born_at if born_at != _NOBODY else found_at
    else:
        verdict, writer = "transient", seen_at
    if rank == writer:
        _alert(step, verdict, msg, ev, layer, error)
    return verdict


def _alert(step, verdict, msg, ev, layer, error):
    evidence = {"verdict": verdict, "step": step, "run_had_nonfinite": True, "source": "hook", "from_step": step}
    if verdict == "reproducible":
        evidence["op"] = ev
        text = "replay of step %d (the program's hook): reproducible — %s" % (step, msg)
        severity = K.SEVERITY_INFO
    elif verdict == "transient":
        text = ("replay of step %d (the program's hook): transient — no rank made a NaN/+Inf again: suspect the "
                "hardware of the rank where the value was born (the NaN origin)" % step)
        severity = K.SEVERITY_WARNING
    else:
        evidence["error"] = error or "on another rank"
        text = "replay of step %d (the program's hook): failed — the replay function raised (%s)" % (
            step, error or "on another rank")
        severity = K.SEVERITY_WARNING
    _native.alert(severity, "replay", step, layer, ev["op"] if ev else "", text, json.dumps(evidence))
    _native.flush()
    sys.stderr.write("tpscope: %s\n" % text)
