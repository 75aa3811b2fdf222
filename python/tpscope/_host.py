"""Tensors in CPU memory, read by the binding in one pass (python/src/host_stats.cpp).

On the CPU, torch reads a gradient twice for its health row (_foreach_norm, then aminmax) and sums a module output
with a cascade sum, each from Python; the binding reads the tensor's memory once, without the GIL. A tensor it cannot
read (on a device, not contiguous, or of another dtype) gets None here, and the caller keeps torch's batched device
path, which is the right one on a GPU anyway.
"""

import torch

from . import _native

_CODES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}  # host_stats.cpp's HostDtype


def local(t):
    """The rank's own tensor: a DTensor's local shard (its data, no autograd, no collective); others as they are."""
    inner = getattr(t, "_local_tensor", None)
    return inner if isinstance(inner, torch.Tensor) else t


def _buffer(t):
    code = _CODES.get(t.dtype)
    if code is None or not t.is_cpu or not t.is_contiguous():
        return None
    try:
        ptr = t.data_ptr()
    except RuntimeError:  # a tensor subclass without storage of its own
        return None
    if ptr == 0 and t.numel() > 0:  # a wrapper subclass (an AsyncCollectiveTensor before its wait)
        return None
    return (ptr, t.numel(), code)


def grad_rows(grads):
    """[(L2 norm, max |g|, NaN count, Inf count)] of every gradient, or None unless the binding can read them all."""
    buffers = []
    for g in grads:
        b = _buffer(g)
        if b is None:
            return None
        buffers.append(b)
    return [(sumsq ** 0.5, mx, nan, inf) for sumsq, mx, nan, inf in _native.host_stats(buffers)]


def nonfinite(t):
    """(readable, value): readable False when the binding cannot read t; value None when every value of t is finite,
    else t's sum (NaN or ±Inf)."""
    b = _buffer(t)
    if b is None:
        return False, None
    return True, _native.host_nonfinite(*b)
