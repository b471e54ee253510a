"""libmeshrt.so's C API (include/meshrt/meshrt.h) through ctypes, with tensors passed as DLPack
capsules (``obj.__dlpack__()``): meshrt takes each capsule's tensor and uses its memory in place.
"""
import contextlib
import ctypes as C
import glob
import os

API_VERSION = 1
_OPS = {"sum": 0, "avg": 1, "max": 2, "min": 3}
# DLPack dtype codes (kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4) and bits, by name.
_DTYPES = {"float32": (2, 32), "bfloat16": (4, 16), "float16": (2, 16), "int32": (0, 32),
           "int64": (0, 64), "uint8": (1, 8)}


class _DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class MeshrtError(RuntimeError):
    """A failed meshrt call: the message is meshrt's own (what failed, the values, what to do)."""


class _CommConfig(C.Structure):
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint), ("version", C.c_uint),
                ("timeout_s", C.c_double), ("init_timeout_s", C.c_double), ("debug", C.c_int),
                ("device_type", C.c_int), ("device_index", C.c_int), ("backend", C.c_char_p)]


def library_path():
    """libmeshrt.so of this package (next to this file; the wheel holds it under its SONAME,
    libmeshrt.so.<major>.<minor>), or MESHRT_LIBRARY when set."""
    env = os.environ.get("MESHRT_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    names = ["libmeshrt.so"] + sorted(glob.glob(os.path.join(here, "libmeshrt.so.*")), key=len)
    for name in names:
        path = os.path.join(here, name)
        if os.path.exists(path):
            return path
    return os.path.join(here, "libmeshrt.so")


_lib = None


def _load():
    global _lib
    if _lib is not None:
        return _lib
    path = library_path()
    try:
        lib = C.CDLL(path)
    except OSError as e:
        raise MeshrtError(f"meshrt: cannot load {path}: {e} (set MESHRT_LIBRARY to libmeshrt.so)")
    lib.meshrt_last_error.restype = C.c_char_p
    lib.meshrt_status_string.restype = C.c_char_p
    for name in ("meshrt_all_reduce", "meshrt_reduce_scatter"):
        getattr(lib, name).argtypes = [C.c_void_p, C.c_void_p, C.c_void_p, C.c_int, C.c_void_p,
                                       C.POINTER(C.c_void_p)]
    for name in ("meshrt_all_gather", "meshrt_all_to_all"):
        getattr(lib, name).argtypes = [C.c_void_p, C.c_void_p, C.c_void_p, C.c_void_p,
                                       C.POINTER(C.c_void_p)]
    lib.meshrt_broadcast.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p, C.c_int, C.c_void_p,
                                     C.POINTER(C.c_void_p)]
    lib.meshrt_barrier.argtypes = [C.c_void_p, C.c_void_p, C.POINTER(C.c_void_p)]
    lib.meshrt_comm_init_tcp.argtypes = [C.POINTER(C.c_void_p), C.c_char_p, C.c_int, C.c_int,
                                         C.c_int, C.POINTER(_CommConfig)]
    lib.meshrt_comm_init_all.argtypes = [C.POINTER(C.c_void_p), C.c_int, C.c_void_p,
                                         C.POINTER(_CommConfig)]
    for name in ("meshrt_comm_destroy", "meshrt_tensor_destroy", "meshrt_event_synchronize",
                 "meshrt_event_destroy"):
        getattr(lib, name).argtypes = [C.c_void_p]
    for name in ("meshrt_comm_rank", "meshrt_comm_size"):
        getattr(lib, name).argtypes = [C.c_void_p, C.POINTER(C.c_int)]
    lib.meshrt_tensor_from_dlpack.argtypes = [C.c_void_p, C.POINTER(C.c_void_p)]
    lib.meshrt_tensor_empty.argtypes = [C.c_void_p, C.c_int, C.POINTER(C.c_int64), _DLDataType,
                                        C.POINTER(C.c_void_p)]
    lib.meshrt_tensor_to_dlpack.argtypes = [C.c_void_p, C.POINTER(C.c_void_p)]
    C.pythonapi.PyCapsule_New.restype = C.py_object
    C.pythonapi.PyCapsule_New.argtypes = [C.c_void_p, C.c_char_p, C.c_void_p]
    C.pythonapi.PyCapsule_GetPointer.restype = C.c_void_p
    C.pythonapi.PyCapsule_GetPointer.argtypes = [C.py_object, C.c_char_p]
    C.pythonapi.PyCapsule_SetName.argtypes = [C.py_object, C.c_char_p]
    C.pythonapi.PyCapsule_IsValid.argtypes = [C.py_object, C.c_char_p]
    _check(lib, lib.meshrt_init(API_VERSION), "meshrt_init")
    _lib = lib
    return lib


