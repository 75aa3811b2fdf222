"""Every torch.distributed collective and point-to-point call, recorded as a flight-recorder record.

The choke point is `ProcessGroup` itself: the functional API (`dist.all_reduce(t, group=g, async_op=...)`,
`all_gather`, `reduce_scatter`, `broadcast`, `barrier`, `send`/`recv`, `isend`/`irecv`, ...) and code that calls a
group's methods directly both end in one of its methods, so each call is recorded exactly once, whatever path led
there. Each record carries the group (named by _rank), a per-group sequence number (1-based, identical on every
member that issues the same calls), the logical op, dtype, shape and bytes of the input, the call site in model terms
("layers.1.mlp.fc2 forward all-reduce"), and enqueue (= start: c10d enqueues and starts in one call) and completion
times. The returned Work is wrapped so that its wait() — which the functional API calls for a synchronous op, and the
program for async_op=True — records the completion and a Comm span for the time the thread was blocked, as the C++
Communicator does.

Point-to-point calls are recorded in a two-member group per pair, `<group>:p2p-<lo>-<hi>`, with op `send_recv` on
both sides (the call site says which way), so the send and the receive of one message share (group, seq).

DDP's bucketed gradient all-reduces are issued by its C++ Reducer; _ddp routes them through a communication hook so
they pass here. PyTorch 2.x's functional collectives (DTensor, torch.distributed.tensor.parallel) dispatch as ops
without reaching a ProcessGroup method: _funcol records them, numbered in the same per-group sequence.
recv_anysource (no known peer) is not recorded.
"""

import os

import torch
import torch.distributed as dist

from . import _native, _opcheck, _rank
from . import _state  # noqa: F401 (it hands STATE to _native, which callsite_id reads)
from ._native import kinds as K

# ProcessGroup method -> (logical op, index of the positional argument holding the input tensors; None: no payload)
_COLLECTIVES = {
    "allreduce": ("all_reduce", 0),
    "allreduce_coalesced": ("all_reduce", 0),
    "broadcast": ("broadcast", 0),
    "reduce": ("reduce", 0),
    "allgather": ("all_gather", 1),
    "_allgather_base": ("all_gather", 1),
    "allgather_coalesced": ("all_gather", 1),
    # PyTorch 2.x's single-tensor and coalesced forms (what all_gather_object, DTensor and FSDP2 call)
    "all_gather_single": ("all_gather", 1),
    "all_gather_single_coalesced": ("all_gather", 1),
    "allgather_into_tensor_coalesced": ("all_gather", 1),
    "gather": ("gather", 1),
    "gather_into_tensor": ("gather", 1),
    "gather_single": ("gather", 1),
    "scatter": ("scatter", 0),
    "reduce_scatter": ("reduce_scatter", 1),
    "_reduce_scatter_base": ("reduce_scatter", 1),
    "reduce_scatter_single": ("reduce_scatter", 1),
    "reduce_scatter_single_coalesced": ("reduce_scatter", 1),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", 1),
    "alltoall": ("all_to_all", 1),
    "alltoall_base": ("all_to_all", 1),
    "all_to_all_single": ("all_to_all", 1),
    "barrier": ("barrier", None),
    "monitored_barrier": ("barrier", None),
}
_P2P = {"send": "send to", "recv": "recv from"}
_DISPLAY = {"all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
            "all_to_all": "all-to-all", "send_recv": "send/recv"}

_comm_sites = {}   # (op, phase) -> site id of the blocked-in-collective span
FAILURES = []      # (group, seq, op, state) of collectives that timed out or failed, for tpscope.run's exit status

_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.dirname(__file__)
_native.set_foreign_dirs([_TORCH_DIR, _OWN_DIR])  # program_frame passes over their code


_Issue = _native.Issue  # (handle, group, seq, op, layer, phase) and done: one recorded collective, until it ended


_dtype_names = {}  # torch.dtype -> "float32", ...


