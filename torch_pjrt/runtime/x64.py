"""64-bit JAX types for the calls of one thread, cheaply.

torch_pjrt runs every program with ``jax.enable_x64(True)`` (int64 and float64 are
PyTorch dtypes) and never sets JAX's global config. The context manager costs about
1 us per call, which is a twentieth of a small eager op; the two calls it makes
(swap the thread-local value in, set the old one back) cost a tenth of that. The hot
paths use them::

    prev = x64.on()
    try:
        out = program(...)
    finally:
        x64.restore(prev)

Elsewhere ``with jax.enable_x64(True)`` is the plainer spelling of the same thing.
"""

from __future__ import annotations

import functools

import jax

__all__ = ["on", "restore"]

try:  # NOTE: JAX's own state object; the context manager's fallback keeps other versions working
    from jax._src.config import enable_x64 as _state

    if getattr(_state, "_update_thread_local_hook", None) is not None:
        raise ImportError("the x64 state has a thread-local hook")
    _swap, _set = _state.swap_local, _state.set_local
except (ImportError, AttributeError):
    _swap = _set = None


def _on_slow():
    manager = jax.enable_x64(True)
    manager.__enter__()
    return manager


def _restore_slow(manager) -> None:
    manager.__exit__(None, None, None)


if _swap is not None:
    on = functools.partial(_swap, True)
    restore = _set
else:  # pragma: no cover  (another JAX version)
    on, restore = _on_slow, _restore_slow
