"""DistributedDataParallel's gradient all-reduces, recorded like every other collective.

DDP's Reducer issues its bucketed all-reduces from C++ straight on the ProcessGroup, past the Python methods that
_collectives wraps, so without help a DDP program's data-parallel traffic — usually most of its communication — would
be missing from the trace. DDP offers one way in that changes nothing else: a communication hook. When a DDP module
is built while recording, tpscope registers a trampoline hook on its Reducer that runs the hook the program asked for,
or DDP's own default when it asked for none:

* no hook: `default_hooks.allreduce_hook` with the module's process group — the Python form of the Reducer's built-in
  all-reduce (divide by the group size, then sum), bitwise the same result;
* `ddp.register_comm_hook(state, hook)` called by the program later: the trampoline runs that hook from then on (DDP
  allows one registration, before the first backward, and so does the trampoline: a second one raises as DDP does);
* `ddp._register_builtin_comm_hook(ALLREDUCE | FP16_COMPRESS)`: the Python hook of the same name.

Inside the trampoline the collective the hook issues goes through the wrapped ProcessGroup, so it gets a record with
the DDP group, its per-group sequence number, dtype, shape and bytes, and the call site "DDP bucket N gradient
all-reduce" in the backward phase. Its completion is recorded when its future completes (_collectives' RecordedWork
.get_future), as DDP never calls wait() on it.
"""

import functools

import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from . import _native
from ._native import kinds as K
from ._state import STATE

_BUILTIN = {
    "ALLREDUCE": default_hooks.allreduce_hook,
    "FP16_COMPRESS": default_hooks.fp16_compress_hook,
}


class _Hook:
    """What the trampoline runs for one DDP module: (state, hook), the program's once it registers one."""

    __slots__ = ("state", "hook", "user")

    def __init__(self, process_group):
        self.state, self.hook, self.user = process_group, default_hooks.allreduce_hook, False


def _trampoline(chosen, bucket):
    index = bucket.index() if hasattr(bucket, "index") else bucket.get_index()
    saved = STATE.callsite_override
    STATE.callsite_override = ("DDP bucket %d gradient all-reduce" % index, K.PHASE_BACKWARD)
    try:
        return chosen.hook(chosen.state, bucket)
    finally:
        STATE.callsite_override = saved


def _take(ddp, state, hook, name):
    chosen = ddp.__dict__.get("_tpscope_hook")
    if chosen.user:
        raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
    chosen.state, chosen.hook, chosen.user = state, hook, True
    ddp.logger._set_comm_hook_name(name)


def install():
    """Wraps DistributedDataParallel's constructor and hook registration (once per process)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    init = DDP.__init__
    if hasattr(init, "__tpscope_original__"):
        return
    register = DDP.register_comm_hook
    builtin = DDP._register_builtin_comm_hook

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        reducer = getattr(self, "reducer", None)  # none when no parameter needs a gradient
        if reducer is None or not _native.recording():
            return
        chosen = _Hook(self.process_group)
        dist._register_comm_hook(reducer, chosen, _trampoline)
        self.__dict__["_tpscope_hook"] = chosen

    @functools.wraps(register)
    def register_comm_hook(self, state, hook):
        if "_tpscope_hook" not in self.__dict__:
            return register(self, state, hook)
        self._check_comm_hook(hook)
        _take(self, state, hook, hook.__qualname__)
        return None

    @functools.wraps(builtin)
    def register_builtin_comm_hook(self, comm_hook_type):
        if "_tpscope_hook" not in self.__dict__:
            return builtin(self, comm_hook_type)
        name = str(comm_hook_type).split(".")[-1]
        hook = _BUILTIN.get(name)
        if hook is None:
            raise ValueError("tpscope: DDP built-in communication hook %s has no Python form to record it by"
                             % comm_hook_type)
        _take(self, self.process_group, hook, str(comm_hook_type))
        return None

    __init__.__tpscope_original__ = init
    register_comm_hook.__tpscope_original__ = register
    register_builtin_comm_hook.__tpscope_original__ = builtin
    DDP.__init__ = __init__
    DDP.register_comm_hook = register_comm_hook
    DDP._register_builtin_comm_hook = register_builtin_comm_hook
