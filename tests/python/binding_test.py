#!/usr/bin/env python3
"""The tpscope Python package in one process (label unit): binding_test.py --work DIR

1. The binding writes the rows the C++ probes write: spans with step/layer/phase, a collective's flight-recorder
   states, step stats, grad_stats from Health.gradients and the nonfinite_grad alert core's rules raise on them.
2. The host reads (host_stats, host_nonfinite) against torch's numbers in double, on every dtype they take.
3. The hooks on a small model trained for 3 steps without torch.distributed: a forward and a backward span per module
   call with its qualified name and layer, one step_stats row per optimizer step with the loss, grad_stats named by
   named_parameters() and equal to torch's norms, a "train step" span per step.
4. The functional collectives' wrappers (tpscope._native.funcol_wrapper, C) on a one-rank Gloo group, after the
   model's steps: each outermost call recorded once with its sequence number, op, payload and the program's line as
   its call site, whatever way the group is passed; a call that raised recorded as failed; a list payload and a list
   result (the coalesced form) completed; a wrapped function called by another (permute_tensor's all_to_all_single)
   recorded once; nothing recorded while set_paused(True).
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
    fast_path(N, K)
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
           [("all_gather", "comm", "fwd", 7, 2, 1), ("my span", "compute", "fwd", 7, 3, 100)])
    expect("the fast path's collectives", q("SELECT group_name, seq, op, dtype, shape, numel, bytes, callsite, step, "
                                            "layer, phase, state, end_ns >= start_ns FROM collectives ORDER BY seq"),
           [("pair", 1, "all_gather", "bfloat16", "[3,5]", 15, 30, "fc2 forward all-gather", 7, 2, 1, "completed", 1),
            ("pair", 2, "barrier", "none", "[]", 0, 0, "x.py:9 backward barrier", 7, -1, 2, "started", None),
            ("pair", 3, "all_gather", "float32", "[2,4]", 8, 96, "fc2 forward all-gather", 7, 2, 1, "started", None),
            ("pair", 4, "all_gather", "none", "[]", 0, 0, "fc2 forward all-gather", 7, 0, 0, "started", None)])
    expect("the fast path's group", q("SELECT ranks FROM process_groups WHERE name = 'pair'"), [("0,1",)])
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


def fast_path(N, K):
    """The collective wrappers' hot path (collective_fastpath.cpp): interned ids, the group's own sequence numbers,
    a tensor's payload read through the C API, the three payload forms, and bad ids refused."""
    import torch
    gid = N.collective_group("pair", [0, 1])
    expect("a group interned once", N.collective_group("pair", [0, 1]), gid)
    op, cs = N.intern_text("all_gather"), N.intern_text("fc2 forward all-gather")
    expect("a text interned once", N.intern_text("all_gather"), op)
    t0 = N.ticks()
    h1, seq1 = N.collective_issue(gid, op, cs, 2, K.PHASE_FORWARD, torch.zeros(3, 5, dtype=torch.bfloat16), t0)
    site = N.site("all_gather", K.SPAN_COMM, K.PHASE_FORWARD, "comm")
    N.collective_waited(h1, site, t0, 2)
    _, seq2 = N.collective_issue(gid, N.intern_text("barrier"), N.intern_text("x.py:9 backward barrier"), -1,
                                 K.PHASE_BACKWARD, None, 0)
    _, seq3 = N.collective_issue(gid, op, cs, 2, K.PHASE_FORWARD, ("float32", [2, 4], 96), 0)
    expect("sequence numbers", (seq1, seq2, seq3), (1, 2, 3))
    for bad in ((gid + 1000, op, cs, 0, 0, None, 0), (gid, 10 ** 6, cs, 0, 0, None, 0), (gid, op, cs, 0, 99, None, 0),
                (gid, op, cs, 0, 0, ("float32", [2]), 0), (gid, op, cs, 0, 0, object(), 0)):
        try:
            N.collective_issue(*bad)
            fail("collective_issue%r was accepted" % (bad,))
        except (ValueError, TypeError, AttributeError):
            pass
    expect("no sequence number taken by a refused call", N.collective_issue(gid, op, cs, 0, 0, None, 0)[1], 4)
    # program_frame: the innermost frame outside the foreign folders (here: none are foreign, so this very line).
    N.set_foreign_dirs([])
    expect("program frame", N.program_frame(), "binding_test.py:%d" % (sys._getframe().f_lineno))
    N.set_foreign_dirs([os.path.dirname(os.path.abspath(__file__)) + "/"])
    frame = N.program_frame()
    if "binding_test.py" in frame:
        fail("program_frame named a frame in a foreign folder: " + frame)
    base = torch.arange(12.0)
    view = base[4:]
    expect("a view's storage key is its base's", N.storage_key(view), N.storage_key(base))
    expect("storage key", N.storage_key(base), base.data_ptr())
    expect("a meta tensor has no storage key", N.storage_key(torch.zeros(2, device="meta")), None)
    from tpscope import _modules
    if _modules._CPP_MODULE is not None:  # the same answers read from the TensorImpl (what the wrappers use there)
        A = _modules._CPP_MODULE
        for what, t in (("base", base), ("view", view), ("meta", torch.zeros(2, device="meta")),
                        ("empty", torch.zeros(0)), ("non-tensor", 3)):
            expect("_autograd.storage_key of a %s" % what, A.storage_key(t),
                   N.storage_key(t) if isinstance(t, torch.Tensor) else None)


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
    funcol_lines = funcol_calls()
    tpscope.stop()
    db = sqlite3.connect(os.path.join(work, "rank-0.db"))
    q = lambda sql: db.execute(sql).fetchall()
    expect("the functional collectives", q("SELECT seq, op, dtype, shape, bytes, callsite, state, step FROM collectives "
                                           "WHERE group_name = 'world' ORDER BY seq"),
           [(1, "all_reduce", "float32", "[2,3]", 24, "binding_test.py:%d all-reduce" % funcol_lines[0], "completed", 4),
            (2, "all_reduce", "float32", "[2,3]", 24, "binding_test.py:%d all-reduce" % funcol_lines[1], "completed", 4),
            (3, "all_gather", "float32", "[2,3]", 24, "binding_test.py:%d all-gather" % funcol_lines[2], "completed", 4),
            (4, "all_reduce", "float32", "[2,3]", 24, "binding_test.py:%d all-reduce" % funcol_lines[3], "failed", 4),
            (5, "all_reduce", "float32", "[2,3]", 48, "binding_test.py:%d all-reduce" % funcol_lines[4], "completed", 4),
            (6, "all_to_all", "float32", "[6]", 24, "binding_test.py:%d all-to-all" % funcol_lines[5], "completed", 4)])
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
    # The rows are the gradients' own numbers (read on the host by the binding): computed here by torch in double.
    named = dict(net.named_parameters())
    for name, l2, max_abs, bad, numel in q("SELECT param, l2_norm, max_abs, nan_count + inf_count, numel "
                                           "FROM grad_view WHERE step = 3"):
        g = named[name].grad.double()
        if not (abs(l2 - float(g.norm())) <= 1e-6 * float(g.norm()) and max_abs == float(g.abs().max())
                and bad == 0 and numel == g.numel()):
            fail("grad_stats of %s at step 3: (%r, %r, %r, %r), torch says (%r, %r, 0, %r)"
                 % (name, l2, max_abs, bad, numel, float(g.norm()), float(g.abs().max()), g.numel()))
    expect("grad_stats", q("SELECT param, layer FROM grad_view WHERE step = 2 ORDER BY param"),
           [("embed.weight", -1), ("head.bias", -1), ("head.weight", -1), ("layers.0.fc.bias", 0),
            ("layers.0.fc.weight", 0), ("layers.1.fc.bias", 1), ("layers.1.fc.weight", 1)])


