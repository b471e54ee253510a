"""meshrt from Python with PyTorch tensors (the meshrt package, DLPack, zero copy): 2 ranks form a
tp=2 mesh, as 2 threads of this process or as 2 processes (one rank each, the shm backend). Each rank
  1. all-reduces a torch tensor in place through meshrt (meshrt writes torch's memory), and
  2. runs meshrt's sharded attention block on GPT-2-layout weights: Hugging Face's Conv1D
     `c_attn` weight [hidden, 3 hidden] with [Q | K | V] columns (MESHRT_WEIGHT_LAYOUT_IN_OUT +
     MESHRT_QKV_LAYOUT_BLOCKED) and `c_proj` [hidden, hidden]; each rank passes its heads' shard.
The output, the input gradient and the c_attn weight gradient equal PyTorch autograd on the full
weights (F.scaled_dot_product_attention, causal).

Tensors cross as DLPack capsules from `tensor.__dlpack__()` (meshrt.Comm, meshrt.Attn): meshrt
takes the DLManagedTensor (meshrt_tensor_from_dlpack) and calls torch's deleter when it lets go.

Usage: attn_torch.py <path to libmeshrt.so> [--processes]
  --processes: starts 2 copies of itself as torchrun would (RANK, WORLD_SIZE, MASTER_ADDR,
  MASTER_PORT), each one rank; or under torchrun itself:
  torchrun --standalone --nproc_per_node 2 attn_torch.py <path to libmeshrt.so>
  (the ranks meet over TCP on MASTER_ADDR:MASTER_PORT + 1, meshrt.Comm.init_tcp).
Exits 77 (skipped) when PyTorch is not installed.
"""
import os
import socket
import subprocess
import sys
import threading

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"SKIPPED: PyTorch is not installed ({e}); `pip install torch` to run this example")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from use_meshrt import meshrt_for  # noqa: E402

TP, SEQ, BATCH, HIDDEN, HEADS = 2, 8, 2, 32, 4


def reference(x, dy, p):
    """Full attention block with autograd: y, dx and the c_attn weight gradient."""
    x = x.clone().requires_grad_(True)
    w = {k: v.clone().requires_grad_(True) for k, v in p.items()}
    s, b, h = x.shape
    d = h // HEADS
    ln = F.layer_norm(x, (h,), w["gamma"], w["beta"], 1e-5)
    qkv = ln @ w["c_attn_w"] + w["c_attn_b"]  # Conv1D: [in, out]
    q, k, v = (t.reshape(s, b, HEADS, d).permute(1, 2, 0, 3) for t in qkv.split(h, dim=-1))
    # Causal softmax attention written out (F.scaled_dot_product_attention needs torch >= 2.0).
    scores = (q @ k.transpose(-2, -1)) / d ** 0.5
    later = torch.ones(s, s, dtype=torch.bool).triu(1)  # key j > query i: masked
    o = torch.softmax(scores.masked_fill(later, float("-inf")), dim=-1) @ v  # [b, heads, s, d]
    y = x + o.permute(2, 0, 1, 3).reshape(s, b, h) @ w["c_proj_w"] + w["c_proj_b"]
    y.backward(dy)
    return y.detach(), x.grad, w["c_attn_w"].grad


def problem():
    """The weights, input and output gradient (seeded: equal in every process) and torch's
    reference results."""
    torch.manual_seed(7)
    f64 = torch.float64
    full = {"gamma": 1 + 0.3 * torch.randn(HIDDEN, dtype=f64),
            "beta": 0.3 * torch.randn(HIDDEN, dtype=f64),
            "c_attn_w": 0.3 * torch.randn(HIDDEN, 3 * HIDDEN, dtype=f64),
            "c_attn_b": 0.3 * torch.randn(3 * HIDDEN, dtype=f64),
            "c_proj_w": 0.3 * torch.randn(HIDDEN, HIDDEN, dtype=f64),
            "c_proj_b": 0.3 * torch.randn(HIDDEN, dtype=f64)}
    x = torch.randn(SEQ, BATCH, HIDDEN, dtype=f64)
    dy = torch.randn(SEQ, BATCH, HIDDEN, dtype=f64)
    want = reference(x, dy, full)
    return {k: v.float() for k, v in full.items()}, x, dy, want


