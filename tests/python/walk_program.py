#!/usr/bin/env python3
"""A model whose autograd graph has the shapes the backward-span walk must get right, trained for 3 steps in one
process with tpscope recording into OUT/rank-0.db (walk_test.py runs it under both walks: TPSCOPE_AUTOGRAD=python and
the C++ one). Prints one JSON line: the walk used, what the C++ walk still holds after the last backward, and the
module calls per step that should have a backward span (counted here from the model's own calls, not from tpscope),
and the module tpscope names as running inside a custom Function's backward (what a collective there is charged to).

Shapes: residual sums; a module called twice per step; a module returning its input (no node of its own, no span);
an in-place op on a module's own output; a custom autograd.Function (a Python node); tuple outputs that are views;
a frozen submodule whose input needs no gradient; nesting three deep; a forward with gradients on whose backward
never comes (evaluation), between steps; and a forward that raises half-way, caught, before the second step.

The module-output check runs on the same calls: a leaf whose output is a dict of an integer tensor and a transposed
view (not contiguous: handed back to be summed "on its device"), and a leaf whose output turns NaN in the last step.
The JSON line lists every finding of the check ([step, module, "nonfinite" | "tensor"]) in order.

Usage: walk_program.py OUT
"""
import collections
import json
import os
import sys

import torch
import torch.nn as nn

import tpscope
from tpscope import _modules
from tpscope._state import STATE

calls = collections.Counter()  # module name -> calls in the current step that create a node needing a gradient
inside = []  # the module tpscope names as running (STATE.current_module) when Double's backward runs


class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        inside.append(STATE.current_module())  # what a collective issued here would be attributed to
        return g * 2


class Passthrough(nn.Module):
    def forward(self, x):
        return x  # no node of its own: no backward span


class InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        calls["blocks.%d.inplace" % self.index] += 1
        y = self.fc(x)
        y.relu_()
        return y


class Scaled(nn.Module):
    def forward(self, x):
        calls["blocks.%d.scaled" % self.index] += 1
        return Double.apply(x)


class Poison(nn.Module):
    """A leaf whose output is NaN where armed (block 1, the last step)."""

    armed = False

    def forward(self, x):
        calls["blocks.%d.poison" % self.index] += 1
        return x * (float("nan") if self.armed else 1.0)


class View(nn.Module):
    """A leaf whose output is a dict: an integer tensor first, then a view that is not contiguous."""

    def forward(self, x):
        calls["blocks.%d.view" % self.index] += 1
        return {"ids": x.argmax(-1), "t": x.transpose(0, 1)}


class Frozen(nn.Module):
    """A frozen Linear on a detached input (no node: no span) added to a trainable one."""

    def __init__(self):
        super().__init__()
        self.frozen = nn.Linear(16, 16).requires_grad_(False)
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        calls["blocks.%d.mix" % self.index] += 1
        calls["blocks.%d.mix.fc" % self.index] += 1
        return self.frozen(x.detach()) + self.fc(x)


class Block(nn.Module):
    def __init__(self, index):
        super().__init__()
        self.index = index
        self.norm = nn.LayerNorm(16)
        self.shared = nn.Linear(16, 16)
        self.inplace = InPlace()
        self.scaled = Scaled()
        self.passthrough = Passthrough()
        self.mix = Frozen()
        self.poison = Poison()
        self.view = View()
        for m in (self.inplace, self.scaled, self.mix, self.poison, self.view):
            m.index = index

    def forward(self, x):
        name = "blocks.%d" % self.index
        calls[name] += 1
        calls[name + ".norm"] += 1
        calls[name + ".shared"] += 2
        calls[name + ".inplace.fc"] += 1
        h = self.shared(self.norm(x))
        h = self.shared(self.passthrough(h))  # the same module twice
        h = self.scaled(self.inplace(h))
        h = self.poison(self.view(h)["t"].transpose(0, 1))
        return x + self.mix(h)


class Split(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 32)

    def forward(self, x):
        calls["split"] += 1
        calls["split.fc"] += 1
        a, b = self.fc(x).chunk(2, dim=-1)
        return a, b  # views of one node's output


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.blocks = nn.ModuleList(Block(i) for i in range(2))
        self.split = Split()
        self.head = nn.Linear(32, 32)
        self.explode = False

    def forward(self, tokens):
        calls["Net"] += 1
        calls["embed"] += 1
        calls["head"] += 1
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x)
            if self.explode:
                raise RuntimeError("a forward that raises")
        a, b = self.split(x)
        return self.head(torch.cat([a, b * 0.5], dim=-1))


watched = []  # [step, module, finding] of the output check, in order
step_now = [0]


def log_findings():
    """Wraps the output check's one outlet (_modules._watched, either walk) to list its findings."""
    original = _modules._watched

    def logged(info, found):
        watched.append([step_now[0], info.name, "nonfinite" if type(found) is float else "tensor"])
        original(info, found)
    _modules._watched = logged


def main():
    out = sys.argv[1]
    os.environ["TPSCOPE_OUT"] = out
    for k in ("RANK", "WORLD_SIZE", "TPSCOPE_CLOCK_STORE"):
        os.environ.pop(k, None)
    tpscope.instrument()
    log_findings()
    if not tpscope.start():
        sys.exit("tpscope.start() did not start recording")
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.01)
    expected = []
    for step in range(3):
        step_now[0] = step + 1
        net.blocks[1].poison.armed = step == 2
        if step == 1:  # a forward that raises half-way (caught, as a retry after running out of memory is)
            net.explode = True
            try:
                net(torch.randint(0, 32, (4, 8)))
            except RuntimeError:
                pass
            net.explode = False
        calls.clear()
        tokens = torch.randint(0, 32, (4, 8))
        loss = torch.nn.functional.cross_entropy(net(tokens).reshape(-1, 32), tokens.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        expected.append(dict(calls))
        net.blocks[1].poison.armed = False
        if step < 2:
            net(tokens)  # a forward with gradients on whose backward never comes
    held = _modules.held()
    tpscope.stop()
    print(json.dumps({"walk": _modules.walk(), "held": held, "expected": expected, "inside": inside,
                      "watched": watched}))


if __name__ == "__main__":
    main()
