#!/usr/bin/env python3
"""Every torch.distributed call a Gloo job can make, once each, on 2 ranks (collectives_test.py runs it under `tpscope
capture` and reads what was recorded), then the functional collectives (DTensor's API) with each form of group
argument they take: a (DeviceMesh, dim) pair, the mesh itself, a ProcessGroup and a group name. Knows nothing of
tpscope."""

import torch
import torch.distributed as dist
from torch.distributed import _functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    pair = dist.new_group([0, 1])
    t = torch.ones(4, 3) * (rank + 1)
    dist.all_reduce(t)                                             # world 1
    dist.all_reduce(t, group=pair, async_op=True).wait()           # tp-0 1 (TPSCOPE_TP=2)
    out = [torch.empty(4, 3) for _ in range(world)]
    dist.all_gather(out, t)                                        # world 2
    dist.broadcast(t, src=0)                                       # world 3
    dist.reduce(t, dst=0)                                          # world 4
    gathered = [torch.empty(4, 3) for _ in range(world)] if rank == 0 else None
    dist.gather(t, gathered, dst=0)                                # world 5
    chunk = torch.empty(4, 3)
    dist.scatter(chunk, [torch.ones(4, 3) * i for i in range(world)] if rank == 0 else None, src=0)  # world 6
    objects = [None] * world
    dist.all_gather_object(objects, {"rank": rank})                # world 7 (sizes), 8 (payload)
    if rank == 0:
        dist.send(torch.arange(5.0), dst=1)                        # world:p2p-0-1 1
        req = dist.isend(torch.arange(6.0), dst=1)                 # world:p2p-0-1 2
        req.wait()
    else:
        buf = torch.empty(5)
        dist.recv(buf, src=0)
        assert buf[4].item() == 4.0
        buf = torch.empty(6)
        dist.irecv(buf, src=0).wait()
        assert buf[5].item() == 5.0
    dist.barrier()                                                 # world 9
    assert objects[1 - rank] == {"rank": 1 - rank}

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    x = torch.ones(2, 2) * (rank + 1)
    total = sum(range(1, world + 1))
    for group in ((mesh, 0), (mesh, 0), mesh, pair, pair.group_name):  # the first two: the same pair twice
        y = funcol.all_reduce(x, "sum", group)                    # waited on by its first use
        assert float((y + 0)[0, 0]) == total, group
    g = funcol.all_gather_tensor(x, 0, (mesh, 0))
    assert list((g * 1).shape) == [2 * world, 2]
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
