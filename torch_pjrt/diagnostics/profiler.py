"""``torch_pjrt.profiler``: the device side of a profile.

``torch.profiler.profile`` on pjrt records pjrt's own spans beside PyTorch's host events
(``runtime/profiling.py``: program runs with the ops they hold, compilations with their
cause, host syncs by line, transfers with their bytes). What the device did, kernel by
kernel with device time, is JAX's profiler's to record: :func:`device_trace` runs it
around the same code, writing a trace directory that TensorBoard's and xprof's profile
plugins open.

Example:
    >>> with torch_pjrt.profiler.device_trace("runs/step"), torch.profiler.profile() as p:
    ...     train_step()
    >>> p.export_chrome_trace("host.json")   # PyTorch's trace, pjrt's spans in it
    $ xprof --logdir runs/step                # the device's
"""

from __future__ import annotations

import contextlib
import os

import jax

__all__ = ["device_trace"]


@contextlib.contextmanager
def device_trace(log_dir, *, create_perfetto_trace: bool = False):
    """Record JAX's device trace of the code inside into ``log_dir`` (made if missing),
    as ``plugins/profile/<run>/*.xplane.pb``, the layout TensorBoard and xprof read.
    The device's pending work is waited for before the trace closes, so the last
    programs are in it. ``create_perfetto_trace``: also write a Perfetto trace there."""
    import torch

    os.makedirs(log_dir, exist_ok=True)
    with jax.profiler.trace(str(log_dir), create_perfetto_trace=create_perfetto_trace):
        try:
            yield log_dir
        finally:
            for index in range(torch.pjrt.device_count()):
                torch.pjrt.synchronize(index)