def _dtype(t):
    dtype = t.dtype
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = str(dtype).replace("torch.", "")
    return name


def _payload(x):
    """(dtype, shape, bytes) of a call's input: a tensor; a list of tensors (the first one's dtype and shape, the
    bytes of all); or a list of such lists (reduce_scatter's inputs: shape [n, *chunk])."""
    if isinstance(x, torch.Tensor):
        return _dtype(x), list(x.shape), x.nbytes
    if isinstance(x, (list, tuple)) and x:
        first = x[0]
        if isinstance(first, torch.Tensor):
            if len(x) == 1:
                return _payload(first)
            return _dtype(first), list(first.shape), sum(t.numel() * t.element_size() for t in x)
        if isinstance(first, (list, tuple)) and first and isinstance(first[0], torch.Tensor):
            return (_dtype(first[0]), [len(first)] + list(first[0].shape),
                    sum(t.numel() * t.element_size() for t in first))
    return "none", [], 0


_group_ids = {}     # tpscope group name -> the recorder's group id (a name's ranks never change: _rank names them)
_text_ids = {}      # op or call-site text -> the recorder's text id


def display(op):
    """How a call site names logical op OP ("all-reduce")."""
    return _DISPLAY.get(op, op)


def _text_id(text):
    """The recorder's id of an op or call-site text (interned once)."""
    i = _text_ids.get(text)
    if i is None:
        i = _text_ids[text] = _native.intern_text(text)
    return i


def group_id(group, ranks):
    """The recorder's id of tpscope group `group` (its global ranks), whose sequence numbers it keeps."""
    i = _group_ids.get(group)
    if i is None:
        i = _group_ids[group] = _native.collective_group(group, list(ranks))
    return i


# (call-site text id, layer, phase) of a call issued now whose call site ends in `what`: STATE.callsite_override's
# text, else the module running (STATE.where()) or, outside every module, the program's own line (the innermost frame
# outside torch and tpscope) — "layers.1.mlp.fc2 forward all-reduce", "train.py:88 optimizer all-reduce". In C, where
# the functional collectives' wrappers ask it too (python/src/funcol_fastpath.cpp), texts kept by their parts.
callsite_id = _native.callsite_id


def named(pg):
    """(tpscope name, recorder group id) of ProcessGroup `pg`."""
    name, ranks = _rank.name_of(pg)
    return name, group_id(name, ranks)


def _issue_collective(pg, op, args, arg_index):
    payload = args[arg_index] if arg_index is not None and len(args) > arg_index else None
    return issue_in_group(*named(pg), op, payload)


def issue_in_group(group, gid, op, payload, ticks=0, what=None):
    """Records the enqueue of collective `op` in tpscope group `group` (its id: group_id) on input `payload` (a
    tensor, a list of them, or None), at `ticks` (_native.ticks(); 0: now), its call site ending in `what` (the op's
    display name unless given); returns its _Issue."""
    if payload is not None and not isinstance(payload, torch.Tensor):
        payload = _payload(payload)  # a list of tensors: described here, (dtype name, shape, bytes)
    cid, layer, phase = callsite_id(what or display(op))
    handle, seq = _native.collective_issue(gid, _text_id(op), cid, layer, phase, payload, ticks)
    return _Issue(handle, group, seq, op, layer, phase)


def _issue_p2p(pg, direction, args):
    group, _ = _rank.name_of(pg)
    me = dist.get_rank()
    peer = args[1]
    if pg is not dist.distributed_c10d._get_default_group():
        peer = dist.distributed_c10d._get_global_rank(pg, peer)
    lo, hi = min(me, peer), max(me, peer)
    pair = "%s:p2p-%d-%d" % (group, lo, hi)
    return issue_in_group(pair, group_id(pair, [lo, hi]), "send_recv", args[0], what="%s rank %d" % (direction, peer))


