"""CUDA tensors on the "meshrt" backend (meshrt's NCCL communicator, torch's current stream),
under torchrun with one GPU per rank (cuda:LOCAL_RANK): every collective on a side stream and on
the default one, sync and async, against the same collective of CPU copies on the group's CPU
communicator. Prints "rank <r>: OK <n> checks".
Usage: torchrun --nproc_per_node N cuda_collectives.py   (N <= the GPU count)
Not named cuda.py: this folder is on sys.path, and torch imports a top-level module "cuda".
"""
import os

import torch
import torch.distributed as dist

import meshrt.torch  # noqa: F401  registers "meshrt" for cpu and cuda

from worker_report import report

checks = 0


def same(a, b, what):
    global checks
    checks += 1
    a = a.cpu()
    if not torch.equal(a, b):
        raise AssertionError(f"rank {dist.get_rank()}: {what}: cuda {a[:8].tolist()} != cpu "
                             f"{b[:8].tolist()}")


def inp(rank, n, dtype, salt=0):
    g = torch.Generator().manual_seed(1000 * rank + 7 * n + salt)
    return torch.randint(0, 4, (n,), generator=g).to(dtype)


def run(rank, world, dev, async_op):
    """Each collective on dev (enqueued on torch's current stream) and on CPU copies."""
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for n in (0, 1, 7, 1000):
            cases = {
                "all_reduce": lambda x, o: dist.all_reduce(x, async_op=async_op),
                "broadcast": lambda x, o: dist.broadcast(x, src=world - 1, async_op=async_op),
                "all_gather_into_tensor": lambda x, o: dist.all_gather_into_tensor(
                    o, x, async_op=async_op),
                "reduce_scatter_tensor": lambda x, o: dist.reduce_scatter_tensor(
                    o, x, async_op=async_op),
                "all_to_all_single": lambda x, o: dist.all_to_all_single(o, x,
                                                                         async_op=async_op),
            }
            for name, fn in cases.items():
                x = inp(rank, n * world, dtype)
                out_n = {"all_gather_into_tensor": n * world * world,
                         "reduce_scatter_tensor": n, "all_to_all_single": n * world}.get(name, 0)
                xc, oc = x.clone(), torch.zeros(out_n, dtype=dtype)
                xg, og = x.to(dev), torch.zeros(out_n, dtype=dtype, device=dev)
                w = fn(xg, og)
                if async_op:
                    w.wait()
                fn(xc, oc)  # the CPU communicator (sync)
                got = og if out_n else xg
                same(got, oc if out_n else xc, f"{name} {dtype} n={n} async={async_op}")


def main():
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("meshrt")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", local)
    run(rank, world, dev, False)
    side = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(side):  # the collectives follow torch's current stream
        run(rank, world, dev, True)
    torch.cuda.synchronize()
    # send / recv of CUDA tensors: refused with one line
    try:
        dist.send(torch.zeros(1, device=dev), (rank + 1) % world) if world > 1 else None
        refused = "not refused" if world > 1 else "skipped"
    except Exception as e:  # noqa: BLE001
        refused = str(e).strip().splitlines()[0]
    dist.destroy_process_group()
    report(f"rank {rank}: OK {checks} checks; send: {refused}")


if __name__ == "__main__":
    main()
