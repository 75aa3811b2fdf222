#!/usr/bin/env python3
"""A small Megatron-style tensor-parallel GPT, trained with plain PyTorch and torch.distributed (Gloo on CPU).

Nothing in it knows about tpscope: it is the kind of script `tpscope capture` records unchanged. With
--replay-hook it adds the one call a program makes to have a step whose values went non-finite replayed op by op
(`tpscope.set_step_replay`, docs/capture.md): the step's forward and backward are one function, `compute(step)`.

    torchrun --nproc-per-node 2 samples/python/tp_train.py --tp 2
    tpscope capture --nproc 2 --tp 2 --out runs/py -- python3 samples/python/tp_train.py --steps 20

Tensor parallelism as in Megatron-LM: an attention block and an MLP per layer, each a column-parallel linear (the
weight split by output features; forward: copy the input, backward: all-reduce its gradient) followed by a
row-parallel linear (split by input features; forward: all-reduce the partial outputs, backward: copy). Those two
communication primitives are autograd functions named by their forward/backward contract. Embeddings, layer norms and
the output head are replicated. Every shard is cut from the same full, seeded weight, so TP=N computes what TP=1
computes. TP groups are consecutive ranks; DP = WORLD_SIZE / TP averages gradients over its group after backward.

The script's own faults (what the tests capture):
  --nan-at RANK:STEP[:LAYER]          rank RANK puts one NaN into layer LAYER's MLP hidden activation in step STEP's
                                      forward; the row-parallel all-reduce then carries it to the TP peers
  --flip-at RANK:STEP[:LAYER]         the same NaN, once only, as a flipped bit makes it: the exponent bits of the
                                      activation's first element all flip to one (a replay of the step does not meet
                                      it again: a transient fault)
  --skip-allreduce RANK:STEP[:LAYER]  rank RANK leaves out layer LAYER's MLP all-reduce in step STEP's forward (a
                                      divergent branch) and then blocks, as a rank stuck in its data loader would:
                                      its TP peers wait in that all-reduce forever (a hang)
"""

import argparse
import datetime
import json
import math
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