def funcol_calls():
    """Section 4's calls (recording on, instrumented); returns the line of each recorded one."""
    import torch
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as funcol
    from tpscope import _native as N
    here = lambda: sys._getframe(1).f_lineno
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    lines = []
    try:
        expect("funcol.all_reduce wrapped", type(funcol.all_reduce).__name__, "FuncolWrapper")
        expect("the wrapper's name", (funcol.all_reduce.__name__, funcol.all_reduce.__wrapped__.__name__),
               ("all_reduce", "all_reduce"))
        world = dist.group.WORLD
        x = torch.ones(2, 3)
        y = funcol.all_reduce(x, "sum", world); lines.append(here())  # noqa: E702 (the line is the call site)
        expect("all_reduce", float((y * 1).sum()), 6.0)  # the first use waits
        y = funcol.all_reduce(x, reduceOp="sum", group=world); lines.append(here())  # noqa: E702
        expect("all_reduce by keyword", float((y * 1).sum()), 6.0)
        y = funcol.all_gather_tensor(x, 0, world.group_name); lines.append(here())  # noqa: E702
        expect("all_gather_tensor by group name", list((y * 1).shape), [2, 3])
        try:
            funcol.all_reduce(x, "no such op", world)
            fail("an unknown reduce op was accepted")
        except (ValueError, RuntimeError):
            lines.append(here() - 3)
        N.set_paused(True)
        expect("recording() while paused", N.recording(), False)
        y = funcol.all_reduce(x, "sum", world)  # not recorded: takes no sequence number
        float((y * 1).sum())
        N.set_paused(False)
        ys = funcol.all_reduce_coalesced([x, x], "sum", world); lines.append(here())  # noqa: E702
        expect("all_reduce_coalesced", [float((t * 1).sum()) for t in ys], [6.0, 6.0])
        y = funcol.permute_tensor(x.flatten(), [0], world); lines.append(here())  # noqa: E702
        expect("permute_tensor", float((y * 1).sum()), 6.0)
    finally:
        dist.destroy_process_group()
    return lines


