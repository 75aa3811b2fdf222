"""tpscope for Python programs: records a PyTorch training run with the same recorder as tpscope's C++ engine.

    python3 -m tpscope.run train.py ARGS          # what `tpscope capture -- python3 train.py ARGS` runs per rank

or, from a program that wants to start it itself:

    import tpscope
    tpscope.start()        # records iff TPSCOPE_OUT is set (tpscope capture sets it)
    tpscope.instrument()   # torch.distributed, nn.Module, backward(), optimizer.step() hooks
    ...
    tpscope.stop()

What is recorded and how: docs/capture.md, "Python programs". The native part (tpscope._native) is a pybind11
binding of probes/runtime and core's health rules; tpscope._autograd walks the autograd graph for backward spans in
C++ where it was built for the PyTorch loaded; this package decides what to record.
"""

import contextlib
import os
import sys

from . import _native
from ._native import kinds

__all__ = ["start", "stop", "instrument", "recording", "span", "flush", "set_step_replay", "kinds"]

_instrumented = False


def start():
    """Starts the recorder from the environment (TPSCOPE_OUT, RANK, WORLD_SIZE, TPSCOPE_RUN_ID, TPSCOPE_EPOCH_NS,
    TPSCOPE_CLOCK_STORE; docs/recorder.md). Returns True when recording. Never raises: a recorder that cannot start
    says why on stderr (the line `tpscope capture` looks for) and the program runs on unrecorded."""
    ok, _ = _native.start_from_environment()
    if not (ok and _native.started()):
        return False
    import torch
    from . import _state
    _native.set_thread_name("python main")
    _native.set_meta("program", " ".join(sys.argv))
    _native.set_meta("python", sys.version.split()[0])
    _native.set_meta("torch_version", torch.__version__)
    _native.set_meta("cuda_version", torch.version.cuda or "")  # the PyTorch running, beside meta built_with
    try:
        nccl = torch.cuda.nccl.version() if torch.version.cuda else ""
        _native.set_meta("nccl_version", ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl))
    except (AttributeError, RuntimeError):
        pass
    _native.set_meta("source_language", "python")
    from . import _modules
    _native.set_meta("backward_walk", _modules.walk())  # C++ (tpscope._autograd) or Python: see docs/capture.md
    _state.STATE.set_step(_state.STATE.step)
    return True


def instrument():
    """Installs the hooks (once per process): ProcessGroup methods, global nn.Module hooks, torch.autograd.backward,
    optimizer step(), init_process_group, DistributedDataParallel's communication hook, the functional collectives
    of DTensor and torch.distributed.tensor.parallel. They cost one atomic load per call while the recorder is not
    recording."""
    global _instrumented
    if _instrumented:
        return
    from . import _collectives, _modules, _training
    _collectives.install()
    _modules.install()
    _training.install()
    import torch.distributed as dist
    if dist.is_available():
        from . import _ddp, _funcol
        _ddp.install()
        _funcol.install()
    _instrumented = True


def set_step_replay(fn):
    """Lets tpscope replay a step whose values went non-finite, op by op: `fn()` runs the current step's forward and
    backward again on the same batch — what the program does between the step's start and optimizer.step(), without
    it. Once per run, before the update of the first step where any rank saw a NaN/Inf, every rank calls it under the
    op check; the verdict (reproducible, with the operator, or transient) is an alert of kind `replay` that `tpscope
    diagnose` shows under the NaN's origin (docs/capture.md, "The step replay"). A no-op while not recording; None
    removes the function.

        def compute(step):                    # the step's forward and backward, as the loop runs them
            ...
        tpscope.set_step_replay(lambda: compute(step))
    """
    from . import _replay
    _replay.set_step_replay(fn)


def stop(exit_reason="ok"):
    """Final flush; writes ranks.exit_reason. No-op when not recording."""
    _native.stop(exit_reason)


def flush():
    _native.flush()


def recording():
    return _native.recording()


@contextlib.contextmanager
def span(name, kind=kinds.SPAN_COMPUTE, phase=kinds.PHASE_NONE, layer=-1):
    """A span of the program's own: `with tpscope.span("data loading", tpscope.kinds.SPAN_DATA): ...`"""
    site = _native.site(name, kind, phase)
    t0 = _native.ticks()
    try:
        yield
    finally:
        _native.span_end(site, t0, layer)
