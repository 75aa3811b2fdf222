#!/usr/bin/env python3
"""Two ranks that train nothing: one all-reduce, then the process aborts (SIGABRT) — `--abort exit` after the
program returned (from an atexit handler, during the interpreter's shutdown, as PyTorch's Gloo threads sometimes do),
`--abort program` inside it, before it returns. Knows nothing of tpscope."""

import argparse
import atexit
import os

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--abort", choices=("exit", "program"), required=True)
    a = p.parse_args()
    dist.init_process_group("gloo")
    t = torch.ones(3) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    assert float(t[0]) == 3.0
    dist.destroy_process_group()
    if int(os.environ["RANK"]) == 1:
        if a.abort == "exit":
            atexit.register(os.abort)
        else:
            os.abort()


if __name__ == "__main__":
    main()