def _fail(issue, exc):
    text = str(exc).lower()
    state = K.STATE_TIMED_OUT if ("timed out" in text or "timeout" in text) else K.STATE_FAILED
    issue.done = True
    _native.collective_state(issue.handle, state)
    _native.flush()
    FAILURES.append((issue.group, issue.seq, issue.op, state))


def _comm_site(op, phase):
    key = (op, phase)
    site = _comm_sites.get(key)
    if site is None:
        site = _comm_sites[key] = _native.site(op, K.SPAN_COMM, phase, "comm")
    return site


def waited(issue, t0):
    """A wait on `issue` that blocked the thread since `t0` returned: its Comm span and its completion."""
    issue.done = True
    _native.collective_waited(issue.handle, _comm_site(issue.op, issue.phase), t0, issue.layer)


class RecordedWork:
    """A c10d Work whose wait() records the completion (and the time blocked in it). Everything else is the Work's."""

    __slots__ = ("_work", "_issue")

    def __init__(self, work, issue):
        self._work = work
        self._issue = issue

    def wait(self, *args, **kwargs):
        issue = self._issue
        t0 = _native.ticks()
        try:
            with _opcheck.inside_collective():
                result = self._work.wait(*args, **kwargs)
        except BaseException as e:
            if not issue.done:
                _fail(issue, e)
            raise
        if not issue.done:
            waited(issue, t0)
        return result

    def get_future(self):
        """The Work's future, with the completion recorded when it completes: code that chains on the future (DDP's
        communication hooks, `fut.then(...)`) never calls wait()."""
        fut = self._work.get_future()
        issue = self._issue
        if not issue.done:
            fut.add_done_callback(lambda f: _future_done(issue, f))
        return fut

    def __getattr__(self, name):
        return getattr(self._work, name)


def _future_done(issue, fut):
    """Runs on the thread that completes the future (a backend thread): the state only, no span, as no thread of the
    program was blocked in it."""
    if issue.done:
        return
    try:
        fut.wait()
    except BaseException as e:  # the future holds the collective's error
        _fail(issue, e)
        return
    issue.done = True
    _native.collective_state(issue.handle, K.STATE_COMPLETED)


def unwrap(work):
    return work._work if isinstance(work, RecordedWork) else work


def _wrap(original, issue):
    def recorded(self, *args, **kwargs):
        if not _native.recording():
            return original(self, *args, **kwargs)
        record = issue(self, args)
        try:
            with _opcheck.inside_collective():
                work = original(self, *args, **kwargs)
        except BaseException as e:
            _fail(record, e)
            raise
        _opcheck.handed_over((args, kwargs))  # the op check (trace-ops, the step replay): a peer's values land here
        return RecordedWork(work, record)

    recorded.__tpscope_original__ = original
    recorded.__name__ = getattr(original, "__name__", "recorded")
    recorded.__doc__ = getattr(original, "__doc__", None)
    return recorded


def install():
    """Wraps the ProcessGroup methods (once per process)."""
    pg_class = torch._C._distributed_c10d.ProcessGroup
    for method, (op, arg_index) in _COLLECTIVES.items():
        original = getattr(pg_class, method, None)
        if original is None or hasattr(original, "__tpscope_original__"):
            continue
        setattr(pg_class, method,
                _wrap(original, lambda pg, args, op=op, i=arg_index: _issue_collective(pg, op, args, i)))
    for method, direction in _P2P.items():
        original = getattr(pg_class, method, None)
        if original is None or hasattr(original, "__tpscope_original__"):
            continue
        setattr(pg_class, method, _wrap(original, lambda pg, args, d=direction: _issue_p2p(pg, d, args)))
    end = getattr(pg_class, "_end_coalescing", None)
    if end is not None and not hasattr(end, "__tpscope_original__"):
        def end_coalescing(self, reqs, *args, **kwargs):
            return end(self, [unwrap(r) for r in reqs], *args, **kwargs)
        end_coalescing.__tpscope_original__ = end
        setattr(pg_class, "_end_coalescing", end_coalescing)
