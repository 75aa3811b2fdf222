"""The tpscope GPT written with PyTorch's Python API (the eager baseline for bench/core/run_bench.py).

Same architecture as core/ (pre-LN GPT, fused QKV laid out head by head, causal softmax attention, exact GELU MLP,
learned positions, output head tied to the embedding, mean token cross entropy), same optimizer (AdamW with two
parameter groups, global-norm clipping) and the same shapes. Written the way a PyTorch user would write it.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x):
        b, s, _ = x.shape
        h = self.qkv(x).view(b, s, self.heads, 3, self.head_dim).permute(3, 0, 2, 1, 4)
        q, k, v = h[0], h[1], h[2]
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        mask = torch.ones(s, s, dtype=torch.bool).triu(1)
        probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
        ctx = (probs @ v).permute(0, 2, 1, 3).reshape(b, s, -1)
        return self.out(ctx)


class Block(nn.Module):
    def __init__(self, hidden, heads, ffn):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attention = Attention(hidden, heads)
        self.fc1, self.fc2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self, layers, hidden, heads, ffn, seq_len, vocab):
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden)
        self.position = nn.Parameter(torch.randn(seq_len, hidden) * 0.01)
        self.layers = nn.ModuleList([Block(hidden, heads, ffn) for _ in range(layers)])
        self.ln_final = nn.LayerNorm(hidden)
        for n, p in self.named_parameters():
            if p.dim() >= 2 and n != "position":
                nn.init.normal_(p, 0.0, 0.02)
            elif n.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, ids, targets):
        x = self.embedding(ids) + self.position[: ids.shape[1]]
        for layer in self.layers:
            x = layer(x)
        logits = self.ln_final(x) @ self.embedding.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def make_optimizer(model, cfg):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.get("weight_decay", 0.0)},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=cfg["lr"], betas=(cfg.get("beta1", 0.9), cfg.get("beta2", 0.95)),
                             eps=cfg.get("adam_eps", 1e-8))


def learning_rate(cfg, step):
    """Linear warm-up then cosine to min_lr, as core's learningRate (step is 1-based)."""
    lr, min_lr, warmup, steps = cfg["lr"], cfg.get("min_lr", 0.0), cfg.get("warmup", 0), cfg.get("steps", 20)
    if warmup > 0 and step <= warmup:
        return lr * step / warmup
    progress = min(max((step - warmup) / max(1, steps - warmup), 0.0), 1.0)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def train_step(model, opt, ids, targets, clip, lr):
    for g in opt.param_groups:
        g["lr"] = lr
    opt.zero_grad(set_to_none=True)
    loss = model(ids, targets)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return loss.item()
