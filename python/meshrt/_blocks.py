"""meshrt's device mesh and sharded blocks (the MLP and attention blocks of
include/meshrt/meshrt.h) over DLPack tensors: weights, activations and gradients are the
caller's NumPy arrays or torch tensors, used in place (C-contiguous)."""
import ctypes as C

from ._capi import (_DLDataType, _DTYPES, _borrowed, _call_and_wait, _check, _load,
                    MeshrtError)

_NORMS = {"layernorm": 0, "rmsnorm": 1}
_GELUS = {"tanh": 0, "erf": 1}
_LAYOUTS = {"in_out": 0, "out_in": 1}
_QKV = {"per_head": 0, "blocked": 1}
_CP_COMM = {"ring": 0, "allgather": 1}
_PARAMS = ("norm_weight", "norm_bias", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias")
_ATTN_PARAMS = ("norm_weight", "norm_bias", "qkv_weight", "qkv_bias", "proj_weight", "proj_bias")


def _choice(table, value, what):
    if value not in table:
        raise ValueError(f"meshrt: {what} {value!r} is not one of {sorted(table)}")
    return table[value]


class _Params(C.Structure):  # meshrt_mlp_params_t and meshrt_attn_params_t: the same layout
    _fields_ = [("size", C.c_size_t)] + [(f"t{i}", C.c_void_p) for i in range(6)]


class _MlpConfig(C.Structure):  # meshrt_mlp_config_t, API version 1
    _fields_ = [("size", C.c_size_t), ("hidden", C.c_int64), ("ffn", C.c_int64),
                ("dtype", _DLDataType), ("norm", C.c_int), ("eps", C.c_float), ("gelu", C.c_int),
                ("bias", C.c_int), ("sequence_parallel", C.c_int), ("weight_layout", C.c_int)]


class _AttnConfig(C.Structure):  # meshrt_attn_config_t, API version 1
    _fields_ = [("size", C.c_size_t), ("hidden", C.c_int64), ("heads", C.c_int64),
                ("dtype", _DLDataType), ("norm", C.c_int), ("eps", C.c_float), ("bias", C.c_int),
                ("causal", C.c_int), ("sequence_parallel", C.c_int), ("weight_layout", C.c_int),
                ("qkv_layout", C.c_int), ("cp_comm", C.c_int)]


class Mesh:
    """A device mesh over a communicator's ranks, e.g. ``Mesh(comm, "tp=2")`` (collective)."""

    def __init__(self, comm, spec):
        self._lib = _load()
        lib = self._lib
        lib.meshrt_mesh_create.argtypes = [C.POINTER(C.c_void_p), C.c_void_p, C.c_char_p]
        lib.meshrt_mesh_dim.argtypes = [C.c_void_p, C.c_char_p, C.POINTER(C.c_int),
                                        C.POINTER(C.c_int)]
        lib.meshrt_mesh_destroy.argtypes = [C.c_void_p]
        self._h = C.c_void_p()
        _check(lib, lib.meshrt_mesh_create(C.byref(self._h), comm._h, spec.encode()),
               "meshrt_mesh_create")

    def dim(self, name):
        """(size, this rank's coordinate) of dimension `name`."""
        size, coord = C.c_int(), C.c_int()
        _check(self._lib, self._lib.meshrt_mesh_dim(self._h, name.encode(), C.byref(size),
                                                    C.byref(coord)), "meshrt_mesh_dim")
        return size.value, coord.value

    def destroy(self):
        if self._h is not None:
            h, self._h = self._h, None
            _check(self._lib, self._lib.meshrt_mesh_destroy(h), "meshrt_mesh_destroy")


class _Block:
    """What the MLP and attention blocks share: shard_info, bind_weights, forward, backward."""
    _kind = ""
    _names = ()

    def __init__(self, mesh, config):
        self._lib = _load()
        lib, k = self._lib, self._kind
        getattr(lib, f"meshrt_{k}_create").argtypes = [C.POINTER(C.c_void_p), C.c_void_p,
                                                       C.c_void_p]
        getattr(lib, f"meshrt_{k}_shard_info").argtypes = [C.c_void_p, C.c_int,
                                                           C.POINTER(C.c_int64),
                                                           C.POINTER(C.c_int64)]
        getattr(lib, f"meshrt_{k}_bind_weights").argtypes = [C.c_void_p, C.POINTER(_Params)]
        getattr(lib, f"meshrt_{k}_forward").argtypes = [C.c_void_p] * 4 + [C.POINTER(C.c_void_p)]
        getattr(lib, f"meshrt_{k}_backward").argtypes = [C.c_void_p, C.c_void_p, C.c_void_p,
                                                         C.POINTER(_Params), C.c_void_p,
                                                         C.POINTER(C.c_void_p)]
        getattr(lib, f"meshrt_{k}_destroy").argtypes = [C.c_void_p]
        self._h = C.c_void_p()
        _check(lib, getattr(lib, f"meshrt_{k}_create")(C.byref(self._h), mesh._h,
                                                        C.byref(config)), f"meshrt_{k}_create")

    def _call(self, what, fn, tensors, params=None, event=True):
        """fn(block, *handles[, params], [event]) on DLPack tensors; waits for the event."""
        lib = self._lib
        if self._h is None:
            raise MeshrtError(f"meshrt: {what}: the block was destroyed")
        named = [] if params is None else [params.get(n) for n in self._names]
        with _borrowed(lib, list(tensors) + named, what) as handles:
            args = [self._h] + handles[:len(tensors)]
            if params is not None:
                p = _Params(C.sizeof(_Params), *handles[len(tensors):])
                args.append(C.byref(p))
            if not event:
                _check(lib, fn(*args), what)
                return
            _call_and_wait(lib, what, fn, args)

    def shard_info(self, which):
        """(offset, size) of this rank's shard of parameter `which` (e.g. "fc1_weight")."""
        if which not in self._names:
            raise ValueError(f"meshrt: shard_info: {which!r} is not one of {list(self._names)}")
        off, n = C.c_int64(), C.c_int64()
        _check(self._lib, getattr(self._lib, f"meshrt_{self._kind}_shard_info")(
            self._h, self._names.index(which), C.byref(off), C.byref(n)),
            f"meshrt_{self._kind}_shard_info")
        return off.value, n.value

    def _unknown(self, tensors, what):
        bad = set(tensors) - set(self._names)
        if bad:
            raise ValueError(f"meshrt: {what}: unknown parameter(s) {sorted(bad)}; "
                             f"the block's are {list(self._names)}")

    def bind_weights(self, **weights):
        """Binds this rank's weight shards by name (used in place, or copied as the weight
        layout says)."""
        self._unknown(weights, "bind_weights")
        fn = getattr(self._lib, f"meshrt_{self._kind}_bind_weights")
        self._call("bind_weights", fn, [], weights, event=False)

    def forward(self, x, y):
        """y = block(x) (y: the caller's output tensor)."""
        fn = getattr(self._lib, f"meshrt_{self._kind}_forward")
        self._call("forward", lambda h, a, b, ev: fn(h, a, b, None, ev), [x, y])

    def backward(self, dy, dx, **grads):
        """dx from dy; weight gradients accumulated into `grads` (by name)."""
        self._unknown(grads, "backward")
        fn = getattr(self._lib, f"meshrt_{self._kind}_backward")
        self._call("backward", lambda h, a, b, p, ev: fn(h, a, b, p, None, ev), [dy, dx], grads)

    def destroy(self):
        if self._h is not None:
            h, self._h = self._h, None
            _check(self._lib, getattr(self._lib, f"meshrt_{self._kind}_destroy")(h),
                   f"meshrt_{self._kind}_destroy")


def _dtype(name):
    code, bits = _choice(_DTYPES, name, "dtype")
    return _DLDataType(code, bits, 1)


class Mlp(_Block):
    """meshrt's tensor-parallel MLP block (norm, fc1, GELU, fc2, residual) on a mesh's tp dim."""
    _kind = "mlp"
    _names = _PARAMS

    def __init__(self, mesh, hidden, ffn, dtype="float32", norm="layernorm", eps=1e-5,
                 gelu="tanh", bias=True, sequence_parallel=False, weight_layout="in_out"):
        cfg = _MlpConfig(C.sizeof(_MlpConfig), hidden, ffn, _dtype(dtype),
                         _choice(_NORMS, norm, "norm"), eps, _choice(_GELUS, gelu, "gelu"),
                         int(bias), int(sequence_parallel),
                         _choice(_LAYOUTS, weight_layout, "weight_layout"))
        super().__init__(mesh, cfg)


class Attn(_Block):
    """meshrt's tensor-parallel attention block (norm, qkv, attention, proj, residual). On a mesh
    with a cp dim (``Mesh(comm, "cp=2")``) each rank passes its causal load-balance shard of the
    sequence (chunks r and 2cp-1-r of 2 x cp) and ``cp_comm`` ("ring" or "allgather") picks how
    the ranks exchange K/V."""
    _kind = "attn"
    _names = _ATTN_PARAMS

    def __init__(self, mesh, hidden, heads, dtype="float32", norm="layernorm", eps=1e-5,
                 bias=True, causal=True, sequence_parallel=False, weight_layout="in_out",
                 qkv_layout="per_head", cp_comm="ring"):
        cfg = _AttnConfig(C.sizeof(_AttnConfig), hidden, heads, _dtype(dtype),
                          _choice(_NORMS, norm, "norm"), eps, int(bias), int(causal),
                          int(sequence_parallel), _choice(_LAYOUTS, weight_layout, "weight_layout"),
                          _choice(_QKV, qkv_layout, "qkv_layout"),
                          _choice(_CP_COMM, cp_comm, "cp_comm"))
        super().__init__(mesh, cfg)
