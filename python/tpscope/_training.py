"""Steps, losses, gradient health and the live health rules of a Python training loop.

* The step: the first optimizer whose step() is called is the training's; each of its step() calls ends a step
  (step_stats row — grad_norm NULL, see _training_step; the rank's own norm is the counter local_grad_norm —
  "train step" span from the step's first root-module forward — or the previous step's end — to the
  end of step()), and the next step begins. Other optimizers' step() calls are recorded as optimizer spans only.
* The loss: torch.autograd.backward (which Tensor.backward calls) on a one-element tensor; its value is read once
  (one host sync, which the loss's .item() in most loops pays anyway). Each backward() is also a "backward" span.
* Before the training optimizer's step(): per-parameter gradient health of its parameters — L2 norm, max |g| and
  NaN/Inf counts. Gradients in CPU memory are read once each by the binding (_host); others get the L2 norm of every
  gradient in one batched device pass (torch._foreach_norm), max |g| from one aminmax pass per gradient, read back in
  one sync, and NaN/Inf counts only for gradients whose norm is not finite (as the engine does). These are the step's
  grad_stats rows.
* The live rules are core's HealthRules through the binding (TPSCOPE_HEALTH, `tpscope capture --health`): the first
  non-finite module output of the step (_modules' sums, checked when the loss's backward() is called), the loss, the
  gradients; alerts as tpscope-train raises them. Policies: warn; skip-step (every rank votes with an all-reduce MAX
  over the default group when a rule can act, as the engine does, and the update is dropped: optimizer.step() is not
  called and the gradients are cleared); stop (the recorder is flushed and the process exits with status 5);
  trace-ops (warn, and from the step after a non-finite value on this rank every operator is checked until the first
  that makes a NaN/+Inf is named: _opcheck).
"""

import functools
import json
import math
import os
import sys

import torch
import torch.distributed as dist

from . import _fsdp, _host, _modules, _native, _opcheck, _rank, _replay
from ._native import kinds as K
from ._state import STATE

_orig_backward = None
_health = None
_primary = None   # id of the training optimizer (the first whose step() is called)
_trace_ops = False  # --on-nonfinite trace-ops
_op_check = None    # the op check armed after a non-finite value (trace-ops), until it has named an operator
_sites = {}


class _StepState:
    def __init__(self, t0=0):
        self.t0 = t0             # ticks when the step began (0: at its first root-module forward)
        self.losses = []
        self.tokens = 0
        self.micro = 0           # backward() calls so far in this step (micro-batches)
        self.counted = False     # tokens of the current micro-batch counted
        self.action = K.ACTION_CONTINUE
        self.activation_checked = False
        self.nonfinite = False   # a non-finite output, loss or gradient on this rank in this step (trace-ops)


_step = _StepState()


def _site(name, kind, phase):
    key = (name, kind, phase)
    site = _sites.get(key)
    if site is None:
        site = _sites[key] = _native.site(name, kind, phase)
    return site


def _on_root_forward(inputs):
    _fsdp.install_if_loaded()
    if _step.t0 == 0:
        _step.t0 = _native.ticks()
    if _step.counted or not torch.is_grad_enabled():
        return
    for t in _modules._tensors(inputs):
        if not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool:
            _step.tokens += t.numel()  # token ids: the first integer input of the micro-batch's first root call
            _step.counted = True
            return


# ---- the loss and backward ------------------------------------------------------------------------------------------
def _first_nonfinite(activations):
    """The first (ModuleInfo, ticks, value) whose value is not finite. A value is a float (read on the host already)
    or a device tensor's sum, read here in one sync."""
    if not activations:
        return None
    sums = [s for s, _, _ in activations if isinstance(s, torch.Tensor)]
    if sums:
        try:
            read = iter(torch.stack([s.float() for s in sums]).tolist())
        except RuntimeError:  # sums on several devices
            read = iter([float(s) for s in sums])
    for s, ticks, info in activations:
        v = next(read) if isinstance(s, torch.Tensor) else s
        if not math.isfinite(v):
            return info, ticks, v
    return None