def _check(lib, status, what):
    if status != 0:
        msg = lib.meshrt_last_error().decode(errors="replace")
        kind = lib.meshrt_status_string(status).decode()
        raise MeshrtError(f"meshrt: {what} failed ({kind}): {msg}")


def version():
    """libmeshrt.so's version as (major, minor, patch)."""
    lib = _load()
    v = [C.c_int(), C.c_int(), C.c_int()]
    _check(lib, lib.meshrt_get_version(*[C.byref(x) for x in v]), "meshrt_get_version")
    return tuple(x.value for x in v)


def _tensor(lib, obj, what):
    """(owned, handle): a meshrt tensor handle over obj's memory (obj.__dlpack__()); meshrt owns
    the capsule's tensor from then on and releases it once the handle (`owned`, which the caller
    destroys) and its work are done. A Buffer passes its own handle (owned None)."""
    if isinstance(obj, Buffer):
        if obj._h is None:
            raise MeshrtError(f"meshrt: {what}: this Buffer was handed over through DLPack")
        return None, obj._h
    if not hasattr(obj, "__dlpack__"):
        raise TypeError(f"meshrt: {what}: {type(obj).__name__} has no __dlpack__ "
                        "(pass a NumPy array, a torch tensor or another DLPack tensor)")
    cap = obj.__dlpack__()
    if not C.pythonapi.PyCapsule_IsValid(cap, b"dltensor"):
        raise TypeError(f"meshrt: {what}: __dlpack__ did not return a 'dltensor' capsule")
    ptr = C.pythonapi.PyCapsule_GetPointer(cap, b"dltensor")
    handle = C.c_void_p()
    _check(lib, lib.meshrt_tensor_from_dlpack(ptr, C.byref(handle)), what)
    C.pythonapi.PyCapsule_SetName(cap, b"used_dltensor")  # meshrt owns it now
    return handle, handle


@contextlib.contextmanager
def _borrowed(lib, tensors, what):
    """meshrt tensor handles over DLPack objects (None stays None), destroyed on leaving."""
    owned, handles = [], []
    try:
        for t in tensors:
            o, h = _tensor(lib, t, what) if t is not None else (None, None)
            owned.append(o)
            handles.append(h)
        yield handles
    finally:
        for h in owned:
            if h is not None:
                lib.meshrt_tensor_destroy(h)


def _call_and_wait(lib, what, fn, args):
    """fn(*args, &event), then waits for the event; raises MeshrtError naming `what`."""
    ev = C.c_void_p()
    _check(lib, fn(*args, C.byref(ev)), what)
    status = lib.meshrt_event_synchronize(ev)
    lib.meshrt_event_destroy(ev)
    _check(lib, status, what)

class Buffer:
    """A tensor in memory meshrt allocated (Comm.empty). Pass it to Comm's calls like any DLPack
    tensor; hand it over once to a DLPack consumer (np.from_dlpack, torch.from_dlpack), which
    then owns the memory (meshrt's allocator frees it with its last user)."""

    def __init__(self, lib, handle):
        self._lib = lib
        self._h = handle

    def __dlpack__(self, **kwargs):
        if self._h is None:
            raise MeshrtError("meshrt: this Buffer was handed over already (DLPack is one-shot)")
        managed = C.c_void_p()
        _check(self._lib, self._lib.meshrt_tensor_to_dlpack(self._h, C.byref(managed)),
               "meshrt_tensor_to_dlpack")
        h, self._h = self._h, None
        self._lib.meshrt_tensor_destroy(h)
        return C.pythonapi.PyCapsule_New(managed, b"dltensor", None)

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU

    def __del__(self):
        if getattr(self, "_h", None) is not None:
            self._lib.meshrt_tensor_destroy(self._h)


