"""Strict mode: silent slowdowns turned into errors.

A CPU fallback anywhere, and a host sync or a new compilation inside a
``torch_pjrt.step()`` after the warm-up steps, raise :class:`StrictModeError`. Strict mode
is a listener of ``runtime.events`` (:func:`_watch`, registered at import): the layers
that report those events know nothing of it, and pass its error on unchanged (events
marks it ``pjrt_event``).

Example:
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

from torch_pjrt import modes

# NOTE: names, not the module: torch_pjrt's `config` attribute is the function
from torch_pjrt.config import _check, config, settings
from torch_pjrt.runtime import events

__all__ = ["StrictModeError", "strict"]


class StrictModeError(RuntimeError):
    """A silent slowdown that strict mode turns into an error."""


# the number of steps entered when strict mode was turned on (its warm-up counts from there)
_strict_from = [0]


def _step_number() -> int:
    """The current step, counted from when strict mode was turned on."""
    return modes.steps_done() - _strict_from[0]


def _in_checked_step() -> bool:
    return modes.in_step() and _step_number() > settings.strict_warmup


def _watch(event: str, what: str) -> None:
    """The ``runtime.events`` listener: raises for a fallback, host sync or compilation
    that strict mode forbids (none while it is off)."""
    if not settings.strict:
        return
    if event == "fallback":
        raise StrictModeError(
            f"torch_pjrt strict mode: '{what}' has no pjrt lowering and would run on the CPU "
            f"(at {events.user_line()}). Run it outside strict mode to see how often it "
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
            f"the {settings.strict_warmup} warm-up steps, at {events.user_line()}: {what}. "
            "Shapes, dtypes or non-tensor arguments changed from the steps before; keep them "
            "fixed (pad to buckets), or raise settings.strict_warmup."
        )


# NOTE: always listening (one call and a settings read per event: these events are the
# slow ones anyway), so TORCH_PJRT_STRICT=1 and torch_pjrt.config(strict=True) need
# nothing more
events.listen(_watch)


def strict(enabled: bool = True):
    """Raise :class:`StrictModeError` on CPU fallbacks, and on host syncs and new
    compilations inside a ``torch_pjrt.step()`` after the warm-up steps
    (``settings.strict_warmup``, default 2). ``TORCH_PJRT_STRICT=1`` turns it on
    for the whole process; this block (or decorated function), for the thread that
    enters it."""
    return _strict(_check("strict", enabled))  # a bad value raises at the call


@contextlib.contextmanager
def _strict(enabled: bool):
    if enabled and not settings.strict:  # the warm-up counts from here
        _strict_from[0] = modes.steps_done()
    with config(strict=enabled):
        yield
