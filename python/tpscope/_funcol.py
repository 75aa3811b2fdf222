"""PyTorch 2.x functional collectives (torch.distributed._functional_collectives), recorded as flight-recorder records.

DTensor and `torch.distributed.tensor.parallel` (ColwiseParallel, RowwiseParallel, SequenceParallel, redistribute)
issue their collectives through this module's functions (`funcol.all_reduce`, `all_gather_tensor`,
`reduce_scatter_tensor`, `all_to_all_single`, ...). Those dispatch as `_c10d_functional` ops straight into c10d's
C++ ProcessGroup, so the ProcessGroup methods _collectives wraps never see them. Here the module's public functions
are wrapped (DTensor looks them up on the module at each call): the outermost call is recorded once, with the same
(group, seq) numbering as the c10d calls of that group, the logical op, the input's dtype, shape and bytes and the
call site in module terms.

A functional collective returns at once (an AsyncCollectiveTensor in eager mode); it completes when its result is
first used, which calls `wait_tensor`. That wait is wrapped too: it records the completion and a Comm span for the
time the thread was blocked, as RecordedWork.wait does for c10d. A result that was waited on already (traced code)
completes at the call.
"""

import functools
import threading

import torch
import torch.distributed as dist

from . import _collectives, _modules, _native
from ._native import kinds as K

# function -> (logical op, index of the group argument)
_FUNCTIONS = {
    "broadcast": ("broadcast", 2),
    "all_reduce": ("all_reduce", 2),
    "all_reduce_coalesced": ("all_reduce", 2),
    "all_gather_tensor": ("all_gather", 2),
    "all_gather_tensor_autograd": ("all_gather", 2),
    "all_gather_single": ("all_gather", 2),
    "all_gather_single_autograd": ("all_gather", 2),
    "all_gather_into_tensor_coalesced": ("all_gather", 1),
    "all_gather_single_coalesced": ("all_gather", 1),
    "reduce_scatter_tensor": ("reduce_scatter", 3),
    "reduce_scatter_tensor_autograd": ("reduce_scatter", 3),
    "reduce_scatter_single": ("reduce_scatter", 3),
    "reduce_scatter_single_autograd": ("reduce_scatter", 3),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", 3),
    "reduce_scatter_single_coalesced": ("reduce_scatter", 3),
    "all_to_all_single": ("all_to_all", 3),
    "all_to_all_single_autograd": ("all_to_all", 3),
    "permute_tensor": ("all_to_all", 2),
}

class _Depth(threading.local):
    depth = 0  # a wrapped function called from another (all_gather_tensor -> ...) is not recorded


_local = _Depth()
_pending = {}               # storage of a raw result -> issue: completed by the first wait_tensor on it or a view
_MAX_PENDING = 4096         # results never waited on (dropped by the program) are forgotten beyond this


def _process_group(group, tag):
    resolved = _module._resolve_group(group, tag)
    if isinstance(resolved, dist.ProcessGroup):
        return resolved
    return dist.distributed_c10d._resolve_process_group(resolved)


_groups = {}  # a group argument's key -> (the object it names, tpscope group name, its recorder group id)


def _group_of(group, tag):
    """(tpscope group name, recorder group id) of a functional collective's group argument. DTensor passes (DeviceMesh,
    dim) on every call; resolving it through funcol's _resolve_group costs tens of microseconds, so a mesh's (or a
    ProcessGroup's) answer is kept for as long as the object lives (it is kept alive here: its id is never reused).
    A group name or a list of ranks is resolved at each call: a name may be bound anew after destroy_process_group."""
    if type(group) is tuple and len(group) == 2:
        key, anchor = (id(group[0]), group[1], tag), group[0]
    elif isinstance(group, (str, list)):
        return _collectives.named(_process_group(group, tag))
    else:
        key, anchor = (id(group), tag), group
    entry = _groups.get(key)
    if entry is not None and entry[0] is anchor:
        return entry[1], entry[2]
    name, gid = _collectives.named(_process_group(group, tag))
    _groups[key] = (anchor, name, gid)
    return name, gid


