"""meshrt's C API from Python (ctypes + NumPy): zero-copy all-reduce of NumPy arrays across
threads, and an all-gather into a tensor meshrt allocates, handed back through DLPack.

Usage: allreduce_numpy.py <path to libmeshrt.so>
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

API_VERSION = 1  # MESHRT_API_VERSION of include/meshrt/meshrt.h
NRANKS = 4
COUNT = 1 << 16
kDLCPU, kDLInt, kDLFloat = 1, 0, 2
MESHRT_SUM = 0


# DLPack's structs (dlpack.h), as ctypes sees them.
class DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int32), ("device_id", C.c_int32)]


class DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device", DLDevice), ("ndim", C.c_int32),
                ("dtype", DLDataType), ("shape", C.POINTER(C.c_int64)),
                ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)]


class DLManagedTensor(C.Structure):
    pass


DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", C.c_void_p),
                            ("deleter", C.CFUNCTYPE(None, C.POINTER(DLManagedTensor)))]


class UniqueId(C.Structure):
    _fields_ = [("internal", C.c_char * 64)]


class CommConfig(C.Structure):  # meshrt_comm_config_t, API version 1
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint), ("version", C.c_uint),
                ("timeout_s", C.c_double), ("init_timeout_s", C.c_double), ("debug", C.c_int),
                ("device_type", C.c_int), ("device_index", C.c_int), ("backend", C.c_char_p)]


def load(path):
    lib = C.CDLL(path)
    lib.meshrt_status_string.restype = C.c_char_p
    lib.meshrt_last_error.restype = C.c_char_p
    lib.meshrt_comm_init_rank.argtypes = [C.POINTER(C.c_void_p), C.c_int, UniqueId, C.c_int,
                                          C.POINTER(CommConfig)]
    lib.meshrt_tensor_from_dltensor.argtypes = [C.POINTER(DLTensor), C.POINTER(C.c_void_p)]
    lib.meshrt_tensor_empty.argtypes = [C.c_void_p, C.c_int, C.POINTER(C.c_int64), DLDataType,
                                        C.POINTER(C.c_void_p)]
    lib.meshrt_tensor_to_dlpack.argtypes = [C.c_void_p, C.POINTER(C.POINTER(DLManagedTensor))]
    for name in ("meshrt_all_reduce",):
        getattr(lib, name).argtypes = [C.c_void_p, C.c_void_p, C.c_void_p, C.c_int, C.c_void_p,
                                       C.POINTER(C.c_void_p)]
    lib.meshrt_all_gather.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p, C.c_void_p,
                                      C.POINTER(C.c_void_p)]
    for name in ("meshrt_event_synchronize", "meshrt_event_destroy", "meshrt_tensor_destroy",
                 "meshrt_comm_destroy"):
        getattr(lib, name).argtypes = [C.c_void_p]
    return lib


def check(lib, status, what):
    if status != 0:
        raise RuntimeError(f"{what}: {lib.meshrt_status_string(status).decode()}: "
                           f"{lib.meshrt_last_error().decode()}")


class Borrowed:
    """A DLTensor viewing a C-contiguous NumPy array (no copy); keep it alive while meshrt works."""

    def __init__(self, lib, arr):
        assert arr.flags["C_CONTIGUOUS"]
        self.arr = arr
        self.shape = (C.c_int64 * arr.ndim)(*arr.shape)
        code, bits = {np.dtype(np.float32): (kDLFloat, 32), np.dtype(np.int64): (kDLInt, 64),
                      np.dtype(np.int32): (kDLInt, 32)}[arr.dtype]
        self.dl = DLTensor(arr.ctypes.data, DLDevice(kDLCPU, 0), arr.ndim,
                           DLDataType(code, bits, 1), self.shape, None, 0)
        self.handle = C.c_void_p()
        check(lib, lib.meshrt_tensor_from_dltensor(C.byref(self.dl), C.byref(self.handle)),
              "meshrt_tensor_from_dltensor")


class Exported:
    """Hands a DLManagedTensor* to np.from_dlpack as a "dltensor" capsule (NumPy then owns it and
    calls its deleter, which frees through meshrt's allocator)."""

    def __init__(self, managed_ptr):
        new = C.pythonapi.PyCapsule_New
        new.restype = C.py_object
        new.argtypes = [C.c_void_p, C.c_char_p, C.c_void_p]
        self.capsule = new(C.cast(managed_ptr, C.c_void_p), b"dltensor", None)

    def __dlpack__(self, **kwargs):
        return self.capsule

    def __dlpack_device__(self):
        return (kDLCPU, 0)


def main():
    lib = load(sys.argv[1])
    check(lib, lib.meshrt_init(API_VERSION), "meshrt_init")
    uid = UniqueId()
    check(lib, lib.meshrt_get_unique_id(C.byref(uid)), "meshrt_get_unique_id")
    cfg = CommConfig(C.sizeof(CommConfig), 0x4D525443, API_VERSION, 60.0, 60.0, -1, 0, -1, None)
    arrays = [np.arange(COUNT, dtype=np.float32) % 100 + 1000 * r for r in range(NRANKS)]
    expected = sum(a.copy() for a in arrays)
    addresses = [a.ctypes.data for a in arrays]
    gathered = [None] * NRANKS
    errors = []

    def rank_main(rank):
        try:
            comm = C.c_void_p()
            check(lib, lib.meshrt_comm_init_rank(C.byref(comm), NRANKS, uid, rank, C.byref(cfg)),
                  "meshrt_comm_init_rank")
            x = Borrowed(lib, arrays[rank])
            ev = C.c_void_p()
            check(lib, lib.meshrt_all_reduce(comm, x.handle, x.handle, MESHRT_SUM, None,
                                             C.byref(ev)), "meshrt_all_reduce")
            check(lib, lib.meshrt_event_synchronize(ev), "meshrt_event_synchronize")
            lib.meshrt_event_destroy(ev)
            # all-gather each rank's id into a tensor meshrt allocates, exported via DLPack.
            mine = Borrowed(lib, np.array([rank * 10, rank * 10 + 1], dtype=np.int64))
            shape = (C.c_int64 * 1)(2 * NRANKS)
            out = C.c_void_p()
            check(lib, lib.meshrt_tensor_empty(comm, 1, shape, DLDataType(kDLInt, 64, 1),
                                               C.byref(out)), "meshrt_tensor_empty")
            check(lib, lib.meshrt_all_gather(comm, mine.handle, out, None, C.byref(ev)),
                  "meshrt_all_gather")
            check(lib, lib.meshrt_event_synchronize(ev), "meshrt_event_synchronize")
            lib.meshrt_event_destroy(ev)
            managed = C.POINTER(DLManagedTensor)()
            check(lib, lib.meshrt_tensor_to_dlpack(out, C.byref(managed)), "to_dlpack")
            gathered[rank] = np.from_dlpack(Exported(managed))
            for h in (x.handle, mine.handle, out):
                lib.meshrt_tensor_destroy(h)
            check(lib, lib.meshrt_comm_destroy(comm), "meshrt_comm_destroy")
        except Exception as e:  # reported by the main thread
            errors.append(f"rank {rank}: {e}")

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(NRANKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
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
