"""Execution modes (debug, eager, fused) and training steps.

``debug``  runs each op synchronously: an error surfaces at the line that caused it;
           ``TORCH_PJRT_CHECK_NAN`` and ``TORCH_PJRT_CHECK_NUMERICS`` check every op.
``eager``  runs each op as its own cached XLA program, asynchronously: the host waits
           only when it reads values (``.item()``, ``.cpu()``, ``print``...).
``fused``  records ops and runs everything recorded as one cached XLA program when a
           value is needed on the host, at ``synchronize()``, at the end of a
           ``torch_pjrt.step()``, or when the recording reaches ``fused_max_ops``.

Steps also number a loop's iterations for strict mode (``diagnostics/strict.py``, which
listens to ``runtime.events`` and reads :func:`steps_done` and :func:`in_step`).

Example:
    >>> torch_pjrt.set_mode("fused")
    >>> for x, y in batches:
    ...     with torch_pjrt.step():
    ...         loss = loss_fn(model(x), y)
    ...         loss.backward()
    ...         opt.step()
    ...         opt.zero_grad()
"""

from __future__ import annotations

import contextlib
import threading

# NOTE: names, not the module: torch_pjrt's `config` attribute is the function
from torch_pjrt.config import MODES, _mode_listeners, config, settings
from torch_pjrt.runtime import events as metrics

__all__ = ["MODES", "get_mode", "in_step", "mode", "set_mode", "step", "steps_done"]


def get_mode() -> str:
    """The execution mode in effect in this thread: ``"debug"``, ``"eager"`` or
    ``"fused"`` (that of its innermost ``torch_pjrt.mode()`` block, else the process's)."""
    return settings.mode


def set_mode(name: str) -> None:
    """Switch the execution mode of the process: every thread and device, except a
    thread inside a ``torch_pjrt.mode()`` block, which keeps that block's mode until the
    block ends.

    Leaving ``fused`` first runs what was recorded, so values are exact across a switch.
    An unknown name raises ValueError.
    """
    settings.mode = name  # checked; _leave_fused runs first


def mode(name: str):
    """Run a block (or a function, as a decorator) in another execution mode, then
    switch back. The mode holds for the thread that entered the block only: other
    threads keep theirs, so two threads can run in different modes at once.

    Example:
        >>> with torch_pjrt.mode("debug"):
        ...     y = model(x)
    """
    return config(mode=name)


def _leave_fused(old: str, new: str) -> None:
    """Before a switch from fused mode (a ``set_mode`` or a ``mode()`` block entered or
    left), run what was recorded, so that the ops after the switch see exact values."""
    if old == "fused":
        from torch_pjrt.modes import fused

        fused.flush_all("mode switch")


_mode_listeners.append(_leave_fused)


# --- steps ----------------------------------------------------------------------------


_lock = threading.Lock()
# depth: nesting of step blocks; count: outermost steps entered
_steps = {"depth": 0, "count": 0}


class step(contextlib.ContextDecorator):
    """Mark one training (or inference) step; usable as ``with`` or as a decorator.

    Steps number the iterations of a loop for strict mode (which lets the first
    ``settings.strict_warmup`` steps compile and sync), and in fused mode the end of a
    step is a materialization point: what the step recorded runs as one program.
    """

    def __enter__(self):
        with _lock:
            _steps["depth"] += 1
            if _steps["depth"] == 1:
                _steps["count"] += 1
        metrics.count("steps")
        return self

    def __exit__(self, *exc):
        try:
            if _steps["depth"] == 1 and exc[0] is None and settings.mode == "fused":
                from torch_pjrt.modes import fused

                fused.flush_all("end of step")  # (still inside the step, for strict mode)
        finally:
            with _lock:
                _steps["depth"] -= 1
        return False


def _after_optimizer_step(optimizer, args, kwargs) -> None:
    """In fused mode, an optimizer step outside ``torch_pjrt.step()`` ends a step: a
    training loop's iterations then run as one cached program each, even when nothing
    reads a value every iteration (else the recording would span iterations and be cut
    by the size cap at a different op each time, compiling a new program each time)."""
    if settings.mode == "fused" and _steps["depth"] == 0:
        from torch_pjrt.modes import fused

        fused.flush_all("optimizer step")


def steps_done() -> int:
    """How many outermost ``torch_pjrt.step()`` blocks have been entered."""
    return _steps["count"]


def in_step() -> bool:
    """Whether this point is inside a ``torch_pjrt.step()`` block."""
    return _steps["depth"] > 0
