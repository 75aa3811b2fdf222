"""This rank's place in the job and the names of its process groups.

The TP x DP layout comes from `tpscope capture --tp T --dp D` (TPSCOPE_TP, TPSCOPE_DP; tensor-parallel groups are
consecutive ranks, as in tpscope-train and Megatron) or, under torchrun, from the same variables set by hand. A process
group is named as the engine names its communicators, because the analyses read the names (a `dp-*` group carries
reduced gradients, a `tp-*` group activations): the default group is `world`; a group whose ranks are TP block k is
`tp-k`; one whose ranks are DP stripe j is `dp-j`; any other `group-<ranks>`. Two distinct groups with the same
ranks get a suffix (`tp-0.1`), so their sequence numbers never mix.
"""

import os
import socket

import torch
import torch.distributed as dist

from . import _native
from ._native import kinds as K
from ._state import STATE


def _env_int(name, default):
    try:
        value = int(os.environ.get(name, ""))
        return value if value > 0 else default
    except ValueError:
        return default


def world():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ:  # srun without torchrun
        return _env_int("SLURM_PROCID", 0), _env_int("SLURM_NTASKS", 1)
    return _env_int("RANK", 0) if "RANK" in os.environ else 0, _env_int("WORLD_SIZE", 1)


def layout():
    """(tp, dp): from TPSCOPE_TP / TPSCOPE_DP, else TP = 1 and DP = the world size."""
    _, size = world()
    tp = _env_int("TPSCOPE_TP", 0)
    dp = _env_int("TPSCOPE_DP", 0)
    if tp and not dp and size % tp == 0:
        dp = size // tp
    if dp and not tp and size % dp == 0:
        tp = size // dp
    if not tp or not dp or tp * dp != size:
        tp, dp = 1, size
    return tp, dp


def describe():
    """Writes the rank's TP/DP coordinates, device and host into its ranks row (after init_process_group)."""
    rank, _ = world()
    tp, dp = layout()
    device = "cpu"
    if dist.is_initialized() and dist.get_backend() == "nccl" and torch.cuda.is_available():
        device = "cuda:%d" % torch.cuda.current_device()
    host = os.environ.get("TPSCOPE_HOSTNAME") or socket.gethostname()  # the recorder's own rule (docs/capture.md)
    _native.set_rank_info(rank % tp, tp, rank // tp, dp, device, host)
    if dist.is_initialized():
        name_of(dist.distributed_c10d._get_default_group())


class _Groups:
    def __init__(self):
        self._by_pg = {}   # id(pg) -> (pg, name, ranks): the pg is kept so its id is never reused
        self._taken = set()

    def name_of(self, pg):
        entry = self._by_pg.get(id(pg))
        if entry is not None:
            return entry[1], entry[2]
        name, ranks = self._classify(pg)
        base, n = name, 0
        while name in self._taken:
            n += 1
            name = "%s.%d" % (base, n)
        self._taken.add(name)
        self._by_pg[id(pg)] = (pg, name, ranks)
        try:
            backend = dist.get_backend(pg)
        except Exception:  # a group this rank is not a member of, or an older torch
            backend = ""
        _native.put_group(name, ranks, str(backend))
        return name, ranks

    @staticmethod
    def _classify(pg):
        default = dist.distributed_c10d._get_default_group()
        if pg is default:
            return "world", list(range(dist.get_world_size()))
        ranks = list(dist.get_process_group_ranks(pg))  # global ranks in group-rank order
        s = sorted(ranks)
        tp, dp = layout()
        if tp > 1 and len(s) == tp and s[0] % tp == 0 and s == list(range(s[0], s[0] + tp)):
            return "tp-%d" % (s[0] // tp), ranks
        if dp > 1 and len(s) == dp and s[0] < tp and s == [s[0] + i * tp for i in range(dp)]:
            return "dp-%d" % s[0], ranks
        return "group-" + "-".join(str(r) for r in s), ranks


_GROUPS = _Groups()
name_of = _GROUPS.name_of


def all_reduce_ints(values, op, callsite):
    """`values` (ints) reduced element-wise by `op` (a dist.ReduceOp) over the default group, as a collective tpscope
    itself issues (recorded at `callsite`, optimizer phase); `values` unchanged without a job of several ranks."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.int64, device="cuda" if dist.get_backend() == "nccl" else "cpu")
    STATE.callsite_override = (callsite, K.PHASE_OPTIMIZER)
    try:
        dist.all_reduce(t, op=op)
    finally:
        STATE.callsite_override = None
    return [int(v) for v in t.tolist()]
