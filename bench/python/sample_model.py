"""samples/python/tp_train.py's model in one benchmark process (one rank, TP = 1, a world of one over Gloo), shared
by the in-process Python benchmarks.

split_argv(argv): (the benchmark's own arguments, the model's: those after "--", or DEFAULT_MODEL).
build(model_args): initialises the one-rank process group and returns (tp_train's parsed arguments, the model).
train_step(margs, model, optimizer, step): one training step on tp_train's step-th batch; returns the loss.
"""
import datetime
import os
import socket
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "samples", "python"))

DEFAULT_MODEL = ["--layers", "4", "--hidden", "256", "--heads", "8", "--seq", "64", "--batch", "8"]


def split_argv(argv):
    if "--" not in argv:
        return argv, list(DEFAULT_MODEL)
    return argv[:argv.index("--")], argv[argv.index("--") + 1:]


def build(model_args):
    import torch
    import torch.distributed as dist
    import tp_train

    torch.set_num_threads(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    sample = tp_train.argparse.ArgumentParser()
    for name, default in (("--layers", 2), ("--hidden", 128), ("--heads", 4), ("--seq", 32), ("--batch", 8),
                          ("--vocab", 256), ("--seed", 1234)):
        sample.add_argument(name, type=int, default=default)
    margs = sample.parse_args(model_args)
    return margs, tp_train.TinyGPT(margs, 1, dist.new_group([0]), {})


def train_step(margs, model, optimizer, step):
    """One step as a training loop takes it: forward, loss, backward, optimizer step, the loss read back."""
    import torch.nn.functional as F
    import tp_train

    tokens, targets = tp_train.batch(margs, 0, step)
    loss = F.cross_entropy(model(tokens).reshape(-1, margs.vocab), targets.reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()
