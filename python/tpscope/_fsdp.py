"""FSDP2 (`torch.distributed.fsdp.fully_shard`): its collectives named after the module whose parameters they move.

FSDP2 all-gathers a module's parameters in that module's pre-forward hook, or ahead of time for the next module
(forward and backward prefetch, from inside another module's span), and reduce-scatters the module's gradients (first
all-reducing a tensor-parallel Partial gradient over its TP group) in a post-backward hook — the last ones from
autograd's final callback, outside every module's span. Named by the module running, those records would blame the
wrong module ("layers.1 backward all-gather" for layers.0's prefetched parameters) or none (the script's line).
`FSDPParamGroup.unshard` and `.post_backward` are wrapped: the collectives they issue are named after the group's
module — its span name ("layers.0", the root by its class) and layer — in the phase that runs them
("layers.0 backward all-gather", "layers.0 backward reduce-scatter"). The collectives themselves are recorded where
every c10d call is (_collectives: FSDP2 calls `all_gather_single` / `reduce_scatter_single` on the ProcessGroup).

FSDP2 is not imported here: importing it costs about half a second, so its class is wrapped at the first root-module
forward after the program imported it (fully_shard comes before the first forward of the model it shards).
"""

import functools
import sys

from . import _modules
from ._state import STATE

_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_param_group"
_installed = False


def _owner(group):
    """(span name, layer) of the module an FSDPParamGroup shards: the first of its modules, as its spans name it."""
    modules = getattr(group, "modules", ()) or ()
    for m in modules:
        known = _modules.module_name(m)
        if known is not None:
            return known
    fqn = getattr(group, "_module_fqn", None) or (type(modules[0]).__name__ if modules else "FSDP")
    return fqn, _modules.layer_of(fqn)


def _wrap(original):
    @functools.wraps(original)
    def named(self, *args, **kwargs):
        saved = STATE.module_override
        STATE.module_override = _owner(self)
        try:
            return original(self, *args, **kwargs)
        finally:
            STATE.module_override = saved

    named.__tpscope_original__ = original
    return named


def install_if_loaded():
    """Wraps FSDPParamGroup's unshard and post_backward once, when the program has imported FSDP2."""
    global _installed
    if _installed:
        return
    loaded = sys.modules.get(_MODULE)
    if loaded is None:
        return
    _installed = True
    cls = getattr(loaded, "FSDPParamGroup", None)
    for name in ("unshard", "post_backward"):
        original = getattr(cls, name, None) if cls is not None else None
        if original is not None and not hasattr(original, "__tpscope_original__"):
            setattr(cls, name, _wrap(original))
