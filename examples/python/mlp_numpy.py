"""meshrt's sharded MLP block from Python (ctypes + NumPy): 2 threads form a tp=2 mesh with
sequence parallelism; each binds its shard of PyTorch-layout ([out, in], nn.Linear) NumPy weights
(MESHRT_WEIGHT_LAYOUT_OUT_IN: meshrt keeps a transposed copy), runs forward and backward on its
sequence shard, and the output, input gradient and fc1 weight gradient equal a NumPy reference.

Usage: mlp_numpy.py <path to libmeshrt.so>
Exits 77 (skipped) when NumPy is missing.
"""
import ctypes as C
import sys
import threading

try:
    import numpy as np
except ImportError as e:  # pragma: no cover
    print(f"SKIPPED: numpy is unavailable ({e}); run tools/install-deps.sh --python-venv")
    sys.exit(77)

from allreduce_numpy import Borrowed, CommConfig, DLDataType, check, kDLFloat

API_VERSION = 1  # MESHRT_API_VERSION of include/meshrt/meshrt.h
TP, SEQ, BATCH, HIDDEN, FFN = 2, 8, 2, 16, 40
LAYERNORM, GELU_TANH, OUT_IN = 0, 0, 1
FC1_WEIGHT = 2


class MlpConfig(C.Structure):  # meshrt_mlp_config_t, API version 1
    _fields_ = [("size", C.c_size_t), ("hidden", C.c_int64), ("ffn", C.c_int64),
                ("dtype", DLDataType), ("norm", C.c_int), ("eps", C.c_float), ("gelu", C.c_int),
                ("bias", C.c_int), ("sequence_parallel", C.c_int), ("weight_layout", C.c_int)]


class MlpParams(C.Structure):  # meshrt_mlp_params_t
    _fields_ = [("size", C.c_size_t)] + [(n, C.c_void_p) for n in (
        "norm_weight", "norm_bias", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias")]


def load(path):
    lib = C.CDLL(path)
    lib.meshrt_status_string.restype = C.c_char_p
    lib.meshrt_last_error.restype = C.c_char_p
    lib.meshrt_comm_init_all.argtypes = [C.POINTER(C.c_void_p), C.c_int, C.c_void_p,
                                         C.POINTER(CommConfig)]
    lib.meshrt_tensor_from_dltensor.argtypes = [C.c_void_p, C.POINTER(C.c_void_p)]
    lib.meshrt_mesh_create.argtypes = [C.POINTER(C.c_void_p), C.c_void_p, C.c_char_p]
    lib.meshrt_mlp_create.argtypes = [C.POINTER(C.c_void_p), C.c_void_p, C.POINTER(MlpConfig)]
    lib.meshrt_mlp_shard_info.argtypes = [C.c_void_p, C.c_int, C.POINTER(C.c_int64),
                                          C.POINTER(C.c_int64)]
    lib.meshrt_mlp_bind_weights.argtypes = [C.c_void_p, C.POINTER(MlpParams)]
    lib.meshrt_mlp_forward.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p, C.c_void_p,
                                       C.POINTER(C.c_void_p)]
    lib.meshrt_mlp_backward.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p,
                                        C.POINTER(MlpParams), C.c_void_p, C.POINTER(C.c_void_p)]
    for name in ("meshrt_event_synchronize", "meshrt_event_destroy", "meshrt_tensor_destroy",
                 "meshrt_comm_destroy", "meshrt_mesh_destroy", "meshrt_mlp_destroy"):
        getattr(lib, name).argtypes = [C.c_void_p]
    return lib


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
    lib = load(sys.argv[1])
    check(lib, lib.meshrt_init(API_VERSION), "meshrt_init")
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
    cfg = CommConfig(C.sizeof(CommConfig), 0x4D525443, API_VERSION, 60.0, 60.0, -1, 0, -1, None)
    comms = (C.c_void_p * TP)()
    check(lib, lib.meshrt_comm_init_all(comms, TP, None, C.byref(cfg)), "meshrt_comm_init_all")
    results, errors = {}, []

    def rank_main(rank):
        try:
            mesh, mlp = C.c_void_p(), C.c_void_p()
            check(lib, lib.meshrt_mesh_create(C.byref(mesh), comms[rank], f"tp={TP}".encode()),
                  "meshrt_mesh_create")
            mc = MlpConfig(C.sizeof(MlpConfig), HIDDEN, FFN, DLDataType(kDLFloat, 32, 1),
                           LAYERNORM, 1e-5, GELU_TANH, 1, 1, OUT_IN)
            check(lib, lib.meshrt_mlp_create(C.byref(mlp), mesh, C.byref(mc)), "meshrt_mlp_create")
            off, n = C.c_int64(), C.c_int64()
            check(lib, lib.meshrt_mlp_shard_info(mlp, FC1_WEIGHT, C.byref(off), C.byref(n)),
                  "meshrt_mlp_shard_info")
            cols = slice(off.value, off.value + n.value)
            # nn.Linear layout: fc1.weight [ffn, hidden] split by rows, fc2.weight [hidden, ffn]
            # by columns.
            shards = [full["gamma"], full["beta"], np.ascontiguousarray(full["w1"][cols]),
                      full["b1"][cols].copy(), np.ascontiguousarray(full["w2"][:, cols]),
                      full["b2"]]
            w = [Borrowed(lib, a) for a in shards]
            grads = [Borrowed(lib, np.zeros_like(a)) for a in shards]
            wp = MlpParams(C.sizeof(MlpParams), *[t.handle for t in w])
            gp = MlpParams(C.sizeof(MlpParams), *[t.handle for t in grads])
            check(lib, lib.meshrt_mlp_bind_weights(mlp, C.byref(wp)), "meshrt_mlp_bind_weights")
            s = slice(rank * SEQ // TP, (rank + 1) * SEQ // TP)  # sequence parallel: my shard
            xs, dys = Borrowed(lib, x[s].copy()), Borrowed(lib, dy[s].copy())
            ys, dxs = Borrowed(lib, np.empty_like(x[s])), Borrowed(lib, np.empty_like(x[s]))
            ev = C.c_void_p()
            check(lib, lib.meshrt_mlp_forward(mlp, xs.handle, ys.handle, None, C.byref(ev)),
                  "meshrt_mlp_forward")
            check(lib, lib.meshrt_event_synchronize(ev), "forward")
            lib.meshrt_event_destroy(ev)
            check(lib, lib.meshrt_mlp_backward(mlp, dys.handle, dxs.handle, C.byref(gp), None,
                                               C.byref(ev)), "meshrt_mlp_backward")
            check(lib, lib.meshrt_event_synchronize(ev), "backward")
            lib.meshrt_event_destroy(ev)
            results[rank] = (s, cols, ys.arr, dxs.arr, grads[2].arr)
            for t in w + grads + [xs, dys, ys, dxs]:
                lib.meshrt_tensor_destroy(t.handle)
            check(lib, lib.meshrt_mlp_destroy(mlp), "meshrt_mlp_destroy")
            check(lib, lib.meshrt_mesh_destroy(mesh), "meshrt_mesh_destroy")
        except Exception as e:  # reported by the main thread
            errors.append(f"rank {rank}: {e}")

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(TP)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in comms:
        lib.meshrt_comm_destroy(c)
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
