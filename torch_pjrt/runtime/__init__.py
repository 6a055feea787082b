"""The runtime layer: which PJRT platform, its devices, and host<->device transfers.

Nothing outside this package knows which chip it runs on.

The names below are imported from their modules at first use: importing the package
imports no JAX (registering the device reads ``runtime.imports``, which must not).
"""

from __future__ import annotations

import importlib

_NAMES = {
    "PlatformError": "platform",
    "canonical_index": "platform",
    "current_platform": "platform",
    "device": "platform",
    "device_count": "platform",
    "devices": "platform",
    "init": "platform",
    "is_initialized": "platform",
    "live_arrays": "platform",
    "local_index": "platform",
    "visible_device_count": "platform",
    "from_host": "transfer",
    "to_host": "transfer",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str):
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'torch_pjrt.runtime' has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_NAMES})
