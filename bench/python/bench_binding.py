#!/usr/bin/env python3
"""Per-record cost of the recorder through the Python binding (tpscope._native), recording into a real rank file.

  span        ticks() + span_end(site, t0, layer): what a module's forward hook pays to record its span
  span_emit   emit_span(site, t0, t1, layer) with the ticks taken beforehand
  collective_issue  collective_issue(group_id, op_id, callsite_id, layer, phase, tensor, ticks) (enqueued + started,
              the payload read from the tensor) + collective_state(completed): one flight-recorder record as the
              functional collectives' and ProcessGroup wrappers make it, on interned ids
  off         span_end while not recording (the recorder stopped): the binding's call overhead alone

Each figure is the median of --rounds timed loops of --n calls, per call, in the thread's CPU time
(time.thread_time_ns: what the call costs whatever else runs on the machine) and in wall time; the recorder flushes
between rounds, outside the timing, and a loop fits its ring (spans: 64 Ki per thread; collectives: --n / 25 in the
4096-entry flight recorder), so nothing is dropped and each record is really kept. The recorder's own C++ hot-path
cost per span (recorder.span_cost_ps, measured at start) is printed beside it.

Usage: PYTHONPATH=<build>/python .venv/bin/python3 bench/python/bench_binding.py [--n 50000] [--rounds 9]
"""
import argparse
import statistics
import tempfile
import time

from tpscope import _native as N

K = N.kinds


def per_call(fn, n, rounds):
    """(wall ns, thread CPU ns) per call, medians over the rounds."""
    wall, cpu = [], []
    for _ in range(rounds):
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        fn(n)
        cpu.append((time.thread_time_ns() - c0) / n)
        wall.append((time.perf_counter_ns() - t0) / n)
        N.flush()
    return statistics.median(wall), statistics.median(cpu)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=50_000)
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args()
    site = N.site("bench span", K.SPAN_COMPUTE, K.PHASE_FORWARD)
    ticks, span_end, emit_span = N.ticks, N.span_end, N.emit_span
    state = N.collective_state
    done = K.STATE_COMPLETED

    def spans(n):
        for _ in range(n):
            span_end(site, ticks(), 3)

    def spans_emit(n):
        t = ticks()
        for _ in range(n):
            emit_span(site, t, t, 3)

    import torch
    gid = N.collective_group("tp-0", [0, 1])
    op_id, cs_id = N.intern_text("all_reduce"), N.intern_text("layers.0.mlp.fc2 forward")
    payload = torch.zeros(8, 16, 64)
    issue = N.collective_issue

    def collectives_issue(n):
        for _ in range(n):
            h, _ = issue(gid, op_id, cs_id, 0, 1, payload, 0)
            state(h, done)

    with tempfile.TemporaryDirectory() as tmp:
        ok, message = N.start(tmp, rank=0, world_size=1, install_signal_handlers=False)
        if not ok:
            raise SystemExit(message)
        results = {
            "span": per_call(spans, args.n, args.rounds),
            "span_emit": per_call(spans_emit, args.n, args.rounds),
            "collective_issue": per_call(collectives_issue, max(args.n // 25, 100), args.rounds),
        }
        N.flush()
        stats = N.recorder_stats()
        N.stop()
        results["off"] = per_call(spans, args.n, args.rounds)
    for name, (wall, cpu) in results.items():
        print("%-16s %7.1f ns CPU per record (%.2f M/s per core), %7.1f ns wall" % (name, cpu, 1e3 / cpu, wall))
    print("recorder: %d spans written, %d dropped, %d records written, %d dropped; C++ span cost %.1f ns"
          % (stats["spans_written"], stats["spans_dropped"], stats["records_written"], stats["records_dropped"],
             stats["per_span_cost_ps"] / 1000))


if __name__ == "__main__":
    main()
