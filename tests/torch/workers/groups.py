"""Subgroups and a 2-D DeviceMesh on the "meshrt" backend (under torchrun, 4 processes):
new_group, new_subgroups and init_device_mesh("cpu", (2, 2)); each group's all-reduce and
all-gather against the values it must give. Prints "OK" on success, then the process's thread
count before init_process_group and after destroy_process_group."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import meshrt.torch  # noqa: F401

from worker_report import report


def expect(got, want, what):
    if not torch.equal(got, want):
        raise AssertionError(f"rank {dist.get_rank()}: {what}: {got.tolist()} != {want.tolist()}")


def threads():
    return len(os.listdir("/proc/self/task"))


def main():
    before = threads()
    dist.init_process_group("meshrt")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 4, "groups.py runs on 4 processes"
    evens, odds = dist.new_group([0, 2]), dist.new_group([1, 3])
    mine, members = (evens, [0, 2]) if rank % 2 == 0 else (odds, [1, 3])
    x = torch.full((5,), float(rank))
    dist.all_reduce(x, group=mine)
    expect(x, torch.full((5,), float(sum(members))), "new_group all_reduce")
    sub, _ = dist.new_subgroups(group_size=2)  # [0, 1] and [2, 3]
    y = torch.tensor([rank], dtype=torch.int64)
    out = torch.zeros(2, dtype=torch.int64)
    dist.all_gather_into_tensor(out, y, group=sub)
    base = rank - rank % 2
    expect(out, torch.tensor([base, base + 1]), "new_subgroups all_gather")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    for dim in ("dp", "tp"):
        g = mesh[dim].get_group()
        peers = dist.get_process_group_ranks(g)
        z = torch.tensor([float(rank)])
        dist.all_reduce(z, group=g)
        expect(z, torch.tensor([float(sum(peers))]), f"mesh dim {dim} all_reduce")
        w = torch.zeros(2)
        dist.reduce_scatter_tensor(w[:1], torch.tensor([1.0, 2.0]) * (rank + 1), group=g)
        k = dist.get_rank(g)
        expect(w[:1], torch.tensor([float(k + 1) * sum(r + 1 for r in peers)]), f"mesh {dim} rs")
    dist.destroy_process_group()
    report(f"rank {rank}: OK")
    report(f"rank {rank}: threads {before} -> {threads()}")


if __name__ == "__main__":
    main()
