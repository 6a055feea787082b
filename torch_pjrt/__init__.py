"""torch_pjrt: PyTorch on every PJRT device (TPU, Trainium, GPUs, the CPU) through JAX.

Importing the package registers the ``pjrt`` device with PyTorch and nothing else; JAX
and the kernels load at the first use of pjrt (docs/internals.md, "Registration").

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
import importlib  # noqa: E402

import torch  # noqa: E402, F401

from torch_pjrt import _registration  # noqa: E402
from torch_pjrt._version import __version__ as __version__  # noqa: E402

# (imported now: the name ``config`` is also the submodule's, which an import of it
# would otherwise leave here in the function's place)
from torch_pjrt.config import config as config  # noqa: E402
from torch_pjrt.config import settings as settings  # noqa: E402

# the other public names, imported at first use (each loads the package): name ->
# (module, attribute; None: the module itself)
_LAZY = {
    "LoweringMissing": ("torch_pjrt.ops.registry", "LoweringMissing"),
    "PlatformError": ("torch_pjrt.runtime", "PlatformError"),
    "StrictModeError": ("torch_pjrt.diagnostics.strict", "StrictModeError"),
    "current_platform": ("torch_pjrt.runtime", "current_platform"),
    "from_jax": ("torch_pjrt.device.interop", "from_jax"),
    "get_mode": ("torch_pjrt.modes", "get_mode"),
    "init": ("torch_pjrt.runtime", "init"),
    "kernel": ("torch_pjrt.kernels", "kernel"),
    "metrics": ("torch_pjrt.diagnostics.metrics", None),
    "mode": ("torch_pjrt.modes", "mode"),
    "profiler": ("torch_pjrt.diagnostics.profiler", None),
    "set_mode": ("torch_pjrt.modes", "set_mode"),
    "step": ("torch_pjrt.modes", "step"),
    "strict": ("torch_pjrt.diagnostics.strict", "strict"),
    "to_jax": ("torch_pjrt.device.interop", "to_jax"),
}

__all__ = sorted(["config", "settings", *_LAZY])


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'torch_pjrt' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    _registration.load()
    found = importlib.import_module(module)
    if attribute is not None:
        found = getattr(found, attribute)
    globals()[name] = found
    return found


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


_registration.register()
