"""Host pinning with pjrt as the accelerator: ``pin_memory()`` and ``is_pinned()`` of CPU
tensors.

PyTorch's CPU kernels ask the current accelerator for a pinned-memory allocator
(``getPinnedMemoryAllocator``) and whether a pointer is pinned (``isPinnedPtr``); once
pjrt is registered that is pjrt, on every machine (PyTorch asks PrivateUse1 first), and
``torch._C._acc.PrivateUse1Hooks`` lets Python implement neither: ``pin_memory()`` would
raise. The CPU kernels stay PyTorch's: these kernels sit on BackendSelect, which every
call passes through just above the backend keys, answer the calls that pin for pjrt and
hand every other call down unchanged. Registered with the device (``register()``), not
at its first use: a program that never uses pjrt pins too.
"""

from __future__ import annotations

import torch
from torch._C import DispatchKey

__all__ = ["register"]

aten = torch.ops.aten

_BELOW_BACKEND_SELECT = torch._C._dispatch_keyset_full_after(DispatchKey.BackendSelect)
_PINNED = "_pjrt_pinned"  # set on the Python object of a storage pin_memory() made

# PyTorch's own choice of accelerator, where pjrt's registration does not override it
# (the order of at::getAccelerator after PrivateUse1)
_BUILTIN_ACCELERATORS = (
    ("mtia", lambda: torch.mtia.is_available()),
    ("cuda", lambda: torch.cuda.is_available()),
    ("xpu", lambda: torch.xpu.is_available()),
    ("mps", lambda: torch.backends.mps.is_available()),
)


def _dense_cpu(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.layout == torch.strided and not t.is_nested


def _builtin_accelerator() -> str | None:
    """The built-in accelerator usable here (CUDA, ...), which PyTorch would pin for had
    pjrt not registered; None when there is none."""
    for name, available in _BUILTIN_ACCELERATORS:
        if available():
            return name
    return None


def _pin_memory_kernel(keyset, self, device=None):
    """``_pin_memory`` on BackendSelect. With pjrt as the accelerator (no ``device``, no
    built-in accelerator usable; or ``device="pjrt"``), a pinned tensor is an ordinary CPU
    copy: PJRT stages host<->device transfers itself. With a built-in one usable (a CUDA
    program on a machine that has torch_pjrt), that one pins, as PyTorch would without
    pjrt; every other call runs PyTorch's own kernel."""
    below = keyset & _BELOW_BACKEND_SELECT
    if not _dense_cpu(self) or (device is not None and torch.device(device).type != "pjrt"):
        return aten._pin_memory.default.redispatch(below, self, device)
    builtin = _builtin_accelerator() if device is None else None
    if builtin is None:
        pinned = self.clone()  # what pin_memory() returns must not alias its input
    else:
        pinned = aten._pin_memory.default.redispatch(below, self, torch.device(builtin))
    # NOTE: is_pinned() without a device asks pjrt's hooks, which know no pinned pointer:
    # the mark lets it answer True for what pin_memory() returned (so pin_memory() of a
    # pinned tensor returns it, as PyTorch's contract says)
    setattr(pinned.untyped_storage(), _PINNED, True)
    return pinned


def _is_pinned_kernel(keyset, self, device=None):
    """``is_pinned`` on BackendSelect: PyTorch's answer, or True for a tensor whose storage
    ``pin_memory()`` made with pjrt as the target."""
    pinned = aten.is_pinned.default.redispatch(keyset & _BELOW_BACKEND_SELECT, self, device)
    if pinned or not _dense_cpu(self):
        return pinned
    if device is not None and torch.device(device).type != "pjrt":
        return False
    return getattr(self.untyped_storage(), _PINNED, False)


def register(lib) -> None:
    """``pin_memory()`` and ``is_pinned()`` of CPU tensors with pjrt as the accelerator,
    on BackendSelect (the CPU, CUDA and Meta kernels stay PyTorch's)."""
    lib.impl("_pin_memory", _pin_memory_kernel, "BackendSelect", with_keyset=True)
    lib.impl("is_pinned", _is_pinned_kernel, "BackendSelect", with_keyset=True)