def _on_loss(loss):
    if STATE.replaying:  # the step replay's loss: its check is the op check's, not the rules'
        _modules.take_activations()
        return
    value = float(loss.detach())
    _step.losses.append(value)
    fault = _first_nonfinite(_modules.take_activations())
    _step.nonfinite = _step.nonfinite or fault is not None or not math.isfinite(value)
    if fault is not None and not _step.activation_checked:
        info, ticks, v = fault
        _step.activation_checked = True
        action = _health.activation(STATE.step, info.layer, info.name + " output", _step.micro, ticks, v)
        _step.action = max(_step.action, action)


def _backward(tensors, *args, **kwargs):
    if not _native.recording() or STATE.in_backward:
        return _orig_backward(tensors, *args, **kwargs)
    loss = tensors
    if isinstance(tensors, (list, tuple)):
        loss = tensors[0] if len(tensors) == 1 else None
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        _on_loss(loss)
    _modules.forget_unfinished_forwards()
    STATE.in_backward += 1
    t0 = _native.ticks()
    try:
        return _orig_backward(tensors, *args, **kwargs)
    finally:
        STATE.in_backward -= 1
        _native.span_end(_site("backward", K.SPAN_COMPUTE, K.PHASE_BACKWARD), t0, -1)
        _modules.backward_finished()
        _step.micro += 1
        _step.counted = False


# ---- gradient health and the step --------------------------------------------------------------------------------
def _device_grad_rows(grads):
    """[(L2 norm, max |g|, NaN count, Inf count)] from torch: one batched norm, one aminmax per gradient, one sync."""
    try:
        norms = torch._foreach_norm(grads)
    except (AttributeError, RuntimeError, TypeError):
        norms = [g.norm() for g in grads]
    # max |g| from one aminmax pass per gradient: _foreach_norm(grads, inf) takes 9 ms where this takes 1 ms on the
    # sample's 3.3 M gradient elements (one core), as the engine found for ATen's inf-norm.
    extremes = [torch.stack(g.aminmax()) for g in grads]
    try:
        l2, mx = torch.stack([torch.stack(norms).double(), torch.stack(extremes).abs().amax(1).double()]).tolist()
    except RuntimeError:  # gradients on several devices
        l2 = [float(n) for n in norms]
        mx = [float(e.abs().max()) for e in extremes]
    rows = []
    for g, n, m in zip(grads, l2, mx):
        nan = inf = 0
        if not (math.isfinite(n) and math.isfinite(m)):  # counted only where something is wrong, as the engine does
            nan = int(torch.isnan(g).sum())
            inf = int(torch.isinf(g).sum())
        rows.append((n, m, nan, inf))
    return rows


_placements_seen = {}       # parameter name -> its placement text ("" for a plain tensor)
_grad_placements_seen = {}  # parameter name -> its gradient's placement text, where it differs from the parameter's


def _placement_text(t):
    """A DTensor's placement per mesh dimension ("tp:S(0)", "dp:S(0) tp:R"), "" for a plain tensor."""
    placements = getattr(t, "placements", None)
    mesh = getattr(t, "device_mesh", None)
    if placements is None or mesh is None:
        return ""
    dims = getattr(mesh, "mesh_dim_names", None) or tuple("dim%d" % i for i in range(len(placements)))
    return " ".join("%s:%s" % (d, pl) for d, pl in zip(dims, placements))


def _note_placement(name, p):
    """How a DTensor parameter is laid out on its mesh, once per parameter, into the rank file's meta
    param_placements (a JSON object: name -> "tp:S(0)", "dp:S(0) tp:R", ...): which mesh dimension shards it, so
    that a gradient row of the local shard reads as what it is. Where the gradient's placement differs — a Partial
    gradient ("tp:P(sum)": a replicated parameter used on sharded activations, as a SequenceParallel norm's weight,
    whose gradient DTensor sums only when it is redistributed) — it goes into meta grad_placements: that gradient's
    local rows are this rank's partial sum, not the gradient."""
    text = _placement_text(p)
    _placements_seen[name] = text
    if text:
        _native.set_meta("param_placements",
                         json.dumps({k: v for k, v in _placements_seen.items() if v}, sort_keys=True))
    grad_text = _placement_text(p.grad) if p.grad is not None else ""
    if grad_text and grad_text != text:
        _grad_placements_seen[name] = grad_text
        _native.set_meta("grad_placements", json.dumps(_grad_placements_seen, sort_keys=True))


