#!/usr/bin/env python3
"""2-D parallelism as in PyTorch's TP tutorial: tensor parallel inside a data-parallel FSDP2 (`fully_shard`) mesh.

Nothing in it knows about tpscope. The model and the TP plan are samples/python/llama_tp.py's (a small Llama with
sequence-parallel norms). A 2-D DeviceMesh ("dp", "tp") of DP x TP ranks (Gloo on CPU, NCCL on CUDA; TP ranks are
consecutive, as in the tutorial and in `tpscope capture --tp`): `parallelize_module` shards the model over "tp", then
`fully_shard` shards each transformer block and the root over "dp". Each DP replica reads its own batch.

The collectives: DTensor's functional collectives inside each TP group (all-gather, reduce-scatter, all-reduce) and
FSDP2's over each DP group — every block's parameters all-gathered before its forward and again before its backward,
their gradients reduce-scattered after it.

    torchrun --nproc-per-node 4 samples/python/fsdp_tp_2d.py --tp 2
    tpscope capture --nproc 4 --tp 2 --out runs/2d -- python3 samples/python/fsdp_tp_2d.py --steps 10

--tp defaults to TPSCOPE_TP (which tpscope capture --tp sets), else 2. The faults are llama_tp.py's:
  --nan-at RANK:STEP[:LAYER]      rank RANK puts one NaN into layer LAYER's feed-forward hidden activation
  --skip-collective RANK:STEP     rank RANK stalls before step STEP's forward: its TP and DP peers wait forever
  --replay-hook                   the step replay of the first step with a NaN (tpscope.set_step_replay)
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import parallelize_module

from llama_tp import add_arguments, build_model, init, tp_plan, train


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    p.add_argument("--tp", type=int, default=int(os.environ.get("TPSCOPE_TP") or 2))
    a = p.parse_args()
    device, rank, world = init(a)
    if a.tp < 1 or world % a.tp:
        raise SystemExit("fsdp_tp_2d.py: world size %d is not a multiple of --tp %d" % (world, a.tp))
    mesh = init_device_mesh(device, (world // a.tp, a.tp), mesh_dim_names=("dp", "tp"))
    model = build_model(a, device)
    model = parallelize_module(model, mesh["tp"], tp_plan(model))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    dp_rank = mesh["dp"].get_local_rank()

    def batch_of(step):  # the same tokens within a TP group, another batch per DP replica
        g = torch.Generator().manual_seed(1000 * (dp_rank + 1) + step)
        return torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g).to(device)

    train(a, model, rank, batch_of)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
