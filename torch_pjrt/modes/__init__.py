"""Execution modes (debug, eager, fused), training steps, and strict mode.

``debug``  runs each op synchronously: an error surfaces at the line that caused it;
           ``TORCH_PJRT_CHECK_NAN`` and ``TORCH_PJRT_CHECK_NUMERICS`` check every op.
``eager``  runs each op as its own cached XLA program, asynchronously: the host waits
           only when it reads values (``.item()``, ``.cpu()``, ``print``...).
``fused``  records ops and runs everything recorded as one cached XLA program when a
           value is needed on the host, at ``synchronize()``, at the end of a
           ``torch_pjrt.step()``, or when the recording reaches ``fused_max_ops``.

Strict mode turns silent slowdowns into errors: a CPU fallback anywhere, and a host
sync or a new compilation inside a ``torch_pjrt.step()`` after the warm-up steps.

Example:
    >>> torch_pjrt.set_mode("fused")
    >>> with torch_pjrt.strict():
    ...     for x, y in batches:
    ...         with torch_pjrt.step():
    ...             loss = loss_fn(model(x), y)
    ...             loss.backward()
    ...             opt.step()
    ...             opt.zero_grad()
"""

from __future__ import annotations

import contextlib
import threading

from torch_pjrt.config import settings
from torch_pjrt.diagnostics import metrics

__all__ = ["MODES", "StrictModeError", "get_mode", "mode", "set_mode", "step", "strict"]

MODES = ("debug", "eager", "fused")


def _check(name: str) -> str:
    if name not in MODES:
        raise ValueError(f"torch_pjrt mode must be one of {', '.join(MODES)}, but got {name!r}")
    return name


def get_mode() -> str:
    """The current execution mode: ``"debug"``, ``"eager"`` or ``"fused"``."""
    return settings.mode


def set_mode(name: str) -> None:
    """Switch the execution mode for the whole process (every thread and device).

    Leaving ``fused`` first runs what was recorded, so values are exact across a switch.
    """
    _check(name)
    if settings.mode == "fused" and name != "fused":
        from torch_pjrt.modes import fused

        fused.flush_all("mode switch")
    settings.mode = name


@contextlib.contextmanager
def mode(name: str):
    """Run a block in another execution mode, then switch back.

    Example:
        >>> with torch_pjrt.mode("debug"):
        ...     y = model(x)
    """
    previous = get_mode()
    set_mode(name)
    try:
        yield
    finally:
        set_mode(previous)


# --- steps and strict mode ------------------------------------------------------------


class StrictModeError(RuntimeError):
    """A silent slowdown that strict mode turns into an error."""


_lock = threading.Lock()
# depth: nesting of step blocks; count: outermost steps entered; strict_from: the count
# when strict mode was turned on (its warm-up counts from there)
_steps = {"depth": 0, "count": 0, "strict_from": 0}


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


def _in_checked_step() -> bool:
    return _steps["depth"] > 0 and _steps["count"] - _steps["strict_from"] > settings.strict_warmup


def _step_number() -> int:
    """The current step, counted from when strict mode was turned on."""
    return _steps["count"] - _steps["strict_from"]


def _watch(event: str, what: str) -> None:
    """Called by :mod:`torch_pjrt.metrics` for every fallback, host sync and
    compilation while strict mode is on."""
    if event == "fallback":
        raise StrictModeError(
            f"torch_pjrt strict mode: '{what}' has no pjrt lowering and would run on the CPU "
            f"(at {metrics.user_line()}). Run it outside strict mode to see how often it "
            "happens, or replace it with ops that have lowerings (docs/fallback.md)."
        )
    if not _in_checked_step():
        return
    if event == "host sync":
        raise StrictModeError(
            f"torch_pjrt strict mode: host sync inside step {_step_number()} at {what}: the "
            "host waits for the device here (.item(), .cpu(), .tolist(), print, bool(tensor), "
            "synchronize, or a data-dependent shape). Move it out of the step, or read the "
            "value every N steps outside torch_pjrt.step()."
        )
    if event == "compilation":
        raise StrictModeError(
            f"torch_pjrt strict mode: new XLA compilation inside step {_step_number()} after "
            f"the {settings.strict_warmup} warm-up steps, at {metrics.user_line()}: {what}. "
            "Shapes, dtypes or non-tensor arguments changed from the steps before; keep them "
            "fixed (pad to buckets), or raise settings.strict_warmup."
        )


@contextlib.contextmanager
def strict(enabled: bool = True):
    """Raise :class:`StrictModeError` on CPU fallbacks, and on host syncs and new
    compilations inside a ``torch_pjrt.step()`` after the warm-up steps
    (``settings.strict_warmup``, default 2). ``TORCH_PJRT_STRICT=1`` turns it on
    for the whole process."""
    previous = settings.strict
    if enabled and not previous:
        _steps["strict_from"] = _steps["count"]
    settings.strict = enabled
    try:
        yield
    finally:
        settings.strict = previous


_check(settings.mode)
