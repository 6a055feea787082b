"""``torch.pjrt.Stream`` and ``torch.pjrt.Event``: the stream API, for one in-order queue.

A pjrt device runs its programs in the order they were issued, with JAX tracking the
data each one waits for: there is one queue per device, so every stream of a device is
that queue. Code written for CUDA streams (FSDP2's all-gather and reduce-scatter
streams, overlap with events, ``with torch.cuda.stream(s)``) runs unchanged and gets
the same results; the overlap it asks for is XLA's to schedule.

- ``Stream(device, priority)``: ``wait_stream``, ``wait_event``, ``record_event`` and
  ``query`` are immediate (the queue is already in order); ``synchronize()`` waits for
  the device.
- ``Event(enable_timing=False)``: ``record()`` notes that it was recorded; with
  ``enable_timing=True`` it waits for the device first and notes the host time, so
  ``elapsed_time`` is the host time between two synchronized points, in milliseconds.
- ``current_stream``, ``default_stream``, ``stream(s)`` (a context manager) and
  ``set_stream``, as in ``torch.cuda``.
"""

from __future__ import annotations

import contextlib
import time

import jax
import torch

from torch_pjrt.runtime import transfer

__all__ = ["Event", "Stream", "current_stream", "default_stream", "set_stream", "stream"]


def _device(device=None) -> torch.device:
    from torch_pjrt.device import random as pjrt_random

    if device is None:
        return torch.device("pjrt", pjrt_random.current_device())
    if isinstance(device, int):
        return torch.device("pjrt", device)
    device = torch.device(device)
    if device.type != "pjrt":
        raise ValueError(f"Expected a pjrt device, got {device}")
    if device.index is None:
        return torch.device("pjrt", pjrt_random.current_device())
    return device


class Event:
    """A point in a pjrt device's queue (``torch.cuda.Event``'s interface)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False):  # fmt: skip
        self.enable_timing = enable_timing
        self.blocking = blocking
        self.device = None
        self._time = None
        self._arrays = ()  # the device's arrays when it was recorded
        self._copies = 0  # the asynchronous copies to the host issued before it

    def record(self, stream: Stream | None = None) -> None:
        """Mark the work issued so far (what ``synchronize()`` waits for, not the work
        issued after the record): see :func:`_issued_arrays`, and the copies to the host
        issued so far (``non_blocking=True``)."""
        stream = stream if stream is not None else current_stream()
        self.device = stream.device
        if self.enable_timing:
            torch.pjrt.synchronize(self.device)
            self._time = time.perf_counter()
            self._arrays = ()
        else:
            self._time = 0.0
            self._arrays = _issued_arrays(self.device)
        self._copies = transfer.host_copies_issued()

    def wait(self, stream: Stream | None = None) -> None:
        """Make ``stream`` wait for this event: immediate, the queue is in order."""

    def query(self) -> bool:
        """Whether the work the event marks is done (True for one never recorded)."""
        arrays = self._arrays
        return all(a.is_deleted() or a.is_ready() for a in arrays) and transfer.host_copies_done(
            self._copies
        )

    def synchronize(self) -> None:
        """Wait for the work issued before ``record()`` (later work goes on running)."""
        if self.device is None:
            return
        arrays, self._arrays = self._arrays, ()
        jax.block_until_ready([a for a in arrays if not a.is_deleted()])
        transfer.host_wait(self._copies, partial=True)

    def elapsed_time(self, end_event: Event) -> float:
        """Milliseconds between this event's ``record()`` and ``end_event``'s."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._time is None or end_event._time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._time - self._time) * 1000.0

    def __repr__(self) -> str:
        return f"<torch.pjrt.Event device={self.device}>"


def _issued_arrays(device: torch.device) -> list:
    """What has been issued to ``device`` until now, as the arrays to wait for: an output
    of the last program issued and the last copy to the device (``transfer.uploaded``,
    which holds a small one itself), when they are still held and are that device's (it
    runs its programs in order, and its copies in order); else every live array of the
    device, which costs about a millisecond a thousand arrays. Fused mode's recording
    runs first (a recorded op counts as issued)."""
    from torch_pjrt import runtime
    from torch_pjrt.modes import fused
    from torch_pjrt.runtime import executor

    fused.flush_all("event record")
    dev = runtime.device(device.index)
    found = []
    for ref in (executor.issued, transfer.uploaded):
        if ref is None:  # (nothing issued that way yet)
            continue
        x = ref()
        if x is None or x.is_deleted() or x.devices() != {dev}:  # (gone, or elsewhere)
            return runtime.live_arrays(device.index)
        found.append(x)
    return found


class Stream:
    """A pjrt device's queue (``torch.cuda.Stream``'s interface)."""

    def __init__(self, device=None, priority: int = 0, **kwargs):
        self.device = _device(device)
        self.priority = priority

    @property
    def device_index(self) -> int:
        return self.device.index

    @property
    def device_type(self) -> str:
        return "pjrt"

    def synchronize(self) -> None:
        torch.pjrt.synchronize(self.device)

    def query(self) -> bool:
        return True

    def wait_stream(self, stream: Stream) -> None:
        """Make this stream wait for ``stream``: immediate, one queue per device."""

    def wait_event(self, event: Event) -> None:
        """Make this stream wait for ``event``: immediate, one queue per device."""

    def record_event(self, event: Event | None = None) -> Event:
        event = event if event is not None else Event()
        event.record(self)
        return event

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream) and other.device == self.device

    def __hash__(self) -> int:
        return hash(("pjrt stream", self.device))

    def __repr__(self) -> str:
        return f"<torch.pjrt.Stream device={self.device} priority={self.priority}>"


def current_stream(device=None) -> Stream:
    return Stream(device)


def default_stream(device=None) -> Stream:
    return Stream(device)


@contextlib.contextmanager
def stream(stream: Stream | None):
    """Run the block on ``stream`` (the device's one queue)."""
    yield stream


def set_stream(stream: Stream) -> None:
    """Make ``stream`` current: every stream of a device is its one queue."""
