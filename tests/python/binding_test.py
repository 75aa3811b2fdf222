#!/usr/bin/env python3
"""The tpscope Python package in one process (label unit): binding_test.py --work DIR

1. The binding writes the rows the C++ probes write: spans with step/layer/phase, a collective's flight-recorder
   states, step stats, grad_stats from Health.gradients and the nonfinite_grad alert core's rules raise on them.
2. The hooks on a small model trained for 3 steps without torch.distributed: a forward and a backward span per module
   call with its qualified name and layer, one step_stats row per optimizer step with the loss, grad_stats named by
   named_parameters(), a "train step" span per step.
"""

import argparse
import os
import shutil
import sqlite3
import sys


def fail(message):
    sys.stderr.write("FAIL: %s\n" % message)
    sys.exit(1)


def expect(what, got, want):
    if got != want:
        fail("%s: got %r, want %r" % (what, got, want))


def binding_rows(work):
    from tpscope import _native as N
    K = N.kinds
    ok, message = N.start(work, rank=0, world_size=1, run_id="binding-test", install_signal_handlers=False)
    if not ok:
        fail("start: " + message)
    N.set_step(7)
    site = N.site("my span", K.SPAN_COMPUTE, K.PHASE_FORWARD)
    expect("site interned once", N.site("my span", K.SPAN_COMPUTE, K.PHASE_FORWARD), site)
    for _ in range(100):
        N.span_end(site, N.ticks(), 3)
    h = N.collective_enqueued("tp-0", [0, 1], 5, "all_reduce", "float32", [4, 8], 128, "layers.3 mlp forward all-reduce",
                              3, K.PHASE_FORWARD)
    N.collective_state(h, K.STATE_COMPLETED)
    N.step_stat(7, 2.5, lr=0.1, grad_norm=1.5, tokens=64, t0=N.ticks())
    N.counter("a NaN counter", float("nan"))  # dropped and counted: it must not fail the flush that holds the rest
    N.counter("loss scale", 1024.0)
    health = N.Health("nonfinite=warn")
    action = health.gradients(7, ["layers.3.w", "layers.2.w"], [3, 2],
                              [(float("nan"), float("nan"), 2, 0, 10), (1.0, 0.5, 0, 0, 10)])
    expect("warn policy action", action, K.ACTION_CONTINUE)
    try:
        N.Health("nonfinite=sometimes")
        fail("a malformed health option was accepted")
    except ValueError:
        pass
    N.stop("ok")
    db = sqlite3.connect(os.path.join(work, "rank-0.db"))
    q = lambda sql: db.execute(sql).fetchall()
    expect("spans", q("SELECT name, kind, phase, step, layer, count(*) FROM span_view GROUP BY name"),
           [("my span", "compute", "fwd", 7, 3, 100)])
    expect("collective", q("SELECT group_name, seq, op, dtype, shape, numel, bytes, callsite, step, layer, state, "
                           "end_ns >= start_ns FROM collectives"),
           [("tp-0", 5, "all_reduce", "float32", "[4,8]", 32, 128, "layers.3 mlp forward all-reduce", 7, 3,
             "completed", 1)])
    expect("step_stats", q("SELECT step, loss, lr, grad_norm, tokens, skipped FROM step_stats"),
           [(7, 2.5, 0.1, 1.5, 64, 0)])
    expect("grad_stats", q("SELECT param, layer, l2_norm, nan_count, numel FROM grad_view ORDER BY param"),
           [("layers.2.w", 2, 1.0, 0, 10), ("layers.3.w", 3, None, 2, 10)])
    expect("alert", q("SELECT kind, severity, step, layer, param FROM alerts"),
           [("nonfinite_grad", "critical", 7, 3, "layers.3.w")])
    expect("exit reason", q("SELECT exit_reason FROM ranks"), [("ok",)])
    expect("counters", q("SELECT name, value FROM counter_view WHERE name NOT LIKE 'tpscope.%' AND name NOT LIKE 'sched.%'"),
           [("loss scale", 1024.0)])
    # The step's end records the process's wait for a CPU so far (the straggler rule reads it).
    expect("run delay at the step's end", q("SELECT count(*), min(value) >= 0 FROM counter_view "
                                            "WHERE name = 'sched.run_delay_ns'"), [(1, 1)])
    expect("the NaN counter counted as dropped", q("SELECT max(records_dropped) FROM recorder_stats"), [(1,)])


def hooked_model(work):
    import torch
    import tpscope
    from tpscope import _native as N
    os.environ["TPSCOPE_OUT"] = work
    for k in ("RANK", "WORLD_SIZE", "TPSCOPE_CLOCK_STORE"):
        os.environ.pop(k, None)
    if not tpscope.start():
        fail("tpscope.start() did not start recording")
    tpscope.instrument()
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)
            self.act = torch.nn.ReLU()

        def forward(self, x):
            return x + self.act(self.fc(x))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(32, 16)
            self.layers = torch.nn.ModuleList(Block() for _ in range(2))
            self.head = torch.nn.Linear(16, 32)

        def forward(self, tokens):
            x = self.embed(tokens)
            for layer in self.layers:
                x = layer(x)
            return self.head(x)

    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(3):
        tokens = torch.randint(0, 32, (4, 8))
        loss = torch.nn.functional.cross_entropy(net(tokens).reshape(-1, 32), tokens.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    tpscope.stop()
    db = sqlite3.connect(os.path.join(work, "rank-0.db"))
    q = lambda sql: db.execute(sql).fetchall()
    per_phase = q("SELECT name, phase, layer, count(*) FROM span_view WHERE kind = 'compute' AND name LIKE 'layers.%' "
                  "GROUP BY name, phase ORDER BY name, phase")
    want = []
    for name, layer in (("layers.0", 0), ("layers.0.act", 0), ("layers.0.fc", 0), ("layers.1", 1),
                        ("layers.1.act", 1), ("layers.1.fc", 1)):
        want += [(name, "bwd", layer, 3), (name, "fwd", layer, 3)]
    expect("module spans", per_phase, want)
    nesting = q("SELECT count(*) FROM span_view c JOIN span_view p ON p.name = 'layers.1' AND c.name = 'layers.1.fc' "
                "AND c.step = p.step AND c.phase = p.phase AND c.begin_ns >= p.begin_ns AND c.end_ns <= p.end_ns")
    expect("layers.1.fc inside layers.1 (fwd and bwd, 3 steps)", nesting, [(6,)])
    expect("embedding backward", q("SELECT count(*) FROM span_view WHERE name = 'embed' AND phase = 'bwd'"), [(3,)])
    steps = q("SELECT step, loss > 0, tokens, skipped FROM step_stats ORDER BY step")
    expect("step_stats", steps, [(1, 1, 32, 0), (2, 1, 32, 0), (3, 1, 32, 0)])
    expect("train step spans", q("SELECT step, count(*) FROM span_view WHERE name = 'train step' GROUP BY step"),
           [(1, 1), (2, 1), (3, 1)])
    expect("grad_stats", q("SELECT param, layer FROM grad_view WHERE step = 2 ORDER BY param"),
           [("embed.weight", -1), ("head.bias", -1), ("head.weight", -1), ("layers.0.fc.bias", 0),
            ("layers.0.fc.weight", 0), ("layers.1.fc.bias", 1), ("layers.1.fc.weight", 1)])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--work", required=True)
    args = p.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    for sub in ("binding", "hooks"):
        os.makedirs(os.path.join(args.work, sub))
    binding_rows(os.path.join(args.work, "binding"))
    hooked_model(os.path.join(args.work, "hooks"))
    print("PASS python_binding_test")


if __name__ == "__main__":
    main()
