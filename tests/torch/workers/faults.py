"""Failure behaviour of the "meshrt" backend. Modes:
  kill     every rank all-reduces once, then the last rank SIGKILLs itself and the others
           all-reduce again: they must raise within the process group's timeout, naming a rank;
           each survivor prints "RAISED <seconds> <message>".
  stall    the last rank sleeps past the timeout instead of joining an async all-reduce: the
           others' Work.wait() must raise within the timeout; each prints "RAISED <s> <message>".
  refused  a refused dtype / op raises one clear line; prints "REFUSED <message>" per case.
Started with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun or tests/torch/test_torch.py).
Usage: faults.py <mode> [timeout seconds]
"""
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import meshrt.torch  # noqa: F401

from worker_report import report


def kill(timeout):
    dist.init_process_group("meshrt", timeout=datetime.timedelta(seconds=timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.ones(1000)
    dist.all_reduce(x)
    assert x[0].item() == world
    if rank == world - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        for _ in range(1000):
            dist.all_reduce(x)
    except Exception as e:  # noqa: BLE001
        msg = str(e).strip().splitlines()[0]
        print(f"RAISED {time.monotonic() - t0:.1f} {type(e).__name__}: {msg}", flush=True)
        os._exit(0)
    print("NOT RAISED", flush=True)
    os._exit(1)


def stall(timeout):
    dist.init_process_group("meshrt", timeout=datetime.timedelta(seconds=timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.ones(10)
    dist.all_reduce(x)
    if rank == world - 1:
        time.sleep(timeout + 8)
        report("SLEPT")
        os._exit(0)
    t0 = time.monotonic()
    work = dist.all_reduce(x, async_op=True)
    try:
        work.wait()
        report("NOT RAISED")
    except Exception as e:  # noqa: BLE001
        msg = str(e).strip().splitlines()[0]
        report(f"RAISED {time.monotonic() - t0:.1f} {type(e).__name__}: {msg}")
    os._exit(0)


def refused():
    dist.init_process_group("meshrt")
    cases = [
        lambda: dist.all_reduce(torch.ones(3, dtype=torch.float64)),
        lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16)),
        lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND),
        lambda: dist.reduce_scatter_tensor(torch.zeros(1, dtype=torch.int8),
                                           torch.zeros(dist.get_world_size(), dtype=torch.int8)),
        lambda: dist.recv(torch.zeros(1)),
    ]
    for case in cases:
        try:
            case()
            report("ACCEPTED")
        except Exception as e:  # noqa: BLE001
            report("REFUSED " + str(e).strip().splitlines()[0])
    dist.barrier()  # the group still works after refusals
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "kill":
        kill(float(sys.argv[2]) if len(sys.argv) > 2 else 10.0)
    elif sys.argv[1] == "stall":
        stall(float(sys.argv[2]) if len(sys.argv) > 2 else 4.0)
    else:
        refused()
