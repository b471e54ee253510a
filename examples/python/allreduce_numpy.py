"""meshrt from Python (the meshrt package, DLPack + NumPy): zero-copy all-reduce of NumPy arrays
across threads, and an all-gather into a tensor meshrt allocates, handed to NumPy through DLPack.

Usage: allreduce_numpy.py <path to libmeshrt.so>
Exits 77 (skipped) when NumPy is missing.
"""
import os
import sys
import threading

try:
    import numpy as np
except ImportError as e:  # pragma: no cover
    print(f"SKIPPED: numpy is unavailable ({e}); run tools/install-deps.sh --python-venv")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from use_meshrt import meshrt_for  # noqa: E402

NRANKS = 4
COUNT = 1 << 16


def main():
    meshrt = meshrt_for(sys.argv[1])
    comms = meshrt.Comm.init_threads(NRANKS, timeout_s=60)
    arrays = [np.arange(COUNT, dtype=np.float32) % 100 + 1000 * r for r in range(NRANKS)]
    expected = sum(a.copy() for a in arrays)
    addresses = [a.ctypes.data for a in arrays]
    gathered = [None] * NRANKS
    errors = []

    def rank_main(rank):
        try:
            comm = comms[rank]
            comm.all_reduce(arrays[rank])  # in place: meshrt writes the array's own memory
            # all-gather each rank's id into memory meshrt allocates, taken over by NumPy.
            out = comm.empty((2 * NRANKS,), "int64")
            comm.all_gather(np.array([rank * 10, rank * 10 + 1], dtype=np.int64), out)
            gathered[rank] = np.from_dlpack(out)
        except Exception as e:  # reported by the main thread
            errors.append(f"rank {rank}: {e}")

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(NRANKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in comms:
        c.destroy()
    if errors:
        print("\n".join(errors))
        return 1
    same = all(a.ctypes.data == p for a, p in zip(arrays, addresses))
    ok = all(np.array_equal(a, expected) for a in arrays)
    want_g = np.array([v for r in range(NRANKS) for v in (r * 10, r * 10 + 1)], dtype=np.int64)
    ok_g = all(np.array_equal(g, want_g) for g in gathered)
    print(f"numpy {np.__version__}: {NRANKS} ranks as threads, {COUNT} float32 each")
    print(f"all_reduce in place on the numpy arrays (zero copy: {same}): "
          f"x[:4] = {arrays[0][:4].tolist()} matches numpy sum: {ok}")
    print(f"all_gather into meshrt memory, back via np.from_dlpack: {gathered[0].tolist()} "
          f"matches: {ok_g}")
    if not (same and ok and ok_g):
        print("FAILED")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
