#!/usr/bin/env python3
"""A data-parallel program built on DistributedDataParallel, for tpscope's DDP recording test (ddp_test.py).

    ddp_program.py --steps S [--hook none|python|builtin]

Every rank trains the same small MLP on its own batches with DDP (several buckets)
and SGD; `--hook python` registers DDP's fp16 compression hook with register_comm_hook, `--hook builtin` the same
through _register_builtin_comm_hook. At the end every rank checks its parameters against a reference trained in the
same process without DDP on all ranks' batches at once (the mean of the ranks' losses: what averaging the gradients
computes), within 1e-5 (1e-2 with fp16 compression), and prints DDP_PARAMS_MAX_DIFF. It exits 1 on a mismatch, so the
recording must leave DDP's arithmetic unchanged. The reference uses torch.autograd.grad and a hand-written update, so
its work is not taken for the program's training step.
"""

import argparse
import datetime
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

LR = 0.05


def make_model():
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(32, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 4))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 32, generator=g), torch.randn(8, 4, generator=g)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--hook", choices=["none", "python", "builtin"], default="none")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()

    # DDP's first bucket holds up to 1 MB, the others bucket_cap_mb: the 1.1 MB of parameters make several buckets.
    model = DDP(make_model(), bucket_cap_mb=0.25)
    if args.hook == "python":
        model.register_comm_hook(dist.group.WORLD, default_hooks.fp16_compress_hook)
    elif args.hook == "builtin":
        model._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(1, args.steps + 1):
        x, y = batch(rank, step)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    reference = make_model()
    params = list(reference.parameters())
    for step in range(1, args.steps + 1):
        losses = [nn.functional.mse_loss(reference(x), y) for x, y in (batch(r, step) for r in range(world))]
        grads = torch.autograd.grad(sum(losses) / world, params)
        with torch.no_grad():
            for p_, g in zip(params, grads):
                p_ -= LR * g
    diff = max(float((a.detach() - b.detach()).abs().max()) for a, b in zip(model.module.parameters(), params))
    print("DDP_PARAMS_MAX_DIFF rank %d %.3g" % (rank, diff), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if diff > (1e-2 if args.hook != "none" else 1e-5):
        sys.exit(1)


if __name__ == "__main__":
    main()
