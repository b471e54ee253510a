"""meshrt from Python.

- ``meshrt.Comm``: a communicator of libmeshrt.so over DLPack tensors (NumPy arrays, torch
  tensors, anything with ``__dlpack__``), used in place.
- ``meshrt.Mesh``, ``meshrt.Mlp``, ``meshrt.Attn``: a device mesh over a communicator and
  meshrt's tensor-parallel MLP and attention blocks on it, over the caller's DLPack tensors.
- ``import meshrt.torch``: registers meshrt as the torch.distributed backend "meshrt"
  (``torch.distributed.init_process_group("meshrt")``); see docs/torch.md.
"""
from ._capi import Buffer, Comm, MeshrtError, library_path, version
from ._blocks import Attn, Mesh, Mlp

__all__ = ["Attn", "Buffer", "Comm", "Mesh", "MeshrtError", "Mlp", "library_path", "version"]
