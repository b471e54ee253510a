"""meshrt from Python.

- ``meshrt.Comm``: a communicator of libmeshrt.so over DLPack tensors (NumPy arrays, torch
  tensors, anything with ``__dlpack__``), used in place.
- ``import meshrt.torch``: registers meshrt as the torch.distributed backend "meshrt"
  (``torch.distributed.init_process_group("meshrt")``); see docs/torch.md.
"""
from ._capi import Comm, MeshrtError, library_path, version

__all__ = ["Comm", "MeshrtError", "library_path", "version"]