def _grad_health(optimizer, step):
    """Writes the step's grad_stats rows, runs the gradient rules; returns (action, local gradient norm)."""
    params = [p for g in optimizer.param_groups for p in g["params"]
              if p.grad is not None and not p.grad.is_sparse and p.grad.numel() > 0]
    if not params:
        return K.ACTION_CONTINUE, 0.0
    # The rank's own gradient: a DTensor parameter's local shard (statistics per rank, as the engine's rows are).
    grads = [_host.local(p.grad if not p.grad.requires_grad else p.grad.detach()) for p in params]
    stats = _host.grad_rows(grads)
    if stats is None:
        stats = _device_grad_rows(grads)
    names, layers, rows = [], [], []
    for i, p in enumerate(params):
        known = _modules.param_name(p)
        name, layer = known if known is not None else ("param%d" % i, -1)
        names.append(name)
        layers.append(layer)
        rows.append(stats[i] + (grads[i].numel(),))
        if name not in _placements_seen:
            _note_placement(name, p)
    action = _health.gradients(step, names, layers, rows)
    _step.nonfinite = _step.nonfinite or any(r[2] > 0 or r[3] > 0 for r in rows)
    return action, math.sqrt(sum(r[0] * r[0] for r in stats))


def _vote(action, nonfinite):
    """The MAX of every rank's (action, non-finite value seen) over the default group (recorded like any
    collective)."""
    action, nonfinite = _rank.all_reduce_ints([action, int(nonfinite)], dist.ReduceOp.MAX,
                                              "tpscope health vote optimizer all-reduce")
    return action, bool(nonfinite)


def _replay_step(step, optimizer):
    """The program's step replay (_replay), on the step's own state: its losses, micro-batches and activation checks
    go to a scratch step. True when it named the operator (trace-ops then has nothing left to find)."""
    global _step
    saved = _step
    _step = _StepState(saved.t0)
    try:
        verdict = _replay.run(step, optimizer, saved.nonfinite, lambda: _step.micro)
    finally:
        _step = saved
    return verdict == "reproducible"


def _training_step(optimizer, original, args, kwargs):
    global _step, _trace_ops
    _modules.forget_unfinished_forwards()
    step = STATE.step
    action, grad_norm = _grad_health(optimizer, step)
    action = max(action, _step.action)
    loss = sum(_step.losses) / len(_step.losses) if _step.losses else float("nan")
    if _step.losses:
        action = max(action, _health.loss(step, loss))
    replay = _replay.armed()
    anywhere = _step.nonfinite
    if _health.needs_agreement or replay:
        action, anywhere = _vote(action, _step.nonfinite)
    if replay and anywhere and _replay_step(step, optimizer):
        _trace_ops = False
    action = _health.agree(step, action)
    t0 = _native.ticks()
    STATE.in_optimizer += 1
    try:
        if action == K.ACTION_CONTINUE:
            result = original(optimizer, *args, **kwargs)
        else:
            result = None
            optimizer.zero_grad(set_to_none=True)  # the update is dropped; the optimizer state is untouched
    finally:
        STATE.in_optimizer -= 1
        _native.span_end(_site("optimizer step", K.SPAN_OPTIMIZER, K.PHASE_OPTIMIZER), t0, -1)
    t1 = _native.ticks()
    begin = _step.t0 or t0
    _native.emit_span(_site("train step", K.SPAN_STEP, K.PHASE_NONE), begin, t1, -1)
    lr = optimizer.param_groups[0].get("lr", 0.0) if optimizer.param_groups else 0.0
    # step_stats.grad_norm is the global norm after reduction, equal on every rank; a hook cannot know which
    # parameters are sharded and which replicated, so it stays NaN (NULL) and the rank's own norm is a counter.
    if not math.isnan(grad_norm):  # a NaN counter is dropped by the recorder (and counted as a loss)
        _native.counter("local_grad_norm", grad_norm)
    _native.step_stat(step, loss, float(lr), float("nan"), 1.0, _step.tokens, begin, t1,
                      action != K.ACTION_CONTINUE)
    if action == K.ACTION_STOP:
        _native.flush()
        sys.stderr.write("tpscope: stopped at step %d: every rank agreed to stop on non-finite values "
                         "(health policy %s)\n" % (step, _health.options))
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(5)  # as tpscope-train: no teardown against peers that are leaving too
    _trace_next(step)
    STATE.set_step(step + 1)
    _step = _StepState(t1)
    _replay.step_begins()
    if _op_check is not None:
        _op_check.step_begin(step + 1)
    return result


