#!/usr/bin/env python3
"""Seeded generator of a multi-rank PyTorch profiler (Kineto) trace set, one .pt.trace.json.gz per rank, for the
HTA side-by-side benchmark (bench/hta/run_hta.py, issue #29 §3). Standard library only.

What each rank's file holds, per step (a data-parallel trainer on one GPU, 4 linear layers, NCCL all-reduce of the
gradients in two buckets):
  - `ProfilerStep#N` (user_annotation) around the step; the data loader's `enumerate(DataLoader)#...__next__`;
  - an input copy: `aten::copy_` ⊃ `cudaMemcpyAsync` → `Memcpy HtoD (Pageable -> Device)` (gpu_memcpy) on stream 7;
  - forward and backward ops (`aten::mm`, `aten::gelu`, `autograd::engine::evaluate_function: MmBackward0`), each
    ⊃ `cudaLaunchKernel` (cuda_runtime, cbid 211) whose CUPTI `correlation` (and `External id`) the kernel on the
    compute stream 7 carries, with the `ac2g` flow pair Kineto writes between them;
  - two gradient all-reduces: `record_param_comms` (PyTorch's collective metadata: `Collective name`, `In msg
    nelems`, `Group size`, `dtype`, `Process Group Name/Description/Ranks`, `Seq`) ⊃ `nccl:all_reduce` ⊃
    `cudaLaunchKernel` → `ncclDevKernel_AllReduce_Sum_bf16_RING_LL(...)` on the communication stream 20. The first
    bucket is launched halfway through the backward pass and overlaps the rest of it (partial overlap); the second
    follows the last backward kernel and is exposed. A collective ends at the same instant on every rank: the
    latest rank's kernel start plus the transfer time, so early ranks' NCCL kernels last longer (they wait);
  - `Optimizer.step#AdamW.step` ⊃ `cudaStreamWaitEvent` + `cudaLaunchKernel` → `multi_tensor_apply_kernel` after the
    last all-reduce; `cudaDeviceSynchronize` ends the step, so all of a step's GPU work lies inside its
    `ProfilerStep` window (the definitions of both tools then cover the same kernels; see run_hta.py);
  - `distributedInfo` {backend nccl, rank, world_size, pg_config}, `deviceProperties`, thread/process metadata and
    the profiler's `Trace` span, as torch.profiler writes them. Times are integer µs (unix epoch), as Kineto wrote
    them before ns resolution; HTA rounds fractional µs down per event, which would make the tools differ by < 1 µs
    a kernel for no reason of definition.

A straggler: one rank (chosen by the seed, printed). --straggler-kind host (default): its data loader takes
--straggler-slowdown × 4 longer (180 µs → 900 µs at the default 1.25: the GPU idles and the rank enqueues and starts
every collective late); gpu: its compute kernels run --straggler-slowdown slower while its host keeps pace (it
enqueues on time, its NCCL kernels start late). Either way every other rank's all-reduce kernels start before the
straggler's and wait for it. Durations have seeded ±5 % jitter.
--nccl-names legacy names the NCCL kernels as NCCL < 2.19 did (`ncclKernel_AllReduce_RING_LL_Sum_bf16(ncclDevComm*,
unsigned long, ncclWork*)`); HTA's straggler analysis only looks for that prefix.

Usage: python3 bench/hta/gen_kineto.py --ranks 8 --steps 10 --seed 1 --out DIR
Prints one line: ranks=… steps=… straggler=R events=… bytes=… (uncompressed JSON) seconds=…
"""
import argparse
import gzip
import json
import os
import random
import sys
import time

COMPUTE_STREAM, COMM_STREAM = 7, 20
T0_US = 1764936000000000  # 2025-12-05 12:00 UTC, unix µs
LAYERS = 4
GEMM = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_"
        "kernel__5x_cublas")
