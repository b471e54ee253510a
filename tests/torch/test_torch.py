"""meshrt's torch.distributed backend under real torchrun (2, 3 and 4 processes): collectives
against gloo, subgroups and a 2-D DeviceMesh, DDP / FSDP2 / DTensor TP losses against gloo's,
a SIGKILLed rank, refused dtypes and ops. Run through tests/torch/run.sh (ctest label torch)."""
import glob
import json
import os
import socket
import subprocess
import sys
import tempfile

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (tools/install-deps.sh)")

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "workers")


def env():
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "1")
    return e


def torchrun(n, script, *args, timeout=240, extra_env=None):
    """Runs script on n processes under torchrun; returns the lines the ranks report (their
    rank<r>.txt files, rank by rank: never their interleaved output)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={n}", os.path.join(WORKERS, script), *args]
        e = env()
        e["MESHRT_TORCH_TEST_OUT"] = tmp
        e.update(extra_env or {})
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)
        out = p.stdout + p.stderr
        assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{out[-6000:]}"
        lines = []
        for r in range(n):
            path = os.path.join(tmp, f"rank{r}.txt")
            if os.path.exists(path):
                with open(path) as f:
                    lines += f.read().splitlines()
        return lines


def segments():
    return set(glob.glob("/dev/shm/meshrt-*"))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_collectives_against_gloo(n):
    before = segments()
    lines = torchrun(n, "collectives.py", *(["--big"] if n == 2 else []))
    assert [ln.split(":")[0] for ln in lines if ": OK " in ln] == [f"rank {r}" for r in range(n)]
    assert segments() - before == set(), "meshrt left shared-memory segments behind"


def test_two_simulated_nodes_run_hier_against_gloo():
    # MESHRT_NODE_ID = rank // 2: two nodes of two ranks, so the backend bootstrapped over torch's
    # store runs in two levels (hier: shm in each node, TCP between them).
    before = segments()
    lines = torchrun(4, "collectives.py", "--nodes", "2")
    assert [ln for ln in lines if "meshrt backend" in ln] == [
        f"rank {r}: meshrt backend hier" for r in range(4)]
    assert [ln.split(":")[0] for ln in lines if ": OK " in ln] == [f"rank {r}" for r in range(4)]
    assert segments() - before == set(), "meshrt left shared-memory segments behind"


def test_subgroups_and_device_mesh():
    # MESHRT_FLIGHT=0: without the flight recorder's process-wide signal thread (docs/faults.md),
    # destroy_process_group leaves the thread count where it was before init_process_group.
    lines = torchrun(4, "groups.py", extra_env={"MESHRT_FLIGHT": "0"})
    oks = [ln for ln in lines if ln.endswith(": OK")]
    assert oks == [f"rank {r}: OK" for r in range(4)], lines
    assert sum(": threads " in ln for ln in lines) == 4, lines
    for ln in lines:
        if ": threads " in ln:
            before, after = ln.split(": threads ")[1].split(" -> ")
            assert before == after, ln


def losses(n, backend, mode):
    lines = [ln for ln in torchrun(n, "train.py", backend, mode) if ln.startswith("LOSSES ")]
    assert len(lines) == 1, lines
    return json.loads(lines[0][len("LOSSES "):])


@pytest.mark.parametrize("n,mode", [(2, "ddp"), (2, "fsdp"), (4, "tp")])
def test_training_losses_equal_gloo(n, mode):
    ours, ref = losses(n, "meshrt", mode), losses(n, "gloo", mode)
    assert len(ours) == len(ref) == 20
    for step, (a, b) in enumerate(zip(ours, ref)):
        assert abs(a - b) <= 1e-6 * abs(b), f"{mode} step {step}: meshrt {a} gloo {b}"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigkilled_rank_raises_naming_it():
    n, timeout = 3, 10
    port = free_port()
    before = segments()
    procs = []
    for r in range(n):
        e = env()
        e.update(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, os.path.join(WORKERS, "faults.py"),
                                       "kill", str(timeout)], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert procs[-1].returncode == -9
    for r in range(n - 1):
        assert procs[r].returncode == 0, outs[r][-3000:]
        line = [ln for ln in outs[r].splitlines() if ln.startswith("RAISED ")]
        assert line, outs[r][-3000:]
        seconds = float(line[0].split()[1])
        assert seconds <= timeout + 5, line[0]
        assert f"rank {r}" in line[0] and "all_reduce" in line[0], line[0]
        assert f"rank {n - 1} (pid {procs[-1].pid}) is gone" in line[0], line[0]
    assert segments() - before == set(), "meshrt left shared-memory segments behind"


def test_file_store_rendezvous():
    # init_method="file://...": torch's FileStore carries the rendezvous; no torchrun, no port.
    n = 2
    with tempfile.TemporaryDirectory() as tmp:
        e = env()
        for v in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
            e.pop(v, None)
        e.pop("MESHRT_TORCH_TEST_OUT", None)  # each rank's own stdout: its one line
        procs = [subprocess.Popen([sys.executable, os.path.join(WORKERS, "rendezvous.py"),
                                   os.path.join(tmp, "store"), str(r), str(n)], env=e,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(n)]
        outs = [p.communicate(timeout=120)[0] for p in procs]
        for r, p in enumerate(procs):
            assert p.returncode == 0, outs[r][-3000:]
            assert f"rank {r}: OK 3" in outs[r].splitlines(), outs[r][-3000:]


def test_refused_dtypes_and_ops_say_so():
    lines = torchrun(2, "faults.py", "refused")
    refused = [ln for ln in lines if ln.startswith("REFUSED ")]
    assert len(refused) == 10 and len(lines) == 10, lines
    text = "\n".join(refused)
    assert "meshrt: rank 0: all_reduce: all_reduce SUM of float64 is not supported" in text
    assert "all_reduce SUM of int16 is not supported" in text
    assert "all_reduce BAND of float32 is not supported (bitwise ops take integer tensors)" in text
    assert "reduce_scatter_tensor SUM of int8 is not supported" in text
    assert "receiving from any source is not supported" in text


def test_timeout_raises_on_wait_naming_the_missing_rank():
    # init_process_group(timeout=4 s): rank 2 sleeps instead of joining an async all-reduce.
    lines = torchrun(3, "faults.py", "stall", "4")
    raised = [ln for ln in lines if ln.startswith("RAISED ")]
    assert len(raised) == 2 and "SLEPT" in lines, lines
    for r, line in enumerate(raised):
        assert 3.5 <= float(line.split()[1]) <= 12, line
        assert f"meshrt: rank {r}: all_reduce failed (timeout)" in line, line
        assert "did not complete within 4 s" in line and "likely culprit: rank 2" in line, line


def test_cuda_tensors_on_current_stream():
    # Runs only where a GPU is: torch cannot make a CUDA tensor elsewhere. The CUDA path is
    # compiled wherever torch and meshrt both have CUDA (bindings/torch/CMakeLists.txt).
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (torch.cuda.is_available() is False): the backend's CUDA "
                    "path is compiled but not run here")
    from meshrt import _torch_backend
    assert _torch_backend.cuda_built(), "meshrt.torch was built without CUDA on a GPU machine"
    n = min(torch.cuda.device_count(), 2)
    lines = torchrun(n, "cuda_collectives.py")
    oks = [ln for ln in lines if ": OK " in ln]
    assert [ln.split(":")[0] for ln in oks] == [f"rank {r}" for r in range(n)], lines
    for ln in oks:
        if n > 1:
            assert "send of CUDA tensors is not supported by meshrt.torch" in ln, ln


def test_attn_block_on_a_cp_mesh_equals_the_whole_sequence():
    """meshrt.Attn on a cp=2 mesh of 2 thread ranks, each passing its causal load-balance shard
    (chunks r and 3-r of 4): the output and the input gradient, put back in order, equal one
    rank's block over the whole sequence, for cp_comm "ring" and "allgather"; another cp_comm is
    refused naming the choices."""
    import threading

    import torch

    import meshrt

    hidden, heads, seq, batch = 16, 2, 8, 2
    g = torch.Generator().manual_seed(3)
    w = {"norm_weight": 1 + 0.3 * torch.randn(hidden, generator=g),
         "norm_bias": 0.3 * torch.randn(hidden, generator=g),
         "qkv_weight": 0.3 * torch.randn(hidden, 3 * hidden, generator=g),
         "qkv_bias": 0.3 * torch.randn(3 * hidden, generator=g),
         "proj_weight": 0.3 * torch.randn(hidden, hidden, generator=g),
         "proj_bias": 0.3 * torch.randn(hidden, generator=g)}
    x = torch.randn(seq, batch, hidden, generator=g)
    dy = torch.randn(seq, batch, hidden, generator=g)
    n = seq // 4

    def rows(r):  # rank r's positions: chunks r and 3 - r
        return torch.cat([torch.arange(c * n, (c + 1) * n) for c in (r, 3 - r)])

    def block(comm, spec, xs, dys, **kw):
        mesh = meshrt.Mesh(comm, spec)
        attn = meshrt.Attn(mesh, hidden, heads, **kw)
        attn.bind_weights(**w)
        y, dx = torch.empty_like(xs), torch.empty_like(xs)
        grads = {k: torch.zeros_like(v) for k, v in w.items()}
        attn.forward(xs, y)
        attn.backward(dys, dx, **grads)
        attn.destroy()
        mesh.destroy()
        return y, dx

    (one,) = meshrt.Comm.init_threads(1, timeout_s=60)
    want_y, want_dx = block(one, "dp=1", x, dy)
    with pytest.raises(ValueError, match=r"cp_comm 'p2p' is not one of \['allgather', 'ring'\]"):
        meshrt.Attn(meshrt.Mesh(one, "dp=1"), hidden, heads, cp_comm="p2p")
    one.destroy()
    for how in ("ring", "allgather"):
        comms = meshrt.Comm.init_threads(2, timeout_s=60)
        got, errors = {}, []

        def rank_main(r):
            try:
                idx = rows(r)
                got[r] = block(comms[r], "cp=2", x[idx].contiguous(), dy[idx].contiguous(),
                               cp_comm=how)
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(f"rank {r}: {e}")

        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for c in comms:
            c.destroy()
        assert not errors, errors
        y, dx = torch.empty_like(x), torch.empty_like(x)
        for r in range(2):
            y[rows(r)], dx[rows(r)] = got[r]
        assert (y - want_y).abs().max().item() < 1e-5, how
        assert (dx - want_dx).abs().max().item() < 1e-5, how
