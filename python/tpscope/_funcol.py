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

The wrappers are C callables (tpscope._native.funcol_wrapper and funcol_wait_wrapper, python/src/funcol_fastpath.cpp):
a Python wrapper cost ~25 µs a call and ~10 µs a wait between DTensor's matrix products. What is here is their setup
and the rules of their rarer paths, which they call back into: a group named by a string or a list of ranks
(_resolve), a call that raised (_raised), a result that is a list (_track).
"""

import functools

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

_pending = {}               # storage of a raw result -> Issue: completed by the first wait_tensor on it or a view
_MAX_PENDING = 4096         # results never waited on (dropped by the program) are forgotten beyond this
_module = None  # torch.distributed._functional_collectives, once install() imported it
# A tensor's storage address: read from the TensorImpl by tpscope._autograd where it loaded, else through Python
# method calls by tpscope._native (each is microseconds between matrix products).
_storage_key = getattr(_modules._CPP_MODULE, "storage_key", None) or _native.storage_key


def _resolve(group, tag):
    """(tpscope group name, recorder group id) of a functional collective's group argument (a (DeviceMesh, dim)
    pair, a mesh, a ProcessGroup, a group name or a list of ranks). The wrappers keep the answer for a pair or an
    object (resolving through funcol's _resolve_group costs tens of microseconds) and ask again for a name or a list."""
    resolved = _module._resolve_group(group, tag)
    if not isinstance(resolved, dist.ProcessGroup):
        resolved = dist.distributed_c10d._resolve_process_group(resolved)
    return _collectives.named(resolved)


def _raised(op, group_index, args, kwargs, ticks, exc):
    """A functional collective raised: recorded as issued at TICKS and failed (its group resolved here, uncached)."""
    group = args[group_index] if len(args) > group_index else kwargs.get("group")
    tag = args[group_index + 1] if len(args) > group_index + 1 else kwargs.get("tag", "")
    try:
        name, gid = _resolve(group, tag)
    except Exception:  # a group form this PyTorch does not resolve here: the call ran unrecorded
        return
    _collectives._fail(_collectives.issue_in_group(name, gid, op, args[0] if args else None, ticks), exc)


def _track(issue, result):
    """Where a result other than one AsyncCollectiveTensor completes (a list of them, a plain tensor): at once when
    nothing in it has to be waited on, else at the first wait on any of their storages."""
    items = result if isinstance(result, (list, tuple)) else (result,)
    waiting = [t.elem for t in items if isinstance(t, _module.AsyncCollectiveTensor) and not t.completed]
    if not waiting:
        if not issue.done:
            issue.done = True
            _native.collective_state(issue.handle, K.STATE_COMPLETED)
        return
    if len(_pending) >= _MAX_PENDING:
        _pending.clear()
    for t in waiting:
        key = _storage_key(t)
        if key is not None:
            _pending[key] = issue


def _wrap(original, op, group_index):
    """ORIGINAL recorded (tpscope._native.funcol_wrapper: the wrapper's common path is C; its other paths call _resolve,
    _raised and _track here and _collectives' _payload, _comm_site and _fail)."""
    recorded = _native.funcol_wrapper(original, op, _collectives.display(op), group_index)
    functools.update_wrapper(recorded, original)
    recorded.__tpscope_original__ = original
    return recorded


def _wrap_wait(original):
    wait_tensor = _native.funcol_wait_wrapper(original)
    functools.update_wrapper(wait_tensor, original)
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
    _native.funcol_setup(_pending, funcol.AsyncCollectiveTensor, torch.Tensor, _storage_key, _resolve,
                         _collectives._payload, _raised, _track, _collectives._comm_site, _collectives._fail,
                         _MAX_PENDING)
    for name, (op, group_index) in _FUNCTIONS.items():
        original = getattr(funcol, name, None)
        if original is None or hasattr(original, "__tpscope_original__"):
            continue
        setattr(funcol, name, _wrap(original, op, group_index))
    wait = getattr(funcol, "wait_tensor", None)
    if wait is not None and not hasattr(wait, "__tpscope_original__"):
        funcol.wait_tensor = _wrap_wait(wait)