class Comm:
    """One rank of a meshrt communicator. Every call is collective and blocks until done; tensors
    are used in place (C-contiguous, float32 / bfloat16 / float16 / int32 / int64)."""

    def __init__(self, handle):
        self._lib = _load()
        self._h = handle

    @staticmethod
    def _config(timeout_s):
        return _CommConfig(C.sizeof(_CommConfig), 0x4D525443, API_VERSION, float(timeout_s),
                           float(timeout_s), -1, 0, -1, None)

    @classmethod
    def init_tcp(cls, host, port, nranks, rank, timeout_s=300.0):
        """Rank `rank` of `nranks` processes meeting at rank 0's host:port (shared memory on one
        node)."""
        lib = _load()
        h = C.c_void_p()
        cfg = cls._config(timeout_s)
        _check(lib, lib.meshrt_comm_init_tcp(C.byref(h), host.encode(), int(port), int(nranks),
                                             int(rank), C.byref(cfg)), "meshrt_comm_init_tcp")
        return cls(h)

    @classmethod
    def init_threads(cls, n, timeout_s=300.0):
        """All n ranks of a world in this process (rank i's collectives on its own thread)."""
        lib = _load()
        hs = (C.c_void_p * n)()
        cfg = cls._config(timeout_s)
        _check(lib, lib.meshrt_comm_init_all(hs, int(n), None, C.byref(cfg)),
               "meshrt_comm_init_all")
        return [cls(C.c_void_p(hs[i])) for i in range(n)]

    @property
    def rank(self):
        v = C.c_int()
        _check(self._lib, self._lib.meshrt_comm_rank(self._h, C.byref(v)), "meshrt_comm_rank")
        return v.value

    @property
    def size(self):
        v = C.c_int()
        _check(self._lib, self._lib.meshrt_comm_size(self._h, C.byref(v)), "meshrt_comm_size")
        return v.value

    def _run(self, what, fn, *tensors):
        if self._h is None:
            raise MeshrtError(f"meshrt: {what}: the communicator was destroyed")
        with _borrowed(self._lib, tensors, what) as handles:
            _call_and_wait(self._lib, what, fn, handles)

    def all_reduce(self, x, op="sum"):
        """x = op over ranks of x, in place (op: sum, avg, max, min)."""
        if op not in _OPS:
            raise ValueError(f"meshrt: all_reduce: op {op!r} is not one of {sorted(_OPS)}")
        lib = self._lib
        self._run("all_reduce", lambda h, ev: lib.meshrt_all_reduce(self._h, h, h, _OPS[op], None,
                                                                   ev), x)
        return x

    def all_gather(self, x, out):
        """out (size x x's elements) = every rank's x in rank order."""
        lib = self._lib
        self._run("all_gather", lambda a, b, ev: lib.meshrt_all_gather(self._h, a, b, None, ev),
                  x, out)
        return out

    def reduce_scatter(self, x, out, op="sum"):
        """out = this rank's block of op over ranks of x."""
        lib = self._lib
        self._run("reduce_scatter", lambda a, b, ev: lib.meshrt_reduce_scatter(
            self._h, a, b, _OPS[op], None, ev), x, out)
        return out

    def broadcast(self, x, root=0):
        """x = root's x, in place."""
        lib = self._lib
        self._run("broadcast", lambda h, ev: lib.meshrt_broadcast(self._h, h, h, int(root), None,
                                                                 ev), x)
        return x

    def all_to_all(self, x, out):
        """Block j of x goes to rank j; block i of out comes from rank i."""
        lib = self._lib
        self._run("all_to_all", lambda a, b, ev: lib.meshrt_all_to_all(self._h, a, b, None, ev),
                  x, out)
        return out

    def empty(self, shape, dtype="float32"):
        """A Buffer: a tensor in memory meshrt allocates on this rank's device (uninitialised),
        usable in this Comm's calls, then handed over once through DLPack
        (``np.from_dlpack(buf)``, ``torch.from_dlpack(buf)``)."""
        if dtype not in _DTYPES:
            raise ValueError(f"meshrt: empty: dtype {dtype!r} is not one of {sorted(_DTYPES)}")
        lib = self._lib
        dims = (C.c_int64 * len(shape))(*[int(d) for d in shape])
        code, bits = _DTYPES[dtype]
        h = C.c_void_p()
        _check(lib, lib.meshrt_tensor_empty(self._h, len(shape), dims,
                                            _DLDataType(code, bits, 1), C.byref(h)),
               "meshrt_tensor_empty")
        return Buffer(lib, h)

    def barrier(self):
        lib = self._lib
        self._run("barrier", lambda ev: lib.meshrt_barrier(self._h, None, ev))

    def destroy(self):
        """Waits for the communicator's work and frees it (also on garbage collection)."""
        if self._h is not None:
            h, self._h = self._h, None
            _check(self._lib, self._lib.meshrt_comm_destroy(h), "meshrt_comm_destroy")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    def __del__(self):
        try:
            self.destroy()
        except Exception:
            pass
