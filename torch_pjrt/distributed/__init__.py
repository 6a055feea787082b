"""``torch.distributed`` for pjrt tensors: the ``pjrt`` process-group backend.

``register()`` (called when torch_pjrt registers the pjrt device) makes
``init_process_group("pjrt")`` work, and makes ``pjrt`` the default backend of pjrt
tensors, so a plain ``init_process_group()`` picks it too. Under ``torchrun`` the JAX
multi-process runtime starts by itself (:mod:`torch_pjrt.runtime.launch`).
See docs/distributed.md.

SPMD in one process (a mesh over this process's devices, sharded tensors, GSPMD):
``device_mesh``, ``distribute_tensor``, ``mark_sharding``, ``sharding_of``,
``distribute_module`` (:mod:`torch_pjrt.distributed.spmd`, docs/spmd.md).

This module imports nothing heavy: the backend is imported when a group is created.
"""

from __future__ import annotations

__all__ = [
    "Mesh",
    "Sharding",
    "device_mesh",
    "distribute_module",
    "distribute_tensor",
    "mark_sharding",
    "register",
    "sharding_of",
]

_registered = False


def _create(backend_opts, pg_options=None):
    from torch_pjrt.distributed.backend import create

    return create(backend_opts, pg_options)


def register() -> None:
    """Register the ``pjrt`` backend with torch.distributed, if it is built; idempotent."""
    global _registered
    if _registered:
        return
    import torch.distributed as dist

    if not dist.is_available():
        return
    if "pjrt" not in dist.Backend.backend_list:
        dist.Backend.register_backend("pjrt", _create, extended_api=True, devices=["pjrt"])
    _registered = True


# SPMD in one process (torch_pjrt/distributed/spmd.py), imported on first use
_SPMD = frozenset(__all__) - {"register"}


def __getattr__(name: str):
    if name in _SPMD:
        from torch_pjrt.distributed import spmd

        return getattr(spmd, name)
    raise AttributeError(f"module 'torch_pjrt.distributed' has no attribute {name!r}")