def _issue(op, args, kwargs, group_index, ticks):
    group = args[group_index] if len(args) > group_index else kwargs.get("group")
    tag = args[group_index + 1] if len(args) > group_index + 1 else kwargs.get("tag", "")
    try:
        name, gid = _group_of(group, tag)
    except Exception:  # a group form this PyTorch does not resolve here: the call runs unrecorded
        return None
    return _collectives.issue_in_group(name, gid, op, args[0] if args else None, ticks)


_module = None  # torch.distributed._functional_collectives, once install() imported it
# A tensor's storage address: read from the TensorImpl by tpscope._autograd where it loaded, else through Python
# method calls by tpscope._native (each is microseconds between matrix products).
_storage_key = getattr(_modules._CPP_MODULE, "storage_key", None) or _native.storage_key


def _raw(result):
    """The tensors a functional collective returned, each with whether it still has to be waited on."""
    items = result if isinstance(result, (list, tuple)) else (result,)
    out = []
    for t in items:
        if isinstance(t, _module.AsyncCollectiveTensor):
            out.append((t.elem, not t.completed))
        elif isinstance(t, torch.Tensor):
            out.append((t, False))
    return out


def _complete(issue):
    if not issue.done:
        issue.done = True
        _native.collective_state(issue.handle, K.STATE_COMPLETED)


def _wrap(original, op, group_index):
    @functools.wraps(original)
    def recorded(*args, **kwargs):
        depth = _local.depth
        if depth or not _native.recording():
            return original(*args, **kwargs)
        t = _native.ticks()
        _local.depth = depth + 1
        try:
            result = original(*args, **kwargs)
        except BaseException as e:
            issue = _issue(op, args, kwargs, group_index, t)
            if issue is not None:
                _collectives._fail(issue, e)
            raise
        finally:
            _local.depth = depth
        # Recorded once the call returned, with the time it was made: a functional collective returns as soon as it is
        # on its way (in eager mode), so this bookkeeping runs while its data moves, not before it starts, when a peer
        # already in the collective would wait for it.
        issue = _issue(op, args, kwargs, group_index, t)
        if issue is None:
            return result
        if type(result) is _module.AsyncCollectiveTensor:  # the common case: one result
            waiting = () if result.completed else (result.elem,)
        else:
            waiting = [t for t, w in _raw(result) if w]
        if not waiting:
            _complete(issue)
            return result
        if len(_pending) >= _MAX_PENDING:
            _pending.clear()
        # Keyed by storage: the wait may come on a view of the result (an AsyncCollectiveTensor's aten.view makes a
        # new one around a view of its elem), and c10d's functional wait waits on the work that owns the storage.
        for t in waiting:
            key = _storage_key(t)
            if key is not None:
                _pending[key] = issue
        return result

    recorded.__tpscope_original__ = original
    return recorded


def _wrap_wait(original):
    @functools.wraps(original)
    def wait_tensor(tensor):
        if not _pending:  # nothing issued waits (recording off, or every result waited on)
            return original(tensor)
        key = _storage_key(tensor)
        issue = _pending.pop(key, None) if key is not None else None
        if issue is None or issue.done:
            return original(tensor)
        t0 = _native.ticks()
        try:
            out = original(tensor)
        except BaseException as e:
            _collectives._fail(issue, e)
            raise
        _collectives.waited(issue, t0)
        return out

    wait_tensor.__tpscope_original__ = original
    return wait_tensor


def install():
    """Wraps the functional collectives and their wait (once per process); a PyTorch without them is left alone."""
    global _module
    try:
        from torch.distributed import _functional_collectives as funcol
    except ImportError:
        return
    _module = funcol
    for name, (op, group_index) in _FUNCTIONS.items():
        original = getattr(funcol, name, None)
        if original is None or hasattr(original, "__tpscope_original__"):
            continue
        setattr(funcol, name, _wrap(original, op, group_index))
    wait = getattr(funcol, "wait_tensor", None)
    if wait is not None and not hasattr(wait, "__tpscope_original__"):
        funcol.wait_tensor = _wrap_wait(wait)