def host_reads():
    """host_stats / host_nonfinite (python/src/host_stats.cpp) against torch in double, on every dtype they read, at
    lengths around the vector widths and blocks, with NaN and ±Inf at the front, the middle and the scalar tail."""
    import math
    import torch
    from tpscope import _host
    from tpscope import _native as N
    codes = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}
    torch.manual_seed(1)

    def same(a, b):
        return a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-6 * abs(b)

    for dtype, code in codes.items():
        for n in (0, 1, 7, 8, 15, 16, 17, 4095, 4096, 4097, 12291):
            base = (torch.randn(n, dtype=torch.float64) * 3).to(dtype)
            if n > 2 and dtype == torch.float16:
                base[1] = 3e-6  # a subnormal half
            for bad, where in ((None, 0), ("nan", 0), ("inf", n // 2), ("-inf", n - 1), ("nan", n - 1)):
                t = base.clone()
                if bad is not None and n > 0:
                    t[where] = float(bad)
                d = t.double()
                finite = d[torch.isfinite(d)]
                want = (float((d * d).sum()),
                        float("nan") if torch.isnan(d).any() else float(d.abs().max()) if n else 0.0,
                        int(torch.isnan(d).sum()), int(torch.isinf(d).sum()))
                got = N.host_stats([(t.data_ptr(), n, code)])[0]
                if not (all(same(g, w) for g, w in zip(got[:2], want[:2])) and got[2:] == want[2:]):
                    fail("host_stats of %s[%d] with %s at %d: got %r, torch says %r" % (dtype, n, bad, where, got, want))
                nonfinite = N.host_nonfinite(t.data_ptr(), n, code)
                if (nonfinite is None) != (finite.numel() == n) or (nonfinite is not None
                                                                    and not same(nonfinite, float(d.sum()))):
                    fail("host_nonfinite of %s[%d] with %s at %d: got %r, sum %r" % (dtype, n, bad, where, nonfinite,
                                                                                    float(d.sum())))
    # The two paths of the gradient rows give the same rows: the binding's and torch's (the one device tensors take).
    from tpscope import _training
    grads = [torch.randn(300, 17), torch.randn(5), torch.randn(64, 64)]
    grads[1][3] = float("nan")
    grads[2][7, 7] = float("-inf")
    for h, d in zip(_host.grad_rows(grads), _training._device_grad_rows(grads)):
        if not (same(h[0], d[0]) or abs(h[0] - d[0]) <= 1e-5 * d[0]) or not same(h[1], d[1]) or h[2:] != d[2:]:
            fail("gradient rows differ between the host read %r and torch's %r" % (h, d))
    # What the binding cannot read is left to torch: a strided view, an integer tensor.
    strided = torch.randn(8, 8).t()
    expect("a strided gradient is left to torch", _host.grad_rows([torch.randn(4), strided]), None)
    expect("an integer output is left to torch", _host.nonfinite(torch.zeros(4, dtype=torch.int64)), (False, None))
    try:
        N.host_stats([(strided.data_ptr(), 4, 9)])
        fail("a dtype code outside 0-3 was accepted")
    except ValueError:
        pass


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--work", required=True)
    args = p.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    for sub in ("binding", "hooks"):
        os.makedirs(os.path.join(args.work, sub))
    binding_rows(os.path.join(args.work, "binding"))
    host_reads()
    hooked_model(os.path.join(args.work, "hooks"))
    print("PASS python_binding_test")


if __name__ == "__main__":
    main()
