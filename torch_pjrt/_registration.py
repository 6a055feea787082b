"""Registering PyTorch's PrivateUse1 backend as ``pjrt``: the glue above every package.

Two steps. ``register()``, at import (and from the autoload entry point
``torch_pjrt:_autoload``, inside every ``import torch``), imports neither JAX nor the
kernels: it names the backend and gives PyTorch what it asks of a device before any
tensor is on it (``device/shell.py``: ``torch.pjrt``, the hooks, the device guard, a
boxed kernel on the PrivateUse1 key; ``device/pinning.py``: ``pin_memory()`` of CPU
tensors), and the entry points a program may start from without a pjrt tensor:
``torch.accelerator``, ``torch.load`` of a pjrt checkpoint, the ``pjrt``
torch.distributed backend, and Dynamo's import. ``load()``, at the first use (the first op on
pjrt, an attribute of ``torch.pjrt`` or of ``torch_pjrt``), imports the rest and
installs it: the kernels (``ops``), SDPA's and FlexAttention's, inductor's routing, DLPack
and Dynamo's skip list. Only ``torch_pjrt/__init__.py`` calls these.
"""

from __future__ import annotations

import sys
import threading

import torch

from torch_pjrt.device import shell

__all__ = ["load", "register"]

_lock = threading.RLock()
_registered = False
_state = None  # None, "loading" (in the thread holding _lock), "loaded"
_libraries: list = []  # (a Library's registrations last as long as it does)


def register() -> None:
    """Register ``pjrt`` as PyTorch's PrivateUse1 backend, cheaply; idempotent."""
    global _registered
    with _lock:
        if _registered:
            return
        if torch._C._get_privateuse1_backend_name() == "pjrt" and hasattr(torch, "pjrt"):
            _registered = True
            return
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        from torch_pjrt import distributed
        from torch_pjrt.device import accelerator, guard, pinning, serialization
        from torch_pjrt.runtime.imports import after_import

        _setup_privateuseone_for_python_backend(
            "pjrt",
            backend_module=shell.LazyDeviceModule(),
            hook=shell.Hooks(),
            device_guard=shell.Guard(),
        )
        shell.loads_with(load)
        guard.install()  # the C++ device guard in place of the Python one, if it builds
        fallback = torch.library.Library("_", "IMPL")
        fallback.fallback(shell.fallback, "PrivateUse1")
        aten = torch.library.Library("aten", "IMPL")
        pinning.register(aten)  # pin_memory() of CPU tensors, pjrt the accelerator
        accelerator.install()  # torch.accelerator: what C++ hooks would have done
        serialization.register()
        distributed.register()  # the torch.distributed "pjrt" backend
        # Dynamo, once imported, may trace or compile pjrt code before any pjrt op ran:
        # its skip list and device table take torch_pjrt's entries then (load())
        after_import("torch._dynamo", _load_after)
        _libraries.extend((fallback, aten))
        _registered = True


def _load_after(module) -> None:
    load()


def load() -> None:
    """Import and install what the first use of pjrt needs; idempotent, thread-safe."""
    global _state
    if _state == "loaded":
        return
    with _lock:
        if _state is not None:  # loaded, or loading in this thread (re-entered)
            return
        _state = "loading"
        lazy = None
        try:
            from torch_pjrt import ops
            from torch_pjrt.compile import inductor
            from torch_pjrt.compile.dynamo import skip_torch_pjrt
            from torch_pjrt.device import interop
            from torch_pjrt.device.module import DeviceModule
            from torch_pjrt.kernels import attention, flex
            from torch_pjrt.ops import fallback as pjrt_fallback

            lazy = torch.pjrt
            torch.pjrt = sys.modules["torch.pjrt"] = DeviceModule  # (the installs read it)
            ops.install()
            attention.install()  # F.scaled_dot_product_attention: the kernel or XLA, per chip
            flex.install()  # FlexAttention: past its device check
            inductor.install()  # torch.compile's default backend: pjrt graphs to ours
            interop.install()  # DLPack: pjrt tensors to JAX and back (device/interop.py)
            skip_torch_pjrt()
            shell.ready(pjrt_fallback.boxed)
        except BaseException:
            if lazy is not None:  # (the next use tries again)
                torch.pjrt = sys.modules["torch.pjrt"] = lazy
            _state = None
            raise
        _state = "loaded"
