"""torch_pjrt: PyTorch on every PJRT device (TPU, Trainium, GPUs, the CPU) through JAX.

Importing the package registers the ``pjrt`` device with PyTorch; nothing else.

Example:
    >>> import torch, torch_pjrt
    >>> x = torch.ones(2, 3, device="pjrt")
    >>> (x * 2).sum().item()
    12.0
"""

from __future__ import annotations


def _autoload() -> None:
    """Entry point for PyTorch's device-backend autoload (``torch.backends`` group).

    NOTE: defined before anything imports torch: with the package installed,
    ``import torch`` (triggered below) calls this while torch_pjrt is still importing.
    """
    from torch_pjrt import _registration

    _registration.register()


# With the package installed, this import runs _autoload() (above) via the entry point.
import torch  # noqa: E402, F401

from torch_pjrt import _registration  # noqa: E402
from torch_pjrt._version import __version__ as __version__  # noqa: E402
from torch_pjrt.config import config, settings  # noqa: E402
from torch_pjrt.device.interop import from_jax, to_jax  # noqa: E402
from torch_pjrt.diagnostics import metrics, profiler  # noqa: E402
from torch_pjrt.diagnostics.strict import StrictModeError, strict  # noqa: E402
from torch_pjrt.kernels import kernel  # noqa: E402
from torch_pjrt.modes import get_mode, mode, set_mode, step  # noqa: E402
from torch_pjrt.ops.registry import LoweringMissing  # noqa: E402
from torch_pjrt.runtime import PlatformError, current_platform, init  # noqa: E402

__all__ = [
    "LoweringMissing",
    "PlatformError",
    "StrictModeError",
    "config",
    "current_platform",
    "from_jax",
    "get_mode",
    "init",
    "kernel",
    "metrics",
    "profiler",
    "mode",
    "set_mode",
    "settings",
    "step",
    "strict",
    "to_jax",
]


_registration.register()
