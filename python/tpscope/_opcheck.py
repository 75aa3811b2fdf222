"""`--on-nonfinite trace-ops` for Python programs: after a step that raised a non-finite alert on this rank, every
ATen operator of the steps that follow is checked, until the first one whose output holds a NaN or +Inf is named —
the operator, forward or backward, the module it ran in, the micro-batch, its inputs' statistics — in one alert of
kind `op_check` (the engine's op check, core/op_check.h, writes the same alert; docs/capture.md).

How: a TorchDispatchMode, entered at the start of the step after the alert and left at the end of the step that
named the operator (or when the process ends). It sees every operator below autograd, forward and backward (autograd
runs the backward on this thread on CPU; PyTorch carries the mode to its device threads). −Inf alone is how
attention masks are written: it is counted, never reported; the outputs of allocations and of views (a view's values
are its input's) are not checked. Collectives are not checked either (c10d returns before the transfer lands); what
they hand over is marked, so an operator whose bad input came from one says so (`received`: the value arrived from a
peer; the step replay, _replay, names the rank where it was born). Cost: one reduction per tensor input and output of every operator, on the traced
steps only; nothing at all before the first alert.
"""

import json
import math
import sys
import threading

import torch

from . import _host, _modules, _native
from ._state import STATE

try:
    from torch.utils._python_dispatch import TorchDispatchMode
except ImportError:  # a PyTorch without dispatch modes: trace-ops is refused at start-up (_training)
    TorchDispatchMode = None

# Allocations (uninitialised memory may hold any bits) and operators that change only metadata.
_UNCHECKED = {"empty", "new_empty", "empty_like", "empty_strided", "new_empty_strided", "resize_", "resize_as_",
              "set_", "as_strided_", "squeeze_", "unsqueeze_", "transpose_", "t_", "detach_", "requires_grad_"}
# Collectives return before the transfer has landed (c10d) or hand back a tensor to wait on (functional collectives).
_COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")


def _stat(t):
    """(kind, dtype, shape, nan, posinf, neginf, max_abs) of a tensor or a number; None for anything else. A DTensor's
    local shard is read (no collective: ranks whose checks differ must not issue different collectives)."""
    if isinstance(t, torch.Tensor):
        t = _host.local(t)
        if t.is_meta or t.numel() == 0 or not (t.is_floating_point() or t.is_complex()):
            return ("tensor", str(t.dtype).replace("torch.", ""), list(t.shape), 0, 0, 0, None)
        d = t.detach()
        if d.is_complex():
            d = torch.view_as_real(d)
        m = float(torch.linalg.vector_norm(d, float("inf")))
        nan = pos = neg = 0
        if not math.isfinite(m):
            nan = int(torch.isnan(d).sum())
            pos = int(torch.isposinf(d).sum())
            neg = int(torch.isneginf(d).sum())
        return ("tensor", str(t.dtype).replace("torch.", ""), list(t.shape), nan, pos, neg, m)
    if isinstance(t, float):
        return ("scalar", "float64", [], int(math.isnan(t)), int(t == math.inf), int(t == -math.inf), abs(t))
    return None


def _bad(s):
    return s[3] > 0 or s[4] > 0  # NaN or +Inf (−Inf alone: a mask)


def _storage(t):
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # tensor subclasses without storage
        return id(t)


def _flat(x, out):
    if isinstance(x, (list, tuple)):
        for y in x:
            _flat(y, out)
    elif isinstance(x, dict):
        for y in x.values():
            _flat(y, out)
    else:
        out.append(x)
    return out


def _json_number(v):
    if v is None:
        return None
    return "nan" if math.isnan(v) else "inf" if math.isinf(v) else v


class _Mode(TorchDispatchMode if TorchDispatchMode is not None else object):
    def __init__(self, checker):
        super().__init__()
        self.checker = checker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        c = self.checker
        if c.found is not None or c.busy:
            return func(*args, **kwargs)
        if func.namespace in _COLLECTIVE_NAMESPACES or getattr(_inside, "depth", 0) > 0:
            # Inside a recorded ProcessGroup call, the operators are the backend's transport (Gloo's reduce-scatter
            # copies the reduced chunk into the output): their values are the collective's, not computed here.
            out = func(*args, **kwargs)
            # What a collective hands over may carry a peer's value: a bad value first read from one arrived.
            c.received.update(_storage(t) for t in _flat((args, kwargs, out), []) if isinstance(t, torch.Tensor))
            return out
        if func.overloadpacket.__name__ in _UNCHECKED:
            return func(*args, **kwargs)
        c.busy = True
        try:
            values = _flat((args, kwargs), [])
            inputs = [_stat(v) for v in values]
            out = func(*args, **kwargs)
            outs = [o for o in _flat(out, []) if isinstance(o, torch.Tensor)]
            storages = {_storage(v) for v in values if isinstance(v, torch.Tensor)}
            writes = any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)
            # A zero-dimensional output whose only NaN/+Inf source is a number (a constant promoted to a tensor, as
            # isfinite's +Inf) is a constant, not a computed value — unless the operator wrote it into an input
            # (`x.view(-1)[0] = nan`: the write lands in x). Where no input holds one, the operator computed it.
            bad_inputs = [s for s in inputs if s is not None and _bad(s)]
            from_numbers = not writes and bool(bad_inputs) and all(s[0] == "scalar" or not s[2] for s in bad_inputs)
            c.ops += 1
            for o in outs:
                if _storage(o) in storages and not writes:
                    continue  # a view of an input: its values are the input's
                s = _stat(o)
                if s is not None and _bad(s) and not (from_numbers and not s[2]):
                    received = [isinstance(v, torch.Tensor) and _storage(v) in c.received for v in values]
                    c.report(str(func._schema.name), inputs, values, s, received)
                    break
            return out
        finally:
            c.busy = False