def _trace_next(step):
    """trace-ops: the op check ends its step (naming the operator, or tracing on), or is armed after this step's
    non-finite value."""
    global _op_check, _trace_ops
    try:
        if _op_check is not None:
            if _op_check.step_end(step):
                _op_check, _trace_ops = None, False  # named: once per run
        elif _trace_ops and _step.nonfinite and _opcheck.available():
            _op_check = _opcheck.OpCheck(int(os.environ.get("RANK", "0")), step + 1, step)
            _op_check.micro = lambda: _step.micro
    except Exception as e:  # never the program's failure: the check stops, the run goes on
        sys.stderr.write("tpscope: the op check stopped: %s: %s\n" % (type(e).__name__, e))
        if _op_check is not None:
            _op_check.close()
        _op_check, _trace_ops = None, False


def _wrap_step(cls):
    original = cls.__dict__.get("step")
    if original is None or hasattr(original, "__tpscope_original__"):
        return

    @functools.wraps(original)
    def step(self, *args, **kwargs):
        global _primary
        if not _native.recording():
            return original(self, *args, **kwargs)
        if _primary is None:
            _primary = id(self)
        if STATE.replaying and _primary == id(self):
            raise RuntimeError("the step replay's function called the training optimizer's step(): it must run the "
                               "step's forward and backward only (tpscope.set_step_replay)")
        if _primary != id(self):
            t0 = _native.ticks()
            try:
                return original(self, *args, **kwargs)
            finally:
                _native.span_end(_site("optimizer step", K.SPAN_OPTIMIZER, K.PHASE_OPTIMIZER), t0, -1)
        return _training_step(self, original, args, kwargs)

    step.__tpscope_original__ = original
    cls.step = step


def _install_optimizer():
    init = torch.optim.Optimizer.__init__
    if hasattr(init, "__tpscope_original__"):
        return

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        for cls in type(self).__mro__:
            if cls is torch.optim.Optimizer:
                break
            if "step" in cls.__dict__:
                _wrap_step(cls)
                break

    __init__.__tpscope_original__ = init
    torch.optim.Optimizer.__init__ = __init__


def _install_init_process_group():
    original = dist.init_process_group
    if hasattr(original, "__tpscope_original__"):
        return

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        result = original(*args, **kwargs)
        if _native.started():
            _rank.describe()
        return result

    init_process_group.__tpscope_original__ = original
    dist.init_process_group = init_process_group
    dist.distributed_c10d.init_process_group = init_process_group


def install():
    global _orig_backward, _health, _trace_ops
    text = os.environ.get("TPSCOPE_HEALTH", "")
    try:
        _health = _native.Health(text)
    except ValueError as e:
        sys.stderr.write("tpscope: TPSCOPE_HEALTH: %s; using the default rules\n" % e)
        _health = _native.Health("")
    _trace_ops = "nonfinite=trace-ops" in _health.options
    if _orig_backward is None:
        _orig_backward = torch.autograd.backward
        torch.autograd.backward = _backward
    _modules.on_root_forward = _on_root_forward
    _install_optimizer()
    if dist.is_available():
        _install_init_process_group()
        if dist.is_initialized() and _native.started():
            _rank.describe()
