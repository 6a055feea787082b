"""What registering the device gives PyTorch at once; the rest loads on first use.

With the package installed, PyTorch's device-backend autoload imports torch_pjrt inside
every ``import torch``, pjrt used or not. So registering ``pjrt`` imports neither JAX nor
the kernels (about a second): it gives PyTorch its PrivateUse1 registration (the name,
``torch.pjrt``, the hooks, the device guard) and one boxed kernel on the PrivateUse1 key,
:func:`fallback`. The first op on pjrt reaches that kernel, which loads the package
(:func:`load`: ``_registration.load`` registers the kernels) and calls the op again,
which now finds its own kernel. After that :func:`fallback` is the CPU fallback of the
ops without a lowering (``ops/fallback.py``).

Until then ``torch.pjrt`` is a :class:`LazyDeviceModule`: it serves the seeding functions
that ``torch.manual_seed`` calls on every registered device without loading anything,
and any other attribute loads the package and is the real ``torch.pjrt``'s
(``device/module.py``). docs/internals.md, "Registration", lists every first use.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable

import torch

from torch_pjrt.device import random as pjrt_random

__all__ = ["LazyDeviceModule", "fallback", "load", "loads_with", "ready", "runtime_started"]

_loader: Callable[[], None] | None = None  # _registration.load
_delegate: Callable | None = None  # the CPU fallback, once the package has loaded


def loads_with(loader: Callable[[], None]) -> None:
    """``loader`` loads the package (``_registration.load``, given when it registers)."""
    global _loader
    _loader = loader


def load() -> None:
    """Load the package (JAX, the runtime, the kernels) if it has not loaded yet."""
    if _loader is not None:
        _loader()


def ready(delegate: Callable) -> None:
    """The package has loaded: :func:`fallback` hands ops without a kernel to
    ``delegate`` (the CPU fallback) from now on."""
    global _delegate
    _delegate = delegate


def runtime_started() -> bool:
    """Whether the PJRT platform has started, without importing anything to know it."""
    platform = sys.modules.get("torch_pjrt.runtime.platform")
    return platform is not None and platform.is_initialized()


def fallback(op, *args, **kwargs):
    """The boxed kernel of the PrivateUse1 key: the first op on pjrt loads the package
    and runs again (now with its own kernel); later, the ops without a kernel."""
    delegate = _delegate
    if delegate is not None:
        return delegate(op, *args, **kwargs)
    load()
    if _delegate is None:  # (an op while this thread loads the package)
        raise RuntimeError(
            f"torch_pjrt: {op} ran on pjrt while torch_pjrt itself was loading; "
            "please report this to the torch_pjrt issue tracker"
        )
    return op(*args, **kwargs)


class LazyDeviceModule(types.ModuleType):
    """``torch.pjrt`` until the package loads. The seeding functions are the real
    module's (the same state, ``device/random.py``); any other attribute loads the
    package, which puts the real ``torch.pjrt`` in this one's place."""

    def __init__(self):
        super().__init__("torch.pjrt", "The pjrt device API (loads on first use).")

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def is_initialized() -> bool:
        return runtime_started()

    @staticmethod
    def manual_seed(seed: int) -> None:
        pjrt_random.manual_seed(seed, pjrt_random.current_device())

    manual_seed_all = staticmethod(pjrt_random.manual_seed_all)

    def __getattr__(self, name: str):
        if name.startswith("__"):  # (introspection: inspect, pickle, doctest)
            raise AttributeError(name)
        load()
        real = sys.modules.get("torch.pjrt")
        if real is self or real is None:
            raise AttributeError(f"module 'torch.pjrt' has no attribute {name!r}")
        return getattr(real, name)


class Hooks(torch._C._acc.PrivateUse1Hooks):
    """PyTorch's PrivateUse1 hooks: the backend is built and available (whether a PJRT
    platform starts is ``torch.pjrt.is_available()``'s question)."""

    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class Guard(torch._C._acc.DeviceGuard):
    """The guard PyTorch's Python registration takes; ``device/guard.py`` replaces it
    with the C++ one where that builds."""

    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1
