"""What the instrumentation of one process shares: the training step, the phase, the module being run.

One instance per process (`STATE`). Written by the training thread's hooks (module hooks, backward, optimizer step);
read by the collective wrappers, which may run on autograd's thread during backward (on CPU that is the thread that
called backward()). Plain attributes: the GIL serialises every access.
"""

from . import _native

# A module call in progress (STATE.forward_stack): a plain tuple (module, ModuleInfo, t0, index) — a class would cost
# an __init__ call at each of the step's module calls. The fields read by index:
CALL_MODULE, CALL_INFO = 0, 1


class _State:
    def __init__(self):
        self.step = 1                 # the step spans and records belong to (1-based, as tpscope-train's)
        self.in_backward = 0          # depth of torch.autograd.backward calls in progress
        self.in_optimizer = 0         # depth of optimizer.step() calls in progress
        self.forward_stack = []       # module calls in progress: (module, ModuleInfo, t0, index), innermost last
        self.backward_stack = []      # module backward spans started and not ended, innermost last (Python walk)
        self.innermost_backward = lambda: None  # -> the ModuleInfo whose backward runs innermost now (_modules)
        self.callsite_override = None  # (callsite, phase) for collectives tpscope itself issues (the health vote)
        self.module_override = None    # (name, layer) of the module a collective is issued for (_fsdp), or None
        self.replaying = False         # the program's step replay function runs (_replay)

    def current_module(self):
        """(qualified name, layer) of the module a collective issued now is for (where()), or None outside every
        module."""
        name, layer, _ = self.where()
        return (name, layer) if name is not None else None

    def where(self):
        """(name, layer, phase) of a collective issued now. The module is the one named by module_override (FSDP2
        moving a module's parameters from another module's hook), else the module running now — in backward, the
        innermost one whose backward has begun; the name is None outside every module. The phase: optimizer,
        backward, forward or none. The rule is tpscope._native's (python/src/funcol_fastpath.cpp), which the
        collective wrappers ask in C at every collective; this is the same answer for Python callers."""
        return _native.where()

    def set_step(self, step):
        self.step = step
        _native.set_step(step)


STATE = _State()
_native.set_state(STATE)
