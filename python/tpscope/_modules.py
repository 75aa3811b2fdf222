"""Forward and backward spans of every nn.Module, and the outputs the non-finite check looks at.

Global module hooks (torch.nn.modules.module.register_module_forward_pre_hook / _forward_hook, PyTorch >= 1.13) see
every module call. Names: the first module called outside any other is a root; its named_modules() give every
submodule its qualified name ("layers.3.mlp.fc1"; the root itself is named by its class), and the first purely
numeric component of the name is the layer index (layers.3. -> 3; -1 when there is none). The same names serve the
gradient-health rows (named_parameters of the roots).

Forward span: pre-hook to forward hook, kind compute, phase forward.

Backward span, without changing the module's inputs or outputs (no BackwardHook wrapping, so in-place ops on
module outputs keep working): it begins when autograd reaches the node that produced the module's output (a node
pre-hook; where an in-place op on an output view replaced that node, as nn.ReLU(inplace=True) after a Linear does,
when its first sink or submodule ends — the C++ walk hooks every node and knows the first) and ends when the last
autograd node the module's forward created has run (post-hooks on the region's exit nodes). The module's nodes are
found when its forward returns, by walking the graph back from its outputs until the nodes of its inputs or nodes that
an earlier module owns; a submodule's region is walked once, by the submodule, and its parent waits for its span
instead of its nodes, so the walk costs O(nodes) per forward pass whatever the nesting. Spans whose last node never
runs (a branch that needs no gradient) end at the last node that did, when backward() returns.

The walk and the node hooks run in C++ (tpscope._autograd, src/autograd_regions.cpp: the same algorithm on LibTorch's
Node objects, hooks that autograd runs without the GIL) when the package was built against the PyTorch loaded now,
and so do the global module hooks themselves (src/module_hooks.cpp: _pre_hook and _post_hook's work as C callables,
calling back here for a module not seen yet and an output the check found); otherwise, or with
TPSCOPE_AUTOGRAD=python, in Python below. On the sample the walk and its node hooks take 0.8 ms
per step in C++ against 3.0 ms in Python (docs/capture.md); both record the same spans (tests/python/walk_test.py).

Non-finite check: each leaf module's first floating-point output (a module with submodules mostly returns a child's
output or a residual sum of them, which the next leaf sees: each value is read about once), with the time it was
produced, so that the first non-finite output in forward order — and when it was produced — is known at the loss's
backward(). An output in CPU memory is read at once by the binding (_host: one pass, kept only when a value is not
finite); any other output's sum is kept on the device until the loss's backward() (one host sync per step in
_training). Only while gradients are enabled (training), at most _ACT_LIMIT per step.
"""

import os
import re
import sys

import torch
from torch.nn.modules import module as nn_module

from . import _host, _native
from ._native import kinds as K
from ._state import CALL_INFO, CALL_MODULE, STATE

_LAYER = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")
_ACT_LIMIT = 4096
_OPEN_LIMIT = 1 << 16


def _probe_autograd():
    """(the type of AccumulateGrad nodes, whether nodes take pre-hooks), from a node of a one-element graph."""
    with torch.enable_grad():
        node = (torch.zeros(1, requires_grad=True) * 1).grad_fn
    return type(node.next_functions[0][0]), hasattr(node, "register_prehook")


_ACCUMULATE_GRAD, _NODE_PREHOOKS = _probe_autograd()  # AccumulateGrad: a leaf's (parameter's) sink, never hooked


def _load_autograd():
    """tpscope._autograd when it was built for the PyTorch loaded now and TPSCOPE_AUTOGRAD is not "python", else None.
    The version and folder are checked before the import: under another PyTorch it would load a second libtorch."""
    if os.environ.get("TPSCOPE_AUTOGRAD", "") == "python":
        return None
    from . import _build
    if (not _build.AUTOGRAD_TORCH_VERSION or torch.__version__ != _build.AUTOGRAD_TORCH_VERSION
            or os.path.realpath(os.path.dirname(torch.__file__)) != os.path.realpath(_build.AUTOGRAD_TORCH_DIR)):
        return None
    try:
        from . import _autograd
    except ImportError:
        return None
    return _autograd


_CPP_MODULE = _load_autograd()
_CPP = _CPP_MODULE  # the walk in use: tpscope._autograd, or None for the Python walk (select_walk)


def walk():
    """The name of the walk in use: "C++" or "Python" (the rank's meta, tests, benchmarks)."""
    return "C++" if _CPP is not None else "Python"


