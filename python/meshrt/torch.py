"""``import meshrt.torch`` registers meshrt as the torch.distributed backend "meshrt":

    import meshrt.torch
    torch.distributed.init_process_group("meshrt")   # torchrun, or init_method=..., as with gloo

The backend bootstraps over torch's store (no other port or variable): CPU ranks of one node
share memory (meshrt's shm backend); across nodes they run in two levels (hier: shm inside each
node, TCP between the nodes); CUDA tensors go over meshrt's NCCL communicator. See docs/torch.md
for what is supported and refused.
"""
import torch
import torch.distributed as dist

try:
    from . import _torch_backend as _ext
except ImportError as e:  # pragma: no cover - depends on the build
    raise ImportError(
        f"meshrt.torch: the torch backend extension is missing or was built for another torch "
        f"({e}); reinstall meshrt with this torch ({torch.__version__}) importable: "
        f"pip install --no-build-isolation .") from e

BACKEND = "meshrt"


def _create_backend(store, rank, size, timeout):
    return _ext.create_backend(store, rank, size, timeout.total_seconds())


def collective_backend(group=None):
    """The meshrt backend that moves the CPU tensors of `group` (default: the world): "shm" (one
    node), "hier" (several nodes), "host" (one process)."""
    pg = group if group is not None else dist.group.WORLD
    return pg._get_backend(torch.device("cpu")).collective_backend


def _register():
    if BACKEND in dist.Backend.backend_list:
        return
    # CUDA tensors only exist where a GPU does; there, meshrt is registered for cuda too: a module
    # built with CUDA (_ext.cuda_built()) moves them on meshrt's NCCL communicator, on torch's
    # current stream; one built without refuses them with one clear line.
    devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    dist.Backend.register_backend(BACKEND, _create_backend, devices=devices)


_register()
