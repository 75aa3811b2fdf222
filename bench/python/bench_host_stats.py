#!/usr/bin/env python3
"""The gradient-health rows and the module-output check of a Python rank on the CPU: the binding's one-pass host read
(tpscope._host, python/src/host_stats.cpp) against the torch path the hooks use for device tensors (_training's
_device_grad_rows: _foreach_norm + one aminmax per gradient + one read-back; _modules: a sum per output, read at the
loss), side by side in one process, on the gradients of samples/python/tp_train.py's model (one rank, TP = 1) after
one backward pass and on its leaf modules' outputs. Medians of --rounds that alternate the two, in wall time, one torch thread. The L2
difference printed is mostly torch's: its norm accumulates in float (about 1e-4 relative on a million elements), the
host read in double per 4,096 elements.

Usage: PYTHONPATH=<build>/python /usr/bin/python3 bench/python/bench_host_stats.py [--rounds 21]
       [-- tp_train.py model arguments]
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import sample_model  # noqa: E402


def side_by_side(first, second, rounds):
    """Median wall ms of each function over rounds that alternate them (so that drifts of the machine hit both)."""
    times = ([], [])
    for _ in range(rounds):
        for fn, out in ((first, times[0]), (second, times[1])):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return statistics.median(times[0]) * 1e3, statistics.median(times[1]) * 1e3


def main():
    argv, model_args = sample_model.split_argv(sys.argv[1:])
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=21)
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import tp_train
    from tpscope import _host, _training

    margs, model = sample_model.build(model_args)
    outputs = []
    leaves = [m for m in model.modules() if next(m.children(), None) is None]
    handles = [m.register_forward_hook(lambda m, i, o: outputs.append(o.detach())) for m in leaves]
    tokens, targets = tp_train.batch(margs, 0, 1)
    F.cross_entropy(model(tokens).reshape(-1, margs.vocab), targets.reshape(-1)).backward()
    for h in handles:
        h.remove()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    outputs = [o for o in outputs if isinstance(o, torch.Tensor) and o.is_floating_point()]

    host = _host.grad_rows(grads)
    device = _training._device_grad_rows(grads)
    worst = max(abs(h[0] - d[0]) / max(d[0], 1e-30) for h, d in zip(host, device))
    same_max = all(h[1] == d[1] for h, d in zip(host, device))

    def torch_outputs():
        sums = [o.sum() for o in outputs]
        torch.stack(sums).tolist()

    def host_outputs():
        for o in outputs:
            _host.nonfinite(o)

    g_host, g_torch = side_by_side(lambda: _host.grad_rows(grads), lambda: _training._device_grad_rows(grads),
                                   args.rounds)
    o_host, o_torch = side_by_side(host_outputs, torch_outputs, args.rounds)
    n_grad = sum(g.numel() for g in grads)
    n_out = sum(o.numel() for o in outputs)
    print("model: %s" % " ".join(model_args))
    print("gradient rows, %d gradients, %.2f M elements: host %.2f ms, torch %.2f ms (x%.2f); L2 within %.1e, "
          "max |g| %s" % (len(grads), n_grad / 1e6, g_host, g_torch, g_torch / g_host, worst,
                          "equal" if same_max else "DIFFERENT"))
    print("output check, %d outputs, %.2f M elements: host %.2f ms, torch %.2f ms (x%.2f)"
          % (len(outputs), n_out / 1e6, o_host, o_torch, o_torch / o_host))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