def layer_of(name):
    """The first purely numeric component of a qualified name ("layers.3.mlp" -> 3), else -1."""
    match = _LAYER.search(name)
    return int(match.group(1)) if match else -1


_numbered = []  # every ModuleInfo, by its number (tpscope._autograd names the module of a span by that number)


class ModuleInfo:
    __slots__ = ("name", "layer", "fwd_site", "bwd_site", "qualified", "leaf", "number")

    def __init__(self, name, qualified, leaf=True):
        self.number = len(_numbered)
        _numbered.append(self)
        self.name = name
        self.layer = layer_of(name)
        self.leaf = leaf  # no submodules: its output is computed here (watched for non-finite values)
        self.fwd_site = _native.site(name, K.SPAN_COMPUTE, K.PHASE_FORWARD)
        self.bwd_site = _native.site(name, K.SPAN_COMPUTE, K.PHASE_BACKWARD)
        self.qualified = qualified




class _Backward:
    """One module call's backward span: started by its output node, ended by its own nodes and child spans."""

    __slots__ = ("info", "index", "t0", "t1", "first", "pending", "parent", "frontier", "done")

    def __init__(self, info, index):
        self.info, self.index = info, index
        self.t0 = self.t1 = 0
        self.first = 0          # when its first sink or child ended: its start when its output's node never ran
        self.pending = 0        # own hooked nodes + child spans not finished
        self.parent = None
        self.frontier = None    # nodes just outside this call's region (only while its root call runs)
        self.done = False

    def node_done(self, grad_inputs, grad_outputs):
        """Hook of one of its sink nodes (registered as this bound method: no closure per node)."""
        self.t1 = _native.ticks()
        if not self.first:
            self.first = self.t1
        self.pending -= 1
        if self.pending == 0:
            _finish(self)


_infos = {}          # id(module) -> (module, ModuleInfo); the module is kept so its id is not reused
_params = {}         # id(param) -> (param, name, layer)
_calls = 0           # module calls so far (a call's index orders it against the others)
_claims = {}         # autograd node -> the innermost _Backward owning it (during one root call)
_starts = {}         # autograd node -> [_Backward] that start when it runs (during one root call)
_root_records = []   # _Backward records of the current root call
_open = []           # _Backward records since the last backward() returned
_activations = []    # (output sum on the device, ticks, ModuleInfo) since the last loss
on_root_forward = None  # set by _training: called with a root module's inputs before its forward


def _index_root(root):
    root_name = type(root).__name__
    for qual, sub in root.named_modules():
        known = _infos.get(id(sub))
        if known is not None and known[1].qualified:
            continue
        _infos[id(sub)] = (sub, ModuleInfo(qual or root_name, bool(qual), next(sub.children(), None) is None))
    for qual, p in root.named_parameters():
        known = _params.get(id(p))
        if known is None or known[0] is not p:
            _params[id(p)] = (p, qual, layer_of(qual))


def module_name(m):
    """(span name, layer) of a module seen so far, or None."""
    entry = _infos.get(id(m))
    return (entry[1].name, entry[1].layer) if entry is not None and entry[0] is m else None


def param_name(p):
    """(qualified name, layer) of a parameter of a module seen so far, or None."""
    entry = _params.get(id(p))
    return (entry[1], entry[2]) if entry is not None and entry[0] is p else None


def _tensors(x, depth=0):
    """The tensors in a module's inputs or output: a tensor, or tensors in (nested) tuples, lists and dicts."""
    if isinstance(x, torch.Tensor):
        return (x,)
    if isinstance(x, tuple) and all(isinstance(v, torch.Tensor) for v in x):
        return x  # the common case: forward(*tensors)
    return tuple(_nested_tensors(x, depth))


def _nested_tensors(x, depth):
    if isinstance(x, torch.Tensor):
        yield x
    elif depth < 3 and isinstance(x, (list, tuple)):
        for v in x:
            yield from _nested_tensors(v, depth + 1)
    elif depth < 3 and isinstance(x, dict):
        for v in x.values():
            yield from _nested_tensors(v, depth + 1)


def _info_of(module):
    """(module, ModuleInfo) of a module called now that has none yet: a root indexes its named_modules(); a module
    that is no root's submodule is named after the call it runs in."""
    stack = STATE.forward_stack
    if not stack:
        _index_root(module)
    else:
        _infos[id(module)] = (module, ModuleInfo(stack[-1][CALL_INFO].name + "." + type(module).__name__, False,
                                                 next(module.children(), None) is None))
    return _infos[id(module)]