def rank_main(meshrt, comm, rank, full, x, dy):
    """One rank's all-reduce and attention block on communicator `comm` (a meshrt.Comm)."""
    # 1. In-place all-reduce of a torch tensor: meshrt writes torch's memory.
    t = torch.arange(4, dtype=torch.float32) + 100 * rank
    comm.all_reduce(t)
    # 2. The attention block on this rank's heads.
    mesh = meshrt.Mesh(comm, f"tp={TP}")
    attn = meshrt.Attn(mesh, HIDDEN, HEADS, causal=True, weight_layout="in_out",
                       qkv_layout="blocked")
    off, n = attn.shard_info("qkv_weight")
    d = HIDDEN // HEADS
    h0, hl = off // (3 * d), n // (3 * d)
    mine = slice(h0 * d, (h0 + hl) * d)  # my heads' features within each of Q, K, V
    qkv_cols = torch.cat([torch.arange(HIDDEN)[mine] + j * HIDDEN for j in range(3)])
    names = ("norm_weight", "norm_bias", "qkv_weight", "qkv_bias", "proj_weight", "proj_bias")
    shards = [full["gamma"], full["beta"], full["c_attn_w"][:, qkv_cols].contiguous(),
              full["c_attn_b"][qkv_cols].contiguous(),
              full["c_proj_w"][mine].contiguous(), full["c_proj_b"]]
    grads = [torch.zeros_like(a) for a in shards]
    attn.bind_weights(**dict(zip(names, shards)))
    xs, dys = x.float(), dy.float()
    ys, dxs = torch.empty_like(xs), torch.empty_like(xs)
    attn.forward(xs, ys)
    attn.backward(dys, dxs, **dict(zip(names, grads)))
    attn.destroy()
    mesh.destroy()
    return t.tolist(), qkv_cols, ys, dxs, grads[2]


def report(rank, result, want, ranks_as):
    """Prints rank's line against torch autograd; returns whether it matches."""
    want_y, want_dx, want_gw = want
    total, cols, y, dx, gw = result
    want_sum = [float(sum(i + 100 * r for r in range(TP))) for i in range(4)]
    err = max((y.double() - want_y).abs().max().item(),
              (dx.double() - want_dx).abs().max().item(),
              (gw.double() - want_gw[:, cols]).abs().max().item())
    ok = total == want_sum and err < 1e-4
    print(f"rank {rank} ({ranks_as}): all_reduce in place on a torch tensor: {total} "
          f"{'(as expected)' if total == want_sum else f'(expected {want_sum})'}; c_attn columns "
          f"{cols[0].item()}.. ({len(cols)} of {3 * HIDDEN}); y, dx, c_attn grad vs torch "
          f"autograd: max |diff| = {err:.1e}", flush=True)
    return ok


def header():
    print(f"torch {torch.__version__}: attention block, tp={TP}, x [{SEQ}, {BATCH}, {HIDDEN}], "
          f"{HEADS} heads, causal, GPT-2 Conv1D weights ([in, out], [Q|K|V])", flush=True)


def main_process(meshrt):
    """One rank of a torchrun-style launch: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT."""
    env = os.environ
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    if world != TP:
        print(f"this example runs {TP} ranks, not WORLD_SIZE={world}: use --nproc_per_node {TP}")
        return 2
    full, x, dy, want = problem()
    comm = meshrt.Comm.init_tcp(env["MASTER_ADDR"], int(env["MASTER_PORT"]) + 1, world, rank,
                                timeout_s=60)
    if rank == 0:
        header()
    ok = report(rank, rank_main(meshrt, comm, rank, full, x, dy), want, f"process {os.getpid()}")
    comm.destroy()
    return 0 if ok else 1


def spawn_processes():
    """Starts TP copies of this script as torchrun would and checks each."""
    with socket.socket() as s:  # a free port pair: torch's MASTER_PORT and meshrt's next one
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1] - 1
    procs = []
    for r in range(TP):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(TP), LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, __file__, sys.argv[1]], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    ok = True
    for p in procs:
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += "\n(killed after 120 s)"
        print(out.rstrip())
        ok = ok and p.returncode == 0
    print(f"{TP} ranks as processes over TCP on 127.0.0.1")
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


def main():
    if len(sys.argv) == 3 and sys.argv[2] == "--processes":
        return spawn_processes()
    meshrt = meshrt_for(sys.argv[1])
    if all(v in os.environ for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return main_process(meshrt)
    full, x, dy, want = problem()
    comms = meshrt.Comm.init_threads(TP, timeout_s=60)
    results, errors = {}, []

    def thread_main(rank):
        try:
            results[rank] = rank_main(meshrt, comms[rank], rank, full, x, dy)
        except Exception as e:  # reported by the main thread
            errors.append(f"rank {rank}: {e}")

    threads = [threading.Thread(target=thread_main, args=(r,)) for r in range(TP)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in comms:
        c.destroy()
    if errors:
        print("\n".join(errors))
        return 1
    header()
    ok = all([report(r, results[r], want, "thread") for r in range(TP)])
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
