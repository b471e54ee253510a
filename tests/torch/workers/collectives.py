"""Every collective of the "meshrt" backend against gloo's result on the same inputs (under
torchrun): op x dtype x sizes (0, 1, odd, larger), sync and async, views and non-contiguous
tensors, then (--big) every data path at 64 MiB, sync and async. Inputs are small integers, so
sums and products are exact in every dtype; averages are compared within rounding. Prints
"OK <n> checks" on success.
--nodes K: the ranks stand for K nodes (MESHRT_NODE_ID, set per rank before the backend starts)
and report the meshrt backend they run on.
Usage: torchrun --nproc_per_node N collectives.py [--big] [--nodes K]
"""
import os
import sys

import torch
import torch.distributed as dist

import meshrt.torch  # registers "meshrt"

from worker_report import report


DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64]
SIZES = [0, 1, 7, 1000]
checks = 0


def inp(rank, n, dtype, salt=0):
    g = torch.Generator().manual_seed(1000 * rank + 7 * n + salt)
    lo = 1 if dtype.is_floating_point else 0
    return torch.randint(lo, 4, (n,), generator=g).to(dtype)


def same(a, b, what, exact=True):
    global checks
    checks += 1
    if exact:
        ok = torch.equal(a, b)
    else:
        ok = torch.allclose(a.double(), b.double(), rtol=1e-2 if a.element_size() == 2 else 1e-6)
    if not ok:
        raise AssertionError(f"rank {dist.get_rank()}: {what}: meshrt {a[:8].tolist()} != gloo "
                             f"{b[:8].tolist()}")


def run_both(fn, gloo):
    """fn(group, async_op) -> tensors; on meshrt (sync and async) and on gloo."""
    ref = fn(gloo, False)
    return fn(None, False), fn(None, True), ref


def wait(work, async_op):
    if async_op:
        assert work is not None
        fut = work.get_future()
        work.wait()
        fut.wait()
        assert work.is_completed()


def check_all_reduce(rank, world, gloo):
    for dtype in DTYPES:
        ops = [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT]
        if not dtype.is_floating_point:
            ops += [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]
        for n in SIZES:
            for op in ops:
                def fn(g, a, op=op, n=n, dtype=dtype):
                    x = inp(rank, n, dtype)
                    wait(dist.all_reduce(x, op=op, group=g, async_op=a), a)
                    return x
                m, ma, ref = run_both(fn, gloo)
                same(m, ref, f"all_reduce {op} {dtype} n={n}")
                same(ma, ref, f"async all_reduce {op} {dtype} n={n}")
            if dtype.is_floating_point:  # AVG and PREMUL_SUM (gloo has neither): SUM / world
                x = inp(rank, n, dtype)
                dist.all_reduce(x, op=dist.ReduceOp.AVG)
                s = inp(rank, n, dtype)
                dist.all_reduce(s, group=gloo)
                same(x, (s.double() / world).to(dtype), f"all_reduce AVG {dtype} n={n}", False)
                y = inp(rank, n, dtype)
                dist.all_reduce(y, op=dist._make_nccl_premul_sum(0.5))
                same(y, (s.double() * 0.5).to(dtype), f"all_reduce PREMUL_SUM {dtype}", False)


def check_views(rank, world, gloo):
    # gloo reduces a strided view as if it were contiguous (wrong elements): these compare with
    # the definition, computed here from every rank's input.
    for make in (lambda t: t.view(6, 5).t(), lambda t: t[::2], lambda t: t.view(5, 6)[1:4, 2:5]):
        a = inp(rank, 30, torch.float32)
        dist.all_reduce(make(a))
        want = inp(rank, 30, torch.float32)
        make(want).copy_(sum(make(inp(r, 30, torch.float32)) for r in range(world)))
        same(a, want, "all_reduce of a view")
    # a non-contiguous output and a non-contiguous input
    base = torch.zeros(3, world * 2)
    dist.all_gather_into_tensor(base.t(), inp(rank, 6, torch.float32).view(3, 2).t())
    want = torch.cat([inp(r, 6, torch.float32).view(3, 2).t() for r in range(world)])
    same(base.t(), want, "all_gather_into_tensor of views")


