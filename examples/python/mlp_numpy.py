"""meshrt's sharded MLP block from Python (the meshrt package + NumPy, DLPack): 2 threads form a
tp=2 mesh with
sequence parallelism; each binds its shard of PyTorch-layout ([out, in], nn.Linear) NumPy weights
(MESHRT_WEIGHT_LAYOUT_OUT_IN: meshrt keeps a transposed copy), runs forward and backward on its
sequence shard, and the output, input gradient and fc1 weight gradient equal a NumPy reference.

Usage: mlp_numpy.py <path to libmeshrt.so>
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

TP, SEQ, BATCH, HIDDEN, FFN = 2, 8, 2, 16, 40


def gelu(h):
    k = np.sqrt(2 / np.pi)
    t = np.tanh(k * (h + 0.044715 * h**3))
    return 0.5 * h * (1 + t), 0.5 * (1 + t) + 0.5 * h * (1 - t * t) * k * (1 + 3 * 0.044715 * h * h)


def reference(x, dy, p):
    """NumPy forward and backward (float64), PyTorch layout: y = x @ W.T + b."""
    mu = x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    n = (x - mu) * rstd
    ln = n * p["gamma"] + p["beta"]
    h = ln @ p["w1"].T + p["b1"]
    g, dg = gelu(h)
    y = x + g @ p["w2"].T + p["b2"]
    dh = (dy @ p["w2"]) * dg
    gw1 = np.einsum("sbf,sbh->fh", dh, ln)  # [ffn, hidden], as nn.Linear's weight
    dn = (dh @ p["w1"]) * p["gamma"]
    dx = rstd * (dn - dn.mean(-1, keepdims=True) - n * (dn * n).mean(-1, keepdims=True)) + dy
    return y, dx, gw1


def main():
    meshrt = meshrt_for(sys.argv[1])
    rng = np.random.default_rng(7)
    f32 = np.float32
    full = {"gamma": 1 + 0.3 * rng.standard_normal(HIDDEN),
            "beta": 0.3 * rng.standard_normal(HIDDEN),
            "w1": 0.3 * rng.standard_normal((FFN, HIDDEN)), "b1": 0.3 * rng.standard_normal(FFN),
            "w2": 0.3 * rng.standard_normal((HIDDEN, FFN)), "b2": 0.3 * rng.standard_normal(HIDDEN)}
    full = {k: v.astype(f32) for k, v in full.items()}
    x = rng.standard_normal((SEQ, BATCH, HIDDEN)).astype(f32)
    dy = rng.standard_normal((SEQ, BATCH, HIDDEN)).astype(f32)
    want_y, want_dx, want_gw1 = reference(x.astype(np.float64), dy.astype(np.float64),
                                          {k: v.astype(np.float64) for k, v in full.items()})
    comms = meshrt.Comm.init_threads(TP, timeout_s=60)
    results, errors = {}, []

    def rank_main(rank):
        try:
            mesh = meshrt.Mesh(comms[rank], f"tp={TP}")
            mlp = meshrt.Mlp(mesh, HIDDEN, FFN, sequence_parallel=True, weight_layout="out_in")
            off, n = mlp.shard_info("fc1_weight")
            cols = slice(off, off + n)
            # nn.Linear layout: fc1.weight [ffn, hidden] split by rows, fc2.weight [hidden, ffn]
            # by columns.
            names = ("norm_weight", "norm_bias", "fc1_weight", "fc1_bias", "fc2_weight",
                     "fc2_bias")
            shards = [full["gamma"], full["beta"], np.ascontiguousarray(full["w1"][cols]),
                      full["b1"][cols].copy(), np.ascontiguousarray(full["w2"][:, cols]),
                      full["b2"]]
            grads = [np.zeros_like(a) for a in shards]
            mlp.bind_weights(**dict(zip(names, shards)))
            s = slice(rank * SEQ // TP, (rank + 1) * SEQ // TP)  # sequence parallel: my shard
            xs, dys = x[s].copy(), dy[s].copy()
            ys, dxs = np.empty_like(xs), np.empty_like(xs)
            mlp.forward(xs, ys)
            mlp.backward(dys, dxs, **dict(zip(names, grads)))
            results[rank] = (s, cols, ys, dxs, grads[2])
            mlp.destroy()
            mesh.destroy()
        except Exception as e:  # reported by the main thread
            errors.append(f"rank {rank}: {e}")

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(TP)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in comms:
        c.destroy()
    if errors:
        print("\n".join(errors))
        return 1
    ok = True
    print(f"numpy {np.__version__}: MLP block, tp={TP} with sequence parallel, x [{SEQ}, {BATCH}, "
          f"{HIDDEN}], ffn {FFN}, nn.Linear weights (OUT_IN)")
    for rank in range(TP):
        s, cols, y, dx, gw1 = results[rank]
        err = max(np.abs(y - want_y[s]).max(), np.abs(dx - want_dx[s]).max(),
                  np.abs(gw1 - want_gw1[cols]).max())
        ok = ok and err < 1e-4
        print(f"rank {rank}: sequence rows [{s.start}, {s.stop}), fc1.weight rows "
              f"[{cols.start}, {cols.stop}); y, dx, fc1 grad vs numpy: max |diff| = {err:.1e}")
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
