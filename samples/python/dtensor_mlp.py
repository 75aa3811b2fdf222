#!/usr/bin/env python3
"""A toy MLP sharded with PyTorch's own tensor-parallel API (DTensor), in the style of PyTorch's TP tutorial.

Nothing in it knows about tpscope: `torch.distributed.tensor.parallel.parallelize_module` shards each block's first
linear by output features (ColwiseParallel) and its second by input features (RowwiseParallel) on a 1-D DeviceMesh
(Gloo on CPU, NCCL on CUDA). The collectives are DTensor's: the row-parallel output's all-reduce in forward, the
column-parallel input gradient's all-reduce in backward — functional collectives, not ProcessGroup calls.

    torchrun --nproc-per-node 2 samples/python/dtensor_mlp.py
    tpscope capture --nproc 2 --out runs/dt -- python3 samples/python/dtensor_mlp.py --steps 10

The script's own faults (what the tests capture):
  --nan-at RANK:STEP[:BLOCK]      rank RANK puts one NaN into block BLOCK's hidden activation in step STEP's forward;
                                  the row-parallel all-reduce then carries it to the TP peers
  --skip-collective RANK:STEP     rank RANK skips step STEP's forward (a divergent branch) and blocks, as a rank stuck
                                  in its data loader would: its peers wait in the first all-reduce forever (a hang)
"""

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class Block(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.in_proj = nn.Linear(dim, hidden)
        self.out_proj = nn.Linear(hidden, dim)
        self.nan = False

    def forward(self, x):
        h = torch.relu(self.in_proj(x))
        if self.nan:
            h = h.clone()
            h.view(-1)[0] = float("nan")  # the local shard of the hidden activation
        return x + self.out_proj(h)


class ToyMLP(nn.Module):
    def __init__(self, dim, hidden, blocks):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, hidden) for _ in range(blocks))
        self.head = nn.Linear(dim, 1)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def parse_fault(text, parts):
    if not text:
        return None
    values = [int(v) for v in text.split(":")]
    return values + [0] * (parts - len(values))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--nan-at", default="")
    p.add_argument("--skip-collective", default="")
    p.add_argument("--replay-hook", action="store_true",
                   help="give tpscope the step's forward and backward (tpscope.set_step_replay) when it records")
    p.add_argument("--timeout", type=float, default=60.0, help="collective timeout, seconds")
    a = p.parse_args()
    nan_at = parse_fault(a.nan_at, 3)
    skip = parse_fault(a.skip_collective, 2)

    cuda = torch.cuda.is_available() and os.environ.get("TPSCOPE_SAMPLE_DEVICE", "") != "cpu"
    device = "cuda" if cuda else "cpu"
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=a.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    mesh = init_device_mesh(device, (world,), mesh_dim_names=("tp",))

    torch.manual_seed(0)  # the same full weights on every rank: parallelize_module shards them
    model = ToyMLP(a.dim, a.hidden, a.blocks).to(device)
    plan = {}
    for i in range(a.blocks):
        plan[f"blocks.{i}.in_proj"] = ColwiseParallel()
        plan[f"blocks.{i}.out_proj"] = RowwiseParallel()
    model = parallelize_module(model, mesh, plan)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def compute(x, y):
        """The step's forward and backward: the loss."""
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        return loss

    batch = [None, None]
    if a.replay_hook:
        try:
            import tpscope
            tpscope.set_step_replay(lambda: compute(*batch))
        except ImportError:
            pass  # run without tpscope: nothing to give it
    for step in range(1, a.steps + 1):  # 1-based, as tpscope numbers steps
        g = torch.Generator().manual_seed(1000 + step)  # the same batch on every rank (TP: replicated inputs)
        x = torch.randn(a.batch, a.dim, generator=g).to(device)
        y = torch.randn(a.batch, 1, generator=g).to(device)
        batch[:] = x, y
        if skip and skip[0] == rank and skip[1] == step:
            time.sleep(3600)  # stuck before the step's first collective
        for i, b in enumerate(model.blocks):
            b.nan = bool(nan_at) and nan_at[0] == rank and nan_at[1] == step and nan_at[2] == i
        loss = compute(x, y)
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
