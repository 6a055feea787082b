"""pjrt's events in ``torch.profiler``'s trace, beside PyTorch's own.

While a ``torch.profiler.profile`` (or ``torch.autograd.profiler.profile``) records, the
layers that run programs, compile, wait for the device and move data open spans here,
as ``record_function`` does: they land in the same trace, in ``key_averages()`` and in
``export_chrome_trace``:

- ``pjrt::run <program>``: one XLA program run (dispatch; the device runs it
  asynchronously), with ``ops`` (what the program holds) and ``device``;
- ``pjrt::compile <program>``: a trace and XLA compilation, inside the run that made it,
  with its ``cause``;
- ``pjrt::host_sync <file:line>``: the host waiting for the device, by the user's line;
- ``pjrt::to_device`` / ``pjrt::to_host``: a transfer, with its ``bytes``.

The attributes (``ops``, ``cause``, ``bytes``...) are recorded as PyTorch records input
shapes: with ``record_shapes=True``. Nothing is done while no profiler records (one
attribute read per event). Device-side time comes from JAX's profiler
(:func:`torch_pjrt.profiler.device_trace`), in its own trace.
"""

from __future__ import annotations

import collections

import torch
import torch.autograd.profiler as _autograd_profiler

__all__ = ["active", "contents", "span", "torch_profiler"]

_Fast = torch._C._profiler._RecordFunctionFast
_NO_INPUTS: list = []


# (hot paths read ``torch_profiler._is_profiler_enabled`` themselves: no call)
torch_profiler = _autograd_profiler


def active() -> bool:
    """Whether a PyTorch profiler is recording now."""
    return _autograd_profiler._is_profiler_enabled


def span(name: str, **attributes):
    """A context manager: a span named ``name`` in the profiler's trace, with
    ``attributes`` (strings and numbers) as its arguments."""
    return _Fast(name, _NO_INPUTS, attributes)


def contents(names) -> str:
    """``["aten.mm", "aten.add", "aten.mm"]`` as ``"aten.mm x2, aten.add"`` (most
    frequent first, at most 24 kinds)."""
    counted = collections.Counter(names).most_common()
    parts = [name if n == 1 else f"{name} x{n}" for name, n in counted[:24]]
    if len(counted) > 24:
        parts.append(f"... {len(counted) - 24} more kinds")
    return ", ".join(parts)
