"""init_process_group("meshrt", init_method="file://...") without torchrun: the backend meets
through torch's FileStore (no MASTER_ADDR / MASTER_PORT). Each rank all-reduces once and
reports "rank <r>: OK <sum>".
Usage: rendezvous.py <file path> <rank> <world size>
"""
import sys

import torch
import torch.distributed as dist

import meshrt.torch  # noqa: F401

from worker_report import report


def main():
    path, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    dist.init_process_group("meshrt", init_method=f"file://{path}", rank=rank, world_size=world)
    x = torch.full((5,), float(rank + 1))
    dist.all_reduce(x)
    dist.destroy_process_group()
    report(f"rank {rank}: OK {x[0].item():g}")


if __name__ == "__main__":
    main()