def _pre_hook(module, inputs):
    """The Python walk's global forward pre-hook (tpscope._autograd.pre_hook is the same in C)."""
    if not _native.recording():
        return None
    global _calls
    stack = STATE.forward_stack
    entry = _infos.get(id(module))
    if entry is None or entry[0] is not module:
        entry = _info_of(module)
    if not stack and on_root_forward is not None:
        on_root_forward(inputs)
    _calls += 1
    stack.append((module, entry[1], _native.ticks(), _calls))
    return None


def _post_hook(module, inputs, output):
    """The Python walk's global forward hook (tpscope._autograd.post_hook is the C++ walk's, in C: the span, the output
    check and the walk in one call)."""
    stack = STATE.forward_stack
    i = len(stack) - 1
    while i >= 0 and stack[i][CALL_MODULE] is not module:  # a forward that raised leaves its calls behind
        i -= 1
    if i < 0:
        return None
    _, info, t0, _ = call = stack[i]
    del stack[i:]
    _native.span_end(info.fwd_site, t0, info.layer)
    if torch.is_grad_enabled():
        outs = _tensors(output)
        if WATCH and info.leaf:
            _watch_output(info, outs)
        if WALK:
            _attach_backward(call, inputs, outs)
    if not stack:
        _end_root_call()
    return None


WATCH = True  # the module-output check runs (bench/python/overhead_alternating.py --off watch turns it off)
WALK = True   # the backward regions are walked (--off walk)


def _watched(info, found):
    """The output check's finding: a non-finite sum read now, or a tensor it could not read here (on a device), whose
    sum is read at the loss, in one sync."""
    _activations.append((found if type(found) is float else found.detach().sum(), _native.ticks(), info))


def _watch_output(info, outs):
    if len(_activations) >= _ACT_LIMIT:
        return
    for t in outs:
        if t.is_floating_point():
            t = _host.local(t)  # a DTensor's sum would be a collective (a Partial one an all-reduce): its shard
            readable, value = _host.nonfinite(t)
            if not readable:
                _watched(info, t)
            elif value is not None:
                _watched(info, value)
            return


def take_activations():
    """The watched outputs since the last call, in the order they were produced."""
    out = list(_activations)
    _activations.clear()
    return out


def _attach_backward(call, inputs, outs):
    """The Python walk's backward region of a module call (the C++ walk's is in tpscope._autograd.post_hook)."""
    _, info, _, index = call
    out_nodes = [(t, t.grad_fn) for t in outs if t.grad_fn is not None]
    if not out_nodes:
        return
    rec = _Backward(info, index)
    stops = {t.grad_fn for t in _tensors(inputs)}
    stops.discard(None)
    _walk(rec, [node for _, node in out_nodes], stops)
    if rec.pending == 0:
        return  # the module created no node of its own (its outputs are its inputs or views made elsewhere)
    _root_records.append(rec)
    _open.append(rec)
    for t, node in out_nodes:
        starts = _starts.get(node)
        if starts is None:
            starts = _starts[node] = [rec]
            if _NODE_PREHOOKS:
                node.register_prehook(lambda grad_outputs, starts=starts: _start(starts))
            else:  # PyTorch without node pre-hooks: when the output's gradient is ready, the same moment
                t.register_hook(lambda grad, starts=starts: _start(starts))
        elif rec not in starts:
            starts.append(rec)


def _walk(rec, outs, stops):
    frontier = []
    outside = set()  # nodes of inputs and of earlier regions met so far (each enters the frontier once)
    todo = list(outs)
    while todo:
        node = todo.pop()
        owner = _claims.get(node)
        if owner is None:
            if node in stops:
                if node not in outside:
                    outside.add(node)
                    frontier.append(node)
                continue
            _claims[node] = rec
            # Only the sinks of the region are hooked: own nodes with no edge to another own node (their edges lead
            # only to inputs, leaves, earlier or child regions, or nowhere). Autograd runs a node only after every
            # node with an edge to it, so each own node runs before some sink it leads to, and the last sink to run
            # is the last own node to run — with a fraction of the hooks (each costs a Python call to register and
            # to run). AccumulateGrad nodes (a parameter's or another leaf's gradient) are never followed: they lead
            # nowhere and belong to no region.
            sink = True
            for f, _ in node.next_functions:
                if f is None or type(f) is _ACCUMULATE_GRAD:
                    continue
                todo.append(f)  # a child's region is linked, an input's or earlier region's becomes the frontier
                if sink and f not in stops and _claims.get(f, rec) is rec:
                    sink = False
            if sink:
                node.register_hook(rec.node_done)
                rec.pending += 1
        elif owner is rec:
            continue
        elif owner.index < rec.index:  # an earlier module's region
            if node not in outside:
                outside.add(node)
                frontier.append(node)
        else:
            top = owner  # a descendant's region: wait for its outermost span below this one, skip its nodes
            while top.parent is not None and top.parent is not rec:
                top = top.parent
            if top.parent is None:
                top.parent = rec
                rec.pending += 1
                todo.extend(top.frontier or ())
    rec.frontier = frontier