GELU = ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
        "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::"
        "BFloat16)#1}, at::detail::Array<char*, 2> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
        "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::"
        "BFloat16)#1}, at::detail::Array<char*, 2>)")
ADAM = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
        "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<c10::BFloat16, 4, "
        "(at::native::ADAM_MODE)1, false>, double, double, double, double, double, double, bool, double*, double*>"
        "(at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::"
        "FusedAdamMathFunctor<c10::BFloat16, 4, (at::native::ADAM_MODE)1, false>, double, double, double, double, "
        "double, double, bool, double*, double*)")
NCCL_NAMES = {"dev": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
              "legacy": "ncclKernel_AllReduce_RING_LL_Sum_bf16(ncclDevComm*, unsigned long, ncclWork*)"}
NCCL = NCCL_NAMES["dev"]
MEMCPY = "Memcpy HtoD (Pageable -> Device)"
BUCKET_NELEMS = (25165824, 16777216)  # bf16 gradient buckets: 48 MiB, 32 MiB


class Rank:
    def __init__(self, rank, world, rng, slow, host_slow):
        self.rank, self.world, self.rng, self.slow, self.host_slow = rank, world, rng, slow, host_slow
        self.pid, self.tid, self.dev = 40000 + rank, 40000 + rank, rank % 8
        self.cpu = T0_US + rng.randint(0, 40)  # host clock
        self.g7 = self.g20 = self.cpu  # when the streams are free
        self.corr = 1000 + rank * 7  # CUPTI correlation ids, per process
        self.ext = 50 + rank * 3  # External id
        self.events = []
        self.seq = 0
        self.n_events = 0

    def j(self, us):  # ±5 % jitter, at least 1 µs
        return max(1, int(round(us * self.rng.uniform(0.95, 1.05))))

    def cpu_op(self, name, ts, dur, cat="cpu_op", args=None):
        self.ext += 1
        a = {"External id": self.ext, "Ev Idx": self.n_events}
        if args:
            a.update(args)
        self.emit({"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": self.tid, "ts": ts, "dur": dur,
                   "args": a})

    def emit(self, e):
        self.events.append(e)
        self.n_events += 1

    def launch(self, kernel, gpu_dur, stream=COMPUTE_STREAM, not_before=0, runtime="cudaLaunchKernel", cat="kernel",
               gpu_end=None, kargs=None):
        """A runtime call at the host clock and its GPU activity on stream; returns (gpu begin, gpu end)."""
        self.corr += 1
        c, t = self.corr, self.cpu
        rdur = self.j(5)
        self.emit({"ph": "X", "cat": "cuda_runtime", "name": runtime, "pid": self.pid, "tid": self.tid, "ts": t,
                   "dur": rdur, "args": {"External id": self.ext, "cbid": 211 if runtime == "cudaLaunchKernel" else 41,
                                         "correlation": c}})
        free = self.g7 if stream == COMPUTE_STREAM else self.g20
        begin = max(free + self.rng.randint(1, 3), t + rdur // 2 + 2, not_before)
        end = gpu_end if gpu_end is not None else begin + gpu_dur
        a = {"External id": self.ext, "queued": 0, "device": self.dev, "context": 1, "stream": stream,
             "correlation": c}
        if cat == "kernel":
            a.update({"registers per thread": 128, "shared memory": 65536, "blocks per SM": 1.0,
                      "warps per SM": 4.0, "grid": [132, 1, 1], "block": [384, 1, 1],
                      "est. achieved occupancy %": 6})
        else:
            a.update({"bytes": 8388608, "memory bandwidth (GB/s)": 8388608 / max(1, end - begin) / 1e3})
        if kargs:
            a.update(kargs)
        self.emit({"ph": "X", "cat": cat, "name": kernel, "pid": self.dev, "tid": stream, "ts": begin,
                   "dur": end - begin, "args": a})
        self.emit({"ph": "s", "id": c, "pid": self.pid, "tid": self.tid, "ts": t, "cat": "ac2g", "name": "ac2g"})
        self.emit({"ph": "f", "id": c, "pid": self.dev, "tid": stream, "ts": begin, "cat": "ac2g", "name": "ac2g",
                   "bp": "e"})
        if stream == COMPUTE_STREAM:
            self.g7 = end
        else:
            self.g20 = end
        self.cpu = t + rdur
        return begin, end

    def op_with_kernel(self, name, kernel, gpu_us, cpu_before=12, cpu_after=6):
        """cpu_op ⊃ cudaLaunchKernel → kernel on the compute stream; the host advances past the op."""
        ts = self.cpu
        self.cpu += self.j(cpu_before)
        idx = len(self.events)
        self.cpu_op(name, ts, 0)
        self.launch(kernel, self.j(gpu_us * self.slow))
        self.cpu += self.j(cpu_after)
        self.events[idx]["dur"] = self.cpu - ts
        self.cpu += self.j(4)

    def allreduce_launch(self, bucket, ready):
        """record_param_comms ⊃ nccl:all_reduce ⊃ cudaLaunchKernel; the kernel's end is set once every rank's start
        is known (returns the kernel event and its earliest start)."""
        self.seq += 1
        ts = self.cpu
        n = BUCKET_NELEMS[bucket]
        meta = {"Collective name": "allreduce", "In msg nelems": n, "Out msg nelems": n, "Group size": self.world,
                "dtype": "BFloat16", "In split size": "[]", "Out split size": "[]", "Global rank start": 0,
                "Global rank stride": 1, "Process Group Name": "0", "Process Group Description": "default_pg",
                "Process Group Ranks": self.pg_ranks, "Rank": self.rank, "Seq": self.seq}
        self.cpu += self.j(15)
        outer = len(self.events)
        self.cpu_op("record_param_comms", ts, 0, args=meta)
        ts2 = self.cpu
        self.cpu += self.j(8)
        inner = len(self.events)
        self.cpu_op("nccl:all_reduce", ts2, 0, cat="user_annotation")
        begin, _ = self.launch(NCCL, 1, stream=COMM_STREAM, not_before=ready,
                               kargs={"Collective name": "allreduce", "In msg nelems": n, "Out msg nelems": n,
                                      "Group size": self.world, "dtype": "BFloat16", "Process Group Name": "0",
                                      "Process Group Description": "default_pg", "Seq": self.seq})
        kernel = self.events[-3]
        self.cpu += self.j(10)
        self.events[inner]["dur"] = self.cpu - ts2
        self.cpu += self.j(20)
        self.events[outer]["dur"] = self.cpu - ts
        self.cpu += self.j(5)
        return kernel, begin


def simulate_step(ranks, step, xfer_us):
    """One step of every rank, in lockstep at the two all-reduces."""
    starts = []
    for r in ranks:
        r.step_begin = r.cpu
        r.step_idx = len(r.events)
        r.cpu_op(f"ProfilerStep#{step}", r.cpu, 0, cat="user_annotation")
        r.cpu += r.j(3)
        dl = r.j(180 * r.host_slow)
        r.cpu_op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", r.cpu, dl, cat="user_annotation")
        r.cpu += dl + r.j(5)
        ts = r.cpu
        r.cpu += r.j(10)
        idx = len(r.events)
        r.cpu_op("aten::copy_", ts, 0)
        r.launch(MEMCPY, r.j(45), runtime="cudaMemcpyAsync", cat="gpu_memcpy")
        r.cpu += r.j(6)
        r.events[idx]["dur"] = r.cpu - ts
        for _ in range(LAYERS):  # forward
            r.op_with_kernel("aten::mm", GEMM, 160)
            r.op_with_kernel("aten::gelu", GELU, 28)
        for layer in reversed(range(LAYERS // 2, LAYERS)):  # backward, first half
            r.op_with_kernel("autograd::engine::evaluate_function: MmBackward0", GEMM, 165)
            r.op_with_kernel("autograd::engine::evaluate_function: MmBackward0", GEMM, 165)
        kernel, begin = r.allreduce_launch(0, r.g7)
        r.pending = kernel
        starts.append(begin)
    end0 = max(starts) + xfer_us[0]
    starts = []
    for r in ranks:
        r.pending["dur"] = end0 - r.pending["ts"]
        r.g20 = end0
        for layer in reversed(range(0, LAYERS // 2)):  # backward, second half: overlaps bucket 0
            r.op_with_kernel("autograd::engine::evaluate_function: MmBackward0", GEMM, 165)
            r.op_with_kernel("autograd::engine::evaluate_function: MmBackward0", GEMM, 165)
        kernel, begin = r.allreduce_launch(1, r.g7)
        r.pending = kernel
        starts.append(begin)
    end1 = max(starts) + xfer_us[1]
    for r in ranks:
        r.pending["dur"] = end1 - r.pending["ts"]
        r.g20 = end1
        ts = r.cpu
        r.cpu += r.j(20)
        idx = len(r.events)
        r.cpu_op("Optimizer.step#AdamW.step", ts, 0)
        r.corr += 1
        wdur = r.j(4)
        r.emit({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamWaitEvent", "pid": r.pid, "tid": r.tid,
                "ts": r.cpu, "dur": wdur, "args": {"External id": r.ext, "cbid": 147, "correlation": r.corr}})
        r.cpu += wdur + r.j(3)
        r.launch(ADAM, r.j(110), not_before=end1)
        r.cpu += r.j(15)
        r.events[idx]["dur"] = r.cpu - ts
        r.corr += 1
        sync_end = max(r.cpu, r.g7) + r.j(6)
        r.emit({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": r.pid, "tid": r.tid,
                "ts": r.cpu, "dur": sync_end - r.cpu, "args": {"External id": r.ext, "cbid": 165,
                                                              "correlation": r.corr}})
        r.cpu = sync_end + r.j(8)
        r.events[r.step_idx]["dur"] = r.cpu - r.step_begin
        r.cpu += r.j(3)


def header(rank, world):
    d = {"schemaVersion": 1,
         "deviceProperties": [{"id": i, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045477376,
                               "computeMajor": 9, "computeMinor": 0, "maxThreadsPerBlock": 1024,
                               "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "warpSize": 32,
                               "sharedMemPerBlock": 49152, "numSms": 132, "sharedMemPerMultiprocessor": 233472}
                              for i in range(min(8, world))],
         "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world, "pg_count": 1,
                             "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                                            "pg_size": world, "ranks": list(range(world))}],
                             "nccl_version": "2.21.5"},
         "record_shapes": 0, "with_stack": 0, "with_modules": 0, "with_flops": 0,
         "cupti_version": 24, "cuda_runtime_version": 12040, "cuda_driver_version": 12040,
         "trace_id": f"{rank:016X}", "displayTimeUnit": "ms"}
    # Kineto's layout: the top-level keys one per line, then "traceEvents" with one event a line.
    lines = ["{"] + [f'  "{k}": {json.dumps(v)},' for k, v in d.items()] + ['  "traceEvents": [']
    return "\n".join(lines) + "\n"


def footer(r, first_ts, last_ts):
    meta = [
        {"name": "process_name", "ph": "M", "ts": first_ts, "pid": r.pid, "tid": 0, "args": {"name": "python3"}},
        {"name": "process_labels", "ph": "M", "ts": first_ts, "pid": r.pid, "tid": 0, "args": {"labels": "CPU"}},
        {"name": "process_name", "ph": "M", "ts": first_ts, "pid": r.dev, "tid": 0, "args": {"name": "python3"}},
        {"name": "process_labels", "ph": "M", "ts": first_ts, "pid": r.dev, "tid": 0,
         "args": {"labels": f"GPU {r.dev}"}},
        {"name": "thread_name", "ph": "M", "ts": first_ts, "pid": r.dev, "tid": COMPUTE_STREAM,
         "args": {"name": f"stream {COMPUTE_STREAM} "}},
        {"name": "thread_name", "ph": "M", "ts": first_ts, "pid": r.dev, "tid": COMM_STREAM,
         "args": {"name": f"stream {COMM_STREAM} "}},
        {"name": "thread_name", "ph": "M", "ts": first_ts, "pid": r.pid, "tid": r.tid,
         "args": {"name": f"thread {r.tid} (python3)"}},
        {"ph": "X", "cat": "Trace", "ts": first_ts - 50, "dur": last_ts - first_ts + 100, "pid": "Spans",
         "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)", "args": {"Op count": 0}},
    ]
    body = ",\n".join("  " + json.dumps(e) for e in meta)
    return body + "\n  ],\n" + f'  "traceName": "rank-{r.rank}.pt.trace.json"\n}}\n'


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--straggler-slowdown", type=float, default=1.25)
    ap.add_argument("--straggler-kind", choices=("host", "gpu"), default="host")
    ap.add_argument("--nccl-names", choices=("dev", "legacy"), default="dev")
    ap.add_argument("--first-step", type=int, default=1, help="number of the first ProfilerStep (default 1)")
    ap.add_argument("--level", type=int, default=3, help="gzip level (default 3)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    t0 = time.monotonic()
    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(a.seed)
    straggler = rng.randrange(a.ranks)
    global NCCL
    NCCL = NCCL_NAMES[a.nccl_names]
    gpu_slow = a.straggler_slowdown if a.straggler_kind == "gpu" else 1.0
    host_slow = 1 + 4 * (a.straggler_slowdown - 1) / 0.25 if a.straggler_kind == "host" else 1.0
    ranks = [Rank(i, a.ranks, random.Random(a.seed * 1000003 + i), gpu_slow if i == straggler else 1.0,
                  host_slow if i == straggler else 1.0) for i in range(a.ranks)]
    pg_ranks = "[" + ", ".join(str(i) for i in range(a.ranks)) + "]"
    files, raw, count, first = [], [0] * a.ranks, 0, [None] * a.ranks
    for r in ranks:
        r.pg_ranks = pg_ranks
        f = gzip.open(os.path.join(a.out, f"rank-{r.rank}.Dec_05_12_00_00.{r.pid}.pt.trace.json.gz"), "wt",
                      compresslevel=a.level)
        h = header(r.rank, a.ranks)
        f.write(h)
        raw[r.rank] += len(h)
        files.append(f)
    xrng = random.Random(a.seed + 17)
    for s in range(a.first_step, a.first_step + a.steps):
        # ring all-reduce of 48 / 32 MiB: ~2·size·(W−1)/W over ~180 GB/s busbw, plus latency growing with log W
        xfer = (int(2 * 50331648 / 180e3 * xrng.uniform(0.95, 1.1)) + 8 * a.ranks.bit_length(),
                int(2 * 33554432 / 180e3 * xrng.uniform(0.95, 1.1)) + 8 * a.ranks.bit_length())
        simulate_step(ranks, s, xfer)
        for r in ranks:
            if first[r.rank] is None:
                first[r.rank] = r.events[0]["ts"]
            text = "".join("  " + json.dumps(e) + ",\n" for e in r.events)
            files[r.rank].write(text)
            raw[r.rank] += len(text)
            count += len(r.events)
            r.events = []
    for r, f in zip(ranks, files):
        text = footer(r, first[r.rank], r.cpu)
        f.write(text)
        raw[r.rank] += len(text)
        f.close()
        count += 8
    print(f"ranks={a.ranks} steps={a.steps} straggler={straggler} kind={a.straggler_kind} nccl={a.nccl_names} "
          f"events={count} bytes={sum(raw)} "
          f"seconds={time.monotonic() - t0:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