def check_movement(rank, world, gloo):
    for dtype in DTYPES + [torch.float64, torch.uint8, torch.bool]:
        for n in SIZES:
            def bcast(g, a, dtype=dtype, n=n):
                x = inp(rank, n, torch.int64, 1).to(dtype)
                wait(dist.broadcast(x, src=world - 1, group=g, async_op=a), a)
                return x

            def gather_list(g, a, dtype=dtype, n=n):
                outs = [torch.zeros(n, dtype=dtype) for _ in range(world)]
                wait(dist.all_gather(outs, inp(rank, n, torch.int64).to(dtype), group=g,
                                     async_op=a), a)
                return torch.cat(outs)

            def gather_tensor(g, a, dtype=dtype, n=n):
                out = torch.zeros(world * n, dtype=dtype)
                wait(dist.all_gather_into_tensor(out, inp(rank, n, torch.int64).to(dtype),
                                                 group=g, async_op=a), a)
                return out

            def a2a_single(g, a, dtype=dtype, n=n):
                x = inp(rank, n * world, torch.int64).to(dtype)
                out = torch.zeros(n * world, dtype=dtype)
                wait(dist.all_to_all_single(out, x, group=g, async_op=a), a)
                return out

            for fn in (bcast, gather_list, gather_tensor, a2a_single):
                m, ma, ref = run_both(fn, gloo)
                same(m, ref, f"{fn.__name__} {dtype} n={n}")
                same(ma, ref, f"async {fn.__name__} {dtype} n={n}")


def check_reduce_family(rank, world, gloo):
    for dtype in DTYPES:
        for n in SIZES:
            def red(g, a, dtype=dtype, n=n):
                x = inp(rank, n, dtype)
                wait(dist.reduce(x, dst=0, group=g, async_op=a), a)
                return x if rank == 0 else torch.zeros(0)

            def rs_tensor(g, a, dtype=dtype, n=n):
                out = torch.zeros(n, dtype=dtype)
                wait(dist.reduce_scatter_tensor(out, inp(rank, n * world, dtype), group=g,
                                                async_op=a), a)
                return out

            def rs_list(g, a, dtype=dtype, n=n):
                out = torch.zeros(n, dtype=dtype)
                ins = list(inp(rank, n * world, dtype).chunk(world)) if n else \
                    [torch.zeros(0, dtype=dtype) for _ in range(world)]
                wait(dist.reduce_scatter(out, ins, group=g, async_op=a), a)
                return out

            def rs_max(g, a, dtype=dtype, n=n):
                out = torch.zeros(n, dtype=dtype)
                wait(dist.reduce_scatter_tensor(out, inp(rank, n * world, dtype),
                                                op=dist.ReduceOp.MAX, group=g, async_op=a), a)
                return out

            fns = [red, rs_tensor, rs_max]
            if dtype != torch.bfloat16:  # gloo's list reduce_scatter lacks bf16
                fns.append(rs_list)
            for fn in fns:
                m, ma, ref = run_both(fn, gloo)
                same(m, ref, f"{fn.__name__} {dtype} n={n}")
                same(ma, ref, f"async {fn.__name__} {dtype} n={n}")


