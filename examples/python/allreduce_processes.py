"""meshrt from Python (the meshrt package) with one process per rank (as an engine's worker
processes or torchrun run them): the ranks meet over TCP on 127.0.0.1 (meshrt.Comm.init_tcp) and
all-reduce NumPy arrays in place through shared memory (the shm backend).

Usage: allreduce_processes.py <path to libmeshrt.so>
  starts NRANKS copies of itself (allreduce_processes.py <lib> --rank R --port P) and checks each.
Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set), each process is one rank and
meets the others on MASTER_ADDR:MASTER_PORT + 1 (MASTER_PORT is torch's own store):
  torchrun --standalone --nproc_per_node 2 allreduce_processes.py <path to libmeshrt.so>
Exits 77 (skipped) when NumPy is missing.
"""
import os
import socket
import subprocess
import sys

try:
    import numpy as np
except ImportError as e:  # pragma: no cover
    print(f"SKIPPED: numpy is unavailable ({e}); run tools/install-deps.sh --python-venv")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from use_meshrt import meshrt_for  # noqa: E402

NRANKS = 2
COUNT = 1 << 16


def rank_main(lib_path, rank, port, nranks=NRANKS, host="127.0.0.1"):
    meshrt = meshrt_for(lib_path)
    comm = meshrt.Comm.init_tcp(host, port, nranks, rank, timeout_s=60)
    x = np.arange(COUNT, dtype=np.float32) % 100 + 1000 * rank
    expected = sum(np.arange(COUNT, dtype=np.float32) % 100 + 1000 * r for r in range(nranks))
    comm.all_reduce(x)  # in place, through shared memory
    comm.destroy()
    ok = np.array_equal(x, expected)
    print(f"rank {rank} (pid {os.getpid()}): all_reduce in place, x[:3] = {x[:3].tolist()}, "
          f"matches numpy sum: {ok}")
    return 0 if ok else 1


def main():
    lib_path = sys.argv[1]
    env = os.environ
    if all(v in env for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):  # torchrun
        return rank_main(lib_path, int(env["RANK"]), int(env["MASTER_PORT"]) + 1,
                         int(env["WORLD_SIZE"]), env["MASTER_ADDR"])
    if len(sys.argv) == 6 and sys.argv[2] == "--rank" and sys.argv[4] == "--port":
        return rank_main(lib_path, int(sys.argv[3]), int(sys.argv[5]))
    with socket.socket() as s:  # a free port for rank 0 to listen on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, lib_path, "--rank", str(r), "--port",
                               str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for r in range(NRANKS)]
    ok = True
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += "\n(killed after 120 s)"
        print(out.rstrip())
        ok = ok and p.returncode == 0
    print(f"numpy {np.__version__}: {NRANKS} ranks as processes over TCP on 127.0.0.1")
    if not ok:
        print("FAILED")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
