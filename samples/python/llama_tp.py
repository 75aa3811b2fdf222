#!/usr/bin/env python3
"""A small Llama-style transformer sharded with PyTorch's TP API and sequence parallelism, as in PyTorch's TP tutorial.

Nothing in it knows about tpscope. The model is the tutorial's Llama in miniature (RMSNorm, causal multi-head
attention, a SwiGLU feed-forward, pre-norm residual blocks); `parallelize_module` shards it on a 1-D DeviceMesh (Gloo
on CPU, NCCL on CUDA) with the tutorial's plan:
  tok_embeddings   RowwiseParallel, output Shard(1): the residual stream is split along the sequence between the ranks
  *_norm, norm     SequenceParallel: each rank normalises its own sequence shard
  attention,       PrepareModuleInput: all-gather the sequence shards (Shard(1) -> Replicate) before the block's
  feed_forward     column-parallel linears
  wq, wk, wv, w1, w3   ColwiseParallel (each rank owns a head group / a slice of the hidden features)
  wo, w2           RowwiseParallel, output Shard(1): a reduce-scatter back to sequence shards
  output           ColwiseParallel, input Shard(1), output Replicate: the logits all-gathered on every rank
The collectives are DTensor's functional collectives (all-gather, reduce-scatter, and all-reduce of the replicated
norm weights' gradients), not ProcessGroup calls.

    torchrun --nproc-per-node 2 samples/python/llama_tp.py
    tpscope capture --nproc 2 --out runs/llama -- python3 samples/python/llama_tp.py --steps 10

The script's own faults (what the tests capture):
  --nan-at RANK:STEP[:LAYER]      rank RANK puts one NaN into layer LAYER's feed-forward hidden activation (its local
                                  slice) in step STEP's forward; w2's reduce-scatter then carries it to a peer
  --skip-collective RANK:STEP     rank RANK stalls before step STEP's forward (a divergent branch, a stuck data
                                  loader): its peers wait in the embedding's reduce-scatter forever (a hang)
  --replay-hook                   give tpscope the step's forward and backward (tpscope.set_step_replay): under
                                  capture, the first step with a NaN is replayed with every operator checked
TPSCOPE_SAMPLE_DEVICE=cpu keeps it on the CPU where a GPU is present. build_model() and tp_plan() are what
samples/python/fsdp_tp_2d.py reuses for its 2-D mesh.
"""

import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.head_dim = dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        # -1 heads: under ColwiseParallel each rank holds heads / TP of them (the tutorial's n_heads // tp)
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.nan = False

    def forward(self, x):
        h = F.silu(self.w1(x)) * self.w3(x)
        if self.nan:
            h = h.clone()
            h.view(-1)[0] = float("nan")  # this rank's slice of the hidden features
        return self.w2(h)


class TransformerBlock(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = Attention(dim, heads)
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, vocab, dim, heads, hidden, layers):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(TransformerBlock(dim, heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def tp_plan(model):
    """PyTorch's TP tutorial plan: {module name: parallel style}, sequence parallel between the blocks."""
    plan = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    for i in range(len(model.layers)):
        p = "layers.%d." % i
        plan.update({
            p + "attention_norm": SequenceParallel(),
            p + "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            p + "attention.wq": ColwiseParallel(),
            p + "attention.wk": ColwiseParallel(),
            p + "attention.wv": ColwiseParallel(),
            p + "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            p + "ffn_norm": SequenceParallel(),
            p + "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            p + "feed_forward.w1": ColwiseParallel(),
            p + "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            p + "feed_forward.w3": ColwiseParallel(),
        })
    return plan


def add_arguments(p):
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=16, help="sequence length (a multiple of the TP degree)")
    p.add_argument("--nan-at", default="")
    p.add_argument("--skip-collective", default="")
    p.add_argument("--replay-hook", action="store_true",
                   help="give tpscope the step's forward and backward (tpscope.set_step_replay) when it records")
    p.add_argument("--timeout", type=float, default=60.0, help="collective timeout, seconds")
    p.add_argument("--metrics-jsonl", help="rank 0 appends one JSON object per step (step, loss, step_time_s, "
                   "step_cpu_s: the process's CPU time, every thread), as tp_train.py does")


def parse_fault(text, parts):
    if not text:
        return None
    values = [int(v) for v in text.split(":")]
    return values + [0] * (parts - len(values))


def build_model(a, device):
    torch.manual_seed(0)  # the same full weights on every rank: parallelize_module shards them
    return Transformer(a.vocab, a.dim, a.heads, a.hidden, a.layers).to(device)


def init(a):
    """(device, rank, world) after init_process_group, Gloo on the CPU and NCCL where a GPU is."""
    cuda = torch.cuda.is_available() and os.environ.get("TPSCOPE_SAMPLE_DEVICE", "") != "cpu"
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=a.timeout))
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return ("cuda" if cuda else "cpu"), dist.get_rank(), dist.get_world_size()


def train(a, model, rank, batch_of):
    """The loop both samples run: batch_of(step) -> tokens; the script's faults applied by rank and step."""
    nan_at = parse_fault(a.nan_at, 3)
    skip = parse_fault(a.skip_collective, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    metrics = open(a.metrics_jsonl, "a") if a.metrics_jsonl and rank == 0 else None

    def compute(tokens):  # the step before the update: what tpscope's step replay runs again
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        loss.backward()
        return loss

    batch = [None]
    if a.replay_hook:
        try:
            import tpscope
            tpscope.set_step_replay(lambda: compute(*batch))
        except ImportError:
            pass  # run without tpscope: nothing to give it
    for step in range(1, a.steps + 1):  # 1-based, as tpscope numbers steps
        t0, c0 = time.perf_counter(), time.process_time()
        tokens = batch_of(step)
        batch[0] = tokens
        if skip and skip[0] == rank and skip[1] == step:
            time.sleep(3600)  # stuck before the step's first collective
        for i, layer in enumerate(model.layers):
            layer.feed_forward.nan = bool(nan_at) and nan_at[0] == rank and nan_at[1] == step and nan_at[2] == i
        opt.zero_grad()
        loss = compute(tokens)
        opt.step()
        value = loss.item()
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        if rank == 0:
            print(f"step {step} loss {value:.4f}", flush=True)
        if metrics:
            metrics.write(json.dumps({"step": step, "loss": value, "step_time_s": elapsed, "step_cpu_s": cpu}) + "\n")
            metrics.flush()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    a = p.parse_args()
    device, rank, world = init(a)
    mesh = init_device_mesh(device, (world,), mesh_dim_names=("tp",))
    model = build_model(a, device)
    model = parallelize_module(model, mesh, tp_plan(model))

    def batch_of(step):  # the same tokens on every rank (TP: replicated inputs); seq + 1 for the shifted targets
        g = torch.Generator().manual_seed(1000 + step)
        return torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g).to(device)

    train(a, model, rank, batch_of)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