def available():
    return TorchDispatchMode is not None


_active = []  # the op checks whose mode is entered (at most one)
_inside = threading.local()  # .depth: recorded ProcessGroup calls (inside_collective) open on this thread


class inside_collective:
    """Around a recorded ProcessGroup call and its wait(): what the backend runs there hands a peer's values over."""

    __slots__ = ()

    def __enter__(self):
        _inside.depth = getattr(_inside, "depth", 0) + 1

    def __exit__(self, *exc):
        _inside.depth -= 1
        return False


def handed_over(values):
    """A collective recorded by _collectives was called with `values`: what it hands over may carry a peer's value.
    ProcessGroup methods such as FSDP2's reduce_scatter_single reach the backend without passing the dispatch mode."""
    if _active:
        storages = {_storage(t) for t in _flat(values, []) if isinstance(t, torch.Tensor)}
        for c in _active:
            c.received.update(storages)


class OpCheck:
    """Armed from `first_step` on; each step's end either sends the alert (found) or keeps tracing."""

    def __init__(self, rank, first_step, after_step):
        self.rank, self.first_step, self.after_step = rank, first_step, after_step
        self.mode = None
        self.found = None
        self.received = set()  # storages a collective wrote or handed over in the checked steps
        self.busy = False
        self.ops = 0
        self.micro = lambda: -1

    def step_begin(self, step):
        if self.mode is None and self.found is None and step >= self.first_step and _Mode is not None:
            self.mode = _Mode(self)
            self.mode.__enter__()
            _active.append(self)

    def step_end(self, step):
        """At the end of a traced step: True once the operator is named (the check is over)."""
        if self.mode is None:
            return False
        if self.found is None:
            return False
        self.close()
        msg, ev, layer = self.describe(step)
        ev.update({"live": True, "after_step": self.after_step})
        _native.alert(_native.kinds.SEVERITY_ERROR, "op_check", step, layer, ev["op"], msg, json.dumps(ev))
        _native.flush()
        sys.stderr.write("tpscope op check: %s\n" % msg)
        return True

    def describe(self, step):
        """(message, evidence, layer) of the operator found in step `step`: the op check's alert, as core's
        OpCheck writes it (its `op` object in a replay verdict)."""
        op, inputs, params, out, where, received = self.found
        pass_ = where[0]
        module, layer = where[1] if where[1] is not None else ("", -1)
        carrier = next((i for i, s in enumerate(inputs) if s is not None and _bad(s)), -1)
        value = "NaN" if out[3] > 0 else "Inf"
        if carrier < 0:
            msg = "rank %d step %d: %s made %s (%s pass%s); no input carried it" % (
                self.rank, step, op, value, pass_, ", " + module if module else "")
        else:
            msg = "rank %d step %d: %s output %s (%s pass%s); its input %d%s already carried it%s" % (
                self.rank, step, op, value, pass_, ", " + module if module else "", carrier,
                " (%s)" % params[carrier] if params[carrier] else "",
                ", from a collective" if received[carrier] else "")
        ev = {"op": op, "pass": pass_, "span": module, "layer": layer, "microbatch": where[2],
              "produced": carrier < 0, "carrier_input": carrier,
              "carrier_param": params[carrier] if carrier >= 0 else "",
              "received": carrier >= 0 and received[carrier],
              "check_step": self.first_step, "ops_checked": self.ops, "output_nan": out[3], "output_inf": out[4],
              "inputs": [{"index": i, "kind": s[0], "dtype": s[1], "shape": s[2], "finite": s[3] + s[4] + s[5] == 0,
                          "nan": s[3], "inf": s[4] + s[5], "neg_inf": s[5], "max_abs": _json_number(s[6]),
                          "param": params[i]}
                         for i, s in enumerate(inputs) if s is not None]}
        return msg, ev, layer

    def report(self, op, inputs, values, out, received):
        pass_ = "optimizer" if STATE.in_optimizer else "backward" if STATE.in_backward else \
            "forward" if torch.is_grad_enabled() else "step"
        params = []
        for v in values:
            known = _modules.param_name(v) if isinstance(v, torch.Tensor) else None
            params.append(known[0] if known is not None else "")
        self.found = (op, inputs, params, out, (pass_, STATE.current_module(), self.micro()), received)

    def close(self):
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
            self.mode = None
        if self in _active:
            _active.remove(self)
