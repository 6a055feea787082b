"""Registering PyTorch's PrivateUse1 backend as ``pjrt``: the glue above every package.

``register()`` names the backend, installs ``torch.pjrt`` (``device/module.py``), the
kernels (``ops``), ``torch.accelerator``'s pjrt answers, serialization, Dynamo's skip list
and the ``pjrt`` torch.distributed backend. Only ``torch_pjrt/__init__.py`` imports this
module (at import, and from the autoload entry point ``torch_pjrt:_autoload``).
"""

from __future__ import annotations

import threading

import torch

from torch_pjrt.device.module import DeviceModule, _Guard, _Hooks

__all__ = ["register"]

_lock = threading.Lock()
_registered = False


def register() -> None:
    """Register ``pjrt`` as PyTorch's PrivateUse1 backend; idempotent."""
    global _registered
    with _lock:
        if _registered:
            return
        if torch._C._get_privateuse1_backend_name() == "pjrt" and hasattr(torch, "pjrt"):
            _registered = True
            return
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        _setup_privateuseone_for_python_backend(
            "pjrt", backend_module=DeviceModule, hook=_Hooks(), device_guard=_Guard()
        )
        from torch_pjrt import distributed, ops
        from torch_pjrt.compile import inductor
        from torch_pjrt.compile.dynamo import skip_torch_pjrt
        from torch_pjrt.device import accelerator, guard, interop, serialization
        from torch_pjrt.kernels import attention, flex

        guard.install()  # the C++ device guard in place of the Python one, if it builds
        ops.install()
        attention.install()  # F.scaled_dot_product_attention: the kernel or XLA, per chip
        flex.install()  # FlexAttention: past its device check
        inductor.install()  # torch.compile's default backend: pjrt graphs to ours
        accelerator.install()  # torch.accelerator: what C++ hooks would have done
        serialization.register()
        interop.install()  # DLPack: pjrt tensors to JAX and back (device/interop.py)
        skip_torch_pjrt()
        distributed.register()  # the torch.distributed "pjrt" backend
        _registered = True