# ---- the two communication primitives ----------------------------------------------------------------------------
class CopyToTensorParallel(torch.autograd.Function):
    """Forward: identity (every TP rank holds the full input). Backward: all-reduce the input's gradient over the TP
    group (each rank computed the part its shard of the weight contributes)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        if dist.get_world_size(ctx.group) == 1:
            return grad, None
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group, async_op=True).wait()
        return grad, None


class ReduceFromTensorParallel(torch.autograd.Function):
    """Forward: all-reduce (sum) the partial outputs of a row-parallel layer over the TP group. Backward: identity."""

    @staticmethod
    def forward(ctx, x, group):
        if dist.get_world_size(group) == 1:
            return x
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


# ---- layers ---------------------------------------------------------------------------------------------------------
def full_weight(out_features, in_features, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out_features, in_features, generator=g) / math.sqrt(in_features)


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W split by rows (output features): this rank computes out_features / tp of them."""

    def __init__(self, in_features, out_features, tp, group, seed):
        super().__init__()
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        shard = out_features // size
        self.group = group
        self.weight = nn.Parameter(full_weight(out_features, in_features, seed)[rank * shard:(rank + 1) * shard].clone())
        self.bias = nn.Parameter(torch.zeros(shard))

    def forward(self, x):
        return F.linear(CopyToTensorParallel.apply(x, self.group), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W split by columns (input features): the rank's input is already split the same way; the
    partial products are summed over the TP group. The bias is added once, after the sum."""

    def __init__(self, in_features, out_features, tp, group, seed, fault=None):
        super().__init__()
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        shard = in_features // size
        self.group = group
        self.weight = nn.Parameter(full_weight(out_features, in_features, seed)[:, rank * shard:(rank + 1) * shard].clone())
        self.bias = nn.Parameter(torch.zeros(out_features))
        self.fault = fault  # callable() -> True when this call must leave its all-reduce out

    def forward(self, x):
        partial = F.linear(x, self.weight)
        if self.fault is not None and self.fault():
            sys.stderr.write("tp_train: rank %d leaves out its all-reduce and blocks (--skip-allreduce)\n"
                             % dist.get_rank())
            sys.stderr.flush()
            while True:  # a rank stuck elsewhere; capture's watchdog ends it
                time.sleep(1)
        return ReduceFromTensorParallel.apply(partial, self.group) + self.bias


class ParallelAttention(nn.Module):
    def __init__(self, hidden, heads, tp, group, seed):
        super().__init__()
        self.heads = heads // tp
        self.head_dim = hidden // heads
        # q, k and v each split by heads: the column-parallel weight is [q_shard; k_shard; v_shard] of this rank.
        rank = dist.get_rank(group)
        w = full_weight(3 * hidden, hidden, seed).view(3, heads, self.head_dim, hidden)
        mine = w[:, rank * self.heads:(rank + 1) * self.heads].reshape(-1, hidden)
        self.qkv = ColumnParallelLinear(hidden, 3 * hidden, tp, group, seed)
        with torch.no_grad():
            self.qkv.weight.copy_(mine)
        self.proj = RowParallelLinear(hidden, hidden, tp, group, seed + 1)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        causal = torch.ones(s, s, dtype=torch.bool).triu(1)
        attn = scores.masked_fill(causal, float("-inf")).softmax(-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, s, -1))


class ParallelMLP(nn.Module):
    def __init__(self, hidden, tp, group, seed, nan_fault=None, skip_fault=None, flip_fault=None):
        super().__init__()
        self.fc1 = ColumnParallelLinear(hidden, 4 * hidden, tp, group, seed)
        self.act = nn.GELU()
        self.fc2 = RowParallelLinear(4 * hidden, hidden, tp, group, seed + 1, fault=skip_fault)
        self.nan_fault = nan_fault
        self.flip_fault = flip_fault

    def forward(self, x):
        h = self.fc1(x)
        if self.nan_fault is not None and self.nan_fault():
            h = h.clone()
            h.view(-1)[0] = float("nan")
        if self.flip_fault is not None and self.flip_fault():
            h = h.clone()
            bits = h.view(-1)[:1].view(torch.int32)
            bits |= 0x7F800000 | 0x00400000  # every exponent bit and the quiet bit: a NaN, in one flip of the memory
        return self.fc2(self.act(h))


class Block(nn.Module):
    def __init__(self, hidden, heads, tp, group, seed, **faults):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = ParallelAttention(hidden, heads, tp, group, seed)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = ParallelMLP(hidden, tp, group, seed + 2, **faults)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, args, tp, group, faults):
        super().__init__()
        torch.manual_seed(args.seed)  # replicated parts: the same on every rank
        self.embed = nn.Embedding(args.vocab, args.hidden)
        self.pos = nn.Embedding(args.seq, args.hidden)
        self.layers = nn.ModuleList(
            Block(args.hidden, args.heads, tp, group, args.seed + 10 * (i + 1), **faults.get(i, {}))
            for i in range(args.layers))
        self.ln_f = nn.LayerNorm(args.hidden)
        self.head = nn.Linear(args.hidden, args.vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln_f(x))


# ---- data, groups, faults -------------------------------------------------------------------------------------------
def batch(args, dp_rank, step):
    """Arithmetic sequences mod vocab (start and stride random): next-token prediction the model can learn."""
    g = torch.Generator().manual_seed(1000 * step + dp_rank)
    start = torch.randint(0, args.vocab, (args.batch, 1), generator=g)
    stride = torch.randint(1, 8, (args.batch, 1), generator=g)
    seq = (start + stride * torch.arange(args.seq + 1)) % args.vocab
    return seq[:, :-1], seq[:, 1:]


def make_groups(world, tp):
    """Every rank creates every group, in the same order (torch.distributed requires it)."""
    rank = dist.get_rank()
    tp_group = dp_group = None
    for j in range(world // tp):
        g = dist.new_group(list(range(j * tp, (j + 1) * tp)))
        if rank // tp == j:
            tp_group = g
    for i in range(tp):
        g = dist.new_group(list(range(i, world, tp)))
        if rank % tp == i:
            dp_group = g
    return tp_group, dp_group


def parse_fault(text, name):
    if not text:
        return None
    try:
        parts = [int(p) for p in text.split(":")]
    except ValueError:
        parts = []
    if len(parts) not in (2, 3):
        raise SystemExit("tp_train: %s %r: expected RANK:STEP[:LAYER]" % (name, text))
    return parts[0], parts[1], parts[2] if len(parts) == 3 else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=int, default=int(os.environ.get("TPSCOPE_TP", "0")) or None,
                   help="tensor-parallel size (default: TPSCOPE_TP, else WORLD_SIZE)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--timeout", type=float, default=120, help="process-group timeout, seconds")
    p.add_argument("--metrics-jsonl", help="rank 0 appends one JSON object per step (step, loss, step_time_s, "
                   "step_cpu_s: the process's CPU time, every thread)")
    p.add_argument("--nan-at", help="RANK:STEP[:LAYER] — one NaN in that layer's MLP activation")
    p.add_argument("--flip-at", help="RANK:STEP[:LAYER] — the same NaN, once only (a flipped bit: transient)")
    p.add_argument("--skip-allreduce", help="RANK:STEP[:LAYER] — leave out that layer's MLP all-reduce and block")
    p.add_argument("--replay-hook", action="store_true",
                   help="give tpscope the step's forward and backward (tpscope.set_step_replay) when it records")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    if "RANK" not in os.environ:  # a single process without a launcher
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = args.tp or world
    if world % tp or args.heads % tp or (4 * args.hidden) % tp or args.hidden % args.heads:
        raise SystemExit("tp_train: --tp %d must divide WORLD_SIZE %d, --heads and 4 x --hidden" % (tp, world))
    tp_group, dp_group = make_groups(world, tp)
    dp_rank, dp = rank // tp, world // tp

    step_now = [0]
    faults = {}
    nan = parse_fault(args.nan_at, "--nan-at")
    if nan and nan[0] == rank:
        faults.setdefault(nan[2], {})["nan_fault"] = lambda: step_now[0] == nan[1]
    flip = parse_fault(args.flip_at, "--flip-at")
    if flip and flip[0] == rank:
        flipped = []  # a flipped bit happens once

        def flip_fault():
            if step_now[0] != flip[1] or flipped:
                return False
            flipped.append(step_now[0])
            return True
        faults.setdefault(flip[2], {})["flip_fault"] = flip_fault
    skip = parse_fault(args.skip_allreduce, "--skip-allreduce")
    if skip and skip[0] == rank:
        faults.setdefault(skip[2], {})["skip_fault"] = lambda: step_now[0] == skip[1]
    for layer in faults:
        if layer >= args.layers:
            raise SystemExit("tp_train: a fault names layer %d, but there are %d layers" % (layer, args.layers))

    model = TinyGPT(args, tp, tp_group, faults)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    metrics = open(args.metrics_jsonl, "a") if args.metrics_jsonl and rank == 0 else None
    if rank == 0:
        print("tp_train: world %d = tp %d x dp %d, layers %d, hidden %d, steps %d"
              % (world, tp, dp, args.layers, args.hidden, args.steps), flush=True)

    def compute(step):
        """The step's forward and backward, to the gradients the update uses: the loss."""
        tokens, targets = batch(args, dp_rank, step)
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if dp > 1:  # data parallel: average the gradients over the DP group, one flat all-reduce
            grads = [q.grad for q in model.parameters()]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=dp_group, async_op=True).wait()
            flat /= dp
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        return loss

    if args.replay_hook:
        try:
            import tpscope
            tpscope.set_step_replay(lambda: compute(step_now[0]))
        except ImportError:
            pass  # run without tpscope: nothing to give it
    for step in range(1, args.steps + 1):
        step_now[0] = step
        t0, c0 = time.perf_counter(), time.process_time()
        loss = compute(step)
        optimizer.step()
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        value = loss.item()
        if rank == 0:
            print("step %d/%d loss %.4f step_time %.4fs" % (step, args.steps, value, elapsed), flush=True)
            if metrics:
                metrics.write(json.dumps({"step": step, "loss": value, "step_time_s": elapsed, "step_cpu_s": cpu}) + "\n")
                metrics.flush()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
