"""Keep Dynamo out of torch_pjrt's own code.

While a ``torch.compile``d function runs, Dynamo's frame hook sees every Python frame,
including those of our eager kernels (Python functions the dispatcher calls after a
graph break) and of JAX below them. Tracing those would be wrong and slow, so
torch_pjrt, JAX and their helpers go on Dynamo's skip list as soon as Dynamo is
imported (Dynamo is heavy: it is not imported for this).
"""

from __future__ import annotations

import importlib.util

from torch_pjrt.runtime.imports import after_import

_SKIPPED = ("torch_pjrt", "jax", "jaxlib", "ml_dtypes", "opt_einsum")
_done = [False]


def _add_skips(trace_rules) -> None:
    if _done[0]:
        return
    _done[0] = True
    for name in _SKIPPED:
        if importlib.util.find_spec(name) is not None:
            trace_rules.add(name)


def skip_torch_pjrt() -> None:
    """Put torch_pjrt and JAX on Dynamo's skip list, and pjrt's device interface in
    Dynamo's table, now or when Dynamo is imported."""
    after_import("torch._dynamo.trace_rules", _add_skips)
    after_import("torch._dynamo.device_interface", _register_interface)


def _register_interface(device_interface) -> None:
    """``torch._dynamo.device_interface.get_interface_for_device("pjrt")``: what Dynamo
    and its device-generic code (streams, events, device guards in compiled code, the
    compile workers) ask of a device, answered by ``torch.pjrt``."""
    import torch

    pjrt = torch.pjrt

    class PjrtInterface(device_interface.DeviceInterface):
        device = pjrt.device
        Event = pjrt.Event
        Stream = pjrt.Stream

        class Worker:
            @staticmethod
            def set_device(device: int) -> None:
                pjrt.set_device(device)

            @staticmethod
            def current_device() -> int:
                return pjrt.current_device()

            @staticmethod
            def get_device_properties(device=None):
                return pjrt.get_device_properties(device)

        current_device = staticmethod(pjrt.current_device)
        set_device = staticmethod(pjrt.set_device)
        device_count = staticmethod(pjrt.device_count)
        is_available = staticmethod(pjrt.is_available)
        stream = staticmethod(pjrt.stream)
        current_stream = staticmethod(pjrt.current_stream)
        set_stream = staticmethod(pjrt.set_stream)
        synchronize = staticmethod(pjrt.synchronize)
        memory_allocated = staticmethod(pjrt.memory_allocated)
        is_bf16_supported = staticmethod(pjrt.is_bf16_supported)

        @staticmethod
        def exchange_device(device: int) -> int:
            previous = pjrt.current_device()
            if device != previous:
                pjrt.set_device(device)
            return previous

        maybe_exchange_device = exchange_device

        @staticmethod
        def get_raw_stream(device_idx: int) -> int:
            return 0  # (one queue a device: no stream handle to pass to kernels)

        @classmethod
        def get_device_properties(cls, device=None):
            return pjrt.get_device_properties(device)

        @staticmethod
        def get_compute_capability(device=None):
            return pjrt.get_device_capability(device)

        @staticmethod
        def is_triton_capable(device=None) -> bool:
            return False  # (pjrt compiles with XLA)

    for name in ["pjrt", *(f"pjrt:{i}" for i in range(_device_count_bound()))]:
        device_interface.register_interface_for_device(name, PjrtInterface)


def _device_count_bound() -> int:
    """The device indices to register by name without starting the platform."""
    from torch_pjrt import runtime

    return runtime.device_count() if runtime.is_initialized() else 0