def _end_root_call():
    if _CPP is not None:
        _CPP.end_root_call()
    for rec in _root_records:
        rec.frontier = None
    _root_records.clear()
    _claims.clear()
    _starts.clear()
    if len(_open) > _OPEN_LIMIT:  # forwards whose backward never came (evaluation with gradients on)
        del _open[: len(_open) - _OPEN_LIMIT]


def forget_unfinished_forwards():
    """Called where no module's forward can be running (backward() and optimizer.step() as the script calls them):
    module calls still on the stack are of a forward that raised (PyTorch 1.13 calls no hook when forward raises), as
    in a script that catches an out-of-memory error and retries with a smaller batch. Without this every later root
    call would count as nested in the dead one, and the walk's tables — every autograd node of every step — would never
    be released."""
    if STATE.forward_stack:
        STATE.forward_stack.clear()
        _end_root_call()


def held():
    """What the walk holds now: autograd nodes claimed, regions open and running (tests)."""
    if _CPP is not None:
        return _CPP.stats()
    return {"claimed": len(_claims), "open": len(_open), "running": len(STATE.backward_stack)}


def _start(records):
    t = _native.ticks()
    for rec in sorted(records, key=lambda r: r.index):  # outer first: the innermost ends up on top
        if rec.t0 == 0:
            rec.t0 = t
            STATE.backward_stack.append(rec)


def _finish(rec):
    while rec is not None and not rec.done:
        rec.done = True
        if rec.t0:
            _native.emit_span(rec.info.bwd_site, rec.t0, max(rec.t1, rec.t0), rec.info.layer)
            try:
                STATE.backward_stack.remove(rec)
            except ValueError:
                pass
        elif rec.first:  # an in-place op on an output view replaced the output's node: from its first sink on
            _native.emit_span(rec.info.bwd_site, rec.first, max(rec.t1, rec.first), rec.info.layer)
        parent = rec.parent
        if parent is None:
            return
        parent.t1 = max(parent.t1, rec.t1)
        if not parent.first or (rec.t0 or rec.first) < parent.first:
            parent.first = rec.t0 or rec.first
        parent.pending -= 1
        if parent.pending > 0:
            return
        rec = parent


def backward_finished():
    """Called when backward() returns: ends the spans whose last node did not run."""
    if _CPP is not None:
        _CPP.backward_finished()
    now = _native.ticks()
    for rec in _open:
        t0 = rec.t0 or rec.first
        if not rec.done and t0:
            rec.done = True
            _native.emit_span(rec.info.bwd_site, t0, max(rec.t1 or now, t0), rec.info.layer)
    _open.clear()
    STATE.backward_stack.clear()


def innermost_backward():
    """The ModuleInfo whose backward span runs innermost now, or None (STATE.current_module in backward)."""
    if _CPP is not None:
        number = _CPP.current()
        return _numbered[number] if number >= 0 else None
    stack = STATE.backward_stack
    return stack[-1].info if stack else None


STATE.innermost_backward = innermost_backward


def select_walk(cpp):
    """Walks in C++ (when tpscope._autograd loaded) or in Python from the next module call on; returns the walk's
    name. Only between training steps (benchmarks compare the two in one process)."""
    global _CPP
    _CPP = _CPP_MODULE if cpp else None
    if _handles:
        install()
    return walk()


def hooks():
    """(pre-hook, post-hook) of the walk in use, as install() registers them: tpscope._autograd's C callables with
    the C++ walk, else _pre_hook and _post_hook (benchmarks wrap what this returns)."""
    if _CPP is not None:
        return _CPP.pre_hook, _CPP.post_hook
    return _pre_hook, _post_hook


_handles = []  # the registered global hooks' handles


def install():
    """Registers the global module hooks of the walk in use (again: replacing those registered before)."""
    for handle in _handles:
        handle.remove()
    if _CPP_MODULE is not None:
        _CPP_MODULE.hooks_setup(STATE.forward_stack, _infos, _activations, sys.modules[__name__], _info_of, _ACT_LIMIT)
    pre, post = hooks()
    _handles[:] = [nn_module.register_module_forward_pre_hook(pre), nn_module.register_module_forward_hook(post)]
