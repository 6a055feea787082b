"""``torch.accelerator`` with pjrt as the current accelerator.

PyTorch's ``torch.accelerator`` functions are thin Python over ``torch._C._accelerator_*``,
which reach the accelerator's C++ device guard, caching allocator and host allocator. A
backend registered from Python (``torch._C._acc``) has no allocators, and PyTorch 2.13
does not check for that: once the device is initialized (the first pjrt tensor calls
``torch.pjrt._lazy_init``), ``empty_host_cache()`` calls through a null host allocator
(SIGSEGV); the memory functions fail an internal assert that asks for a PyTorch bug
report; ``get_device_capability`` raises that the backend does not support it. The
device functions reach pjrt's C++ guard (``device/guard.py``); the wrappers below also
check the index and apply torchrun's aliases, and serve where that guard could not be
built (the Python guard answers device 0 and cannot synchronize).

``install()`` wraps those ``torch._C._accelerator_*`` functions (``torch.accelerator``
looks them up on every call). Each wrapper runs PyTorch's own function unless the
current accelerator is pjrt, and otherwise does what pjrt can: the device index is
``torch.pjrt``'s, ``synchronize`` waits through ``torch.pjrt``, there is no cache to
empty, and the memory statistics are ``torch.pjrt.memory``'s.
"""

from __future__ import annotations

import functools

import torch

from torch_pjrt import runtime
from torch_pjrt.device import guard, memory

__all__ = ["install"]

_PRIVATEUSE1 = int(torch._C._autograd.DeviceType.PrivateUse1.value)


def _on_pjrt() -> bool:
    accelerator = torch._C._accelerator_getAccelerator()
    return accelerator is not None and accelerator.type == "pjrt"


def _exchange_device(device_index: int) -> int:
    previous = torch.pjrt.current_device()
    torch.pjrt.set_device(device_index)
    return previous


def _set_device_index(device_index: int) -> None:
    if device_index >= 0:  # as PyTorch: a negative index changes nothing
        torch.pjrt.set_device(device_index)


def _get_stream(device_index: int) -> torch.Stream:
    runtime.device(device_index)  # raises on an invalid index
    # one in-order queue per device (docs/device_api.md, streams): the stream object is
    # the one set last in this thread (torch.Stream's context does), else the default
    stream_id = guard.current_stream_id(device_index)
    return torch.Stream(stream_id=stream_id, device_index=device_index, device_type=_PRIVATEUSE1)


def _set_stream(stream) -> None:
    if not isinstance(stream, torch.Stream) or stream.device.type != "pjrt":
        return _ORIGINALS["_accelerator_setStream"](stream)  # PyTorch's error
    torch.pjrt.set_device(stream.device_index)  # as PyTorch: the stream's device
    guard.set_current_stream_id(stream.device_index, stream.stream_id)
    return None


def _synchronize(device_index: int) -> None:
    if runtime.is_initialized():  # as PyTorch: nothing to wait for before the first use
        torch.pjrt.synchronize(device_index)


def _device_capability(device_index: int) -> dict:
    from torch_pjrt.runtime.transfer import TORCH_TO_JAX

    runtime.device(device_index)  # raises on an invalid index
    return {"supported_dtypes": set(TORCH_TO_JAX)}


def _no_cache() -> None:
    """XLA frees a buffer when its last array goes, and pinned host memory is ordinary
    host memory on pjrt: there is no cache to empty."""
    return None


# torch._C function -> what it does with pjrt as the current accelerator
_ON_PJRT = {
    "_accelerator_getDeviceIndex": lambda: torch.pjrt.current_device(),
    "_accelerator_setDeviceIndex": _set_device_index,
    "_accelerator_exchangeDevice": _exchange_device,
    "_accelerator_maybeExchangeDevice": _exchange_device,
    "_accelerator_getStream": _get_stream,
    "_accelerator_setStream": _set_stream,
    "_accelerator_synchronizeDevice": _synchronize,
    "_accelerator_getDeviceCapability": _device_capability,
    # "initialized" as PyTorch's CUDA allocator: once the device is in use (memory_stats()
    # is {} and empty_cache() a no-op before, as there)
    "_accelerator_isAllocatorInitialized": lambda: runtime.is_initialized(),
    "_accelerator_emptyCache": _no_cache,
    "_accelerator_emptyHostCache": _no_cache,  # PyTorch's: SIGSEGV (no host allocator)
    # torch.pjrt.memory's figures (device/memory.py): torch.accelerator.memory_stats()
    # flattens and sorts the dict, memory_allocated() and the others read its keys
    "_accelerator_getDeviceStats": memory.memory_stats,
    "_accelerator_resetAccumulatedStats": memory.reset_accumulated_memory_stats,
    "_accelerator_resetPeakStats": memory.reset_peak_memory_stats,
    "_accelerator_getMemoryInfo": memory.mem_get_info,
}
_ORIGINALS: dict = {}


def _wrap(name: str, on_pjrt):
    original = _ORIGINALS[name] = getattr(torch._C, name)

    @functools.wraps(original)
    def call(*args, **kwargs):
        if _on_pjrt():
            return on_pjrt(*args, **kwargs)
        return original(*args, **kwargs)

    return call


def install() -> None:
    """Wrap the ``torch._C._accelerator_*`` functions above; idempotent."""
    for name, on_pjrt in _ON_PJRT.items():
        if name not in _ORIGINALS and hasattr(torch._C, name):
            setattr(torch._C, name, _wrap(name, on_pjrt))