def check_rest(rank, world, gloo):
    # uneven all_to_all_single: rank r sends r + j + 1 rows to rank j
    ins = [rank + j + 1 for j in range(world)]
    outs = [j + rank + 1 for j in range(world)]
    x = torch.arange(sum(ins) * 3, dtype=torch.float32).view(-1, 3) + 100 * rank
    res = []
    for g in (None, gloo):
        out = torch.zeros(sum(outs), 3)
        dist.all_to_all_single(out, x, outs, ins, group=g)
        res.append(out)
    same(res[0], res[1], "all_to_all_single uneven")
    # all_to_all (list), uneven sizes: gloo has none on CPU, so against the definition
    xs = [torch.full((rank + j + 1,), float(10 * rank + j)) for j in range(world)]
    ys = [torch.zeros(j + rank + 1) for j in range(world)]
    dist.all_to_all(ys, xs)
    for j in range(world):
        same(ys[j], torch.full((j + rank + 1,), float(10 * j + rank)), "all_to_all list")
    # gather / scatter
    got = [torch.zeros(5) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.full((5,), float(rank)), got, dst=0)
    if rank == 0:
        same(torch.stack(got), torch.arange(world).float().repeat_interleave(5).view(world, 5),
             "gather")
    out = torch.zeros(4)
    src = [torch.full((4,), float(j * j)) for j in range(world)] if rank == world - 1 else None
    dist.scatter(out, src, src=world - 1)
    same(out, torch.full((4,), float(rank * rank)), "scatter")
    # send / recv in a ring, and the async forms
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    buf = torch.zeros(9, dtype=torch.int64)
    reqs = [dist.isend(torch.arange(9) + rank, nxt), dist.irecv(buf, prv)]
    for r in reqs:
        r.wait()
    same(buf, torch.arange(9) + prv, "isend/irecv ring")
    ops = [dist.P2POp(dist.isend, torch.ones(3) * rank, nxt),
           dist.P2POp(dist.irecv, buf2 := torch.zeros(3), prv)]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    same(buf2, torch.ones(3) * prv, "batch_isend_irecv")
    dist.barrier()
    # a sync call (run inline when the stream is idle) behind an async one it depends on: it
    # queues behind it, never overtakes it
    x = torch.ones(1000)
    w = dist.all_reduce(x, async_op=True)
    dist.all_reduce(x)
    w.wait()
    same(x, torch.full((1000,), float(world * world)), "sync all_reduce behind an async one")
    # coalesced forms
    a = [inp(rank, 5, torch.float32), inp(rank, 3, torch.float32, 2)]
    b = [t.clone() for t in a]
    dist.all_reduce_coalesced(a)
    dist.all_reduce_coalesced(b, group=gloo)
    same(torch.cat(a), torch.cat(b), "all_reduce_coalesced")
    outs = [torch.zeros(world * 4), torch.zeros(world * 2)]
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_gather_into_tensor(outs[0], inp(rank, 4, torch.float32))
        dist.all_gather_into_tensor(outs[1], inp(rank, 2, torch.float32))
    cm.wait()
    same(outs[0], torch.cat([inp(r, 4, torch.float32) for r in range(world)]),
         "all_gather_into_tensor coalesced")
    rs = [torch.zeros(3), torch.zeros(2)]
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.reduce_scatter_tensor(rs[0], inp(rank, 3 * world, torch.float32))
        dist.reduce_scatter_tensor(rs[1], inp(rank, 2 * world, torch.float32))
    cm.wait()
    full = sum(inp(r, 3 * world, torch.float32) for r in range(world))
    same(rs[0], full[3 * rank:3 * rank + 3], "reduce_scatter_tensor coalesced")


def check_big(rank, world, gloo):
    """64 MiB (the largest buffer of each call): every data path once, sync and async."""
    n = (64 << 20) // 4
    base = torch.arange(n, dtype=torch.float32) % 251 + rank

    def all_reduce(g, a):
        x = base.clone()
        wait(dist.all_reduce(x, group=g, async_op=a), a)
        return x

    def all_gather(g, a):
        out = torch.zeros(n)
        wait(dist.all_gather_into_tensor(out, base[:n // world], group=g, async_op=a), a)
        return out

    def reduce_scatter(g, a):
        out = torch.zeros(n // world)
        wait(dist.reduce_scatter_tensor(out, base, group=g, async_op=a), a)
        return out

    def all_to_all(g, a):
        out = torch.zeros(n)
        wait(dist.all_to_all_single(out, base, group=g, async_op=a), a)
        return out

    def broadcast(g, a):
        x = base.clone()
        wait(dist.broadcast(x, src=0, group=g, async_op=a), a)
        return x

    for fn in (all_reduce, all_gather, reduce_scatter, all_to_all, broadcast):
        m, ma, ref = run_both(fn, gloo)
        same(m, ref, f"{fn.__name__} 64 MiB")
        same(ma, ref, f"async {fn.__name__} 64 MiB")


def main():
    if "--nodes" in sys.argv:
        nodes = int(sys.argv[sys.argv.index("--nodes") + 1])
        r, w = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        os.environ["MESHRT_NODE_ID"] = str(r * nodes // w)
    dist.init_process_group("meshrt")
    rank, world = dist.get_rank(), dist.get_world_size()
    if "--nodes" in sys.argv:
        report(f"rank {rank}: meshrt backend {meshrt.torch.collective_backend()}")
    gloo = dist.new_group(backend="gloo")
    for f in (check_all_reduce, check_views, check_movement, check_reduce_family, check_rest):
        f(rank, world, gloo)
    if "--big" in sys.argv:
        check_big(rank, world, gloo)
    dist.destroy_process_group()
    report(f"rank {rank}: OK {checks} checks")


if __name__ == "__main__":
    main()
