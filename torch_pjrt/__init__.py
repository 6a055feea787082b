"""torch_pjrt: PyTorch on every PJRT device (TPU, Trainium, GPUs, the CPU) through JAX.

Importing the package registers the ``pjrt`` device with PyTorch; nothing else.

Example:
    >>> import torch, torch_pjrt
    >>> x = torch.ones(2, 3, device="pjrt")
    >>> (x * 2).sum().item()
    12.0
"""

from __future__ import annotations

from torch_pjrt import _device
from torch_pjrt.config import config, settings
from torch_pjrt.diagnostics import metrics
from torch_pjrt.ops.registry import LoweringMissing
from torch_pjrt.runtime import PlatformError, current_platform, init

__all__ = [
    "LoweringMissing",
    "PlatformError",
    "config",
    "current_platform",
    "init",
    "metrics",
    "settings",
]

__version__ = "0.1.0"

_device.register()


def _autoload() -> None:
    """Entry point for PyTorch's device-backend autoload (``torch.backends`` group)."""
    _device.register()
