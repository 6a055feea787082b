"""Counters of what the device did: ops, compilations, host syncs, transfers, fallbacks.

``torch_pjrt.metrics``: the public view of the counters that ``torch_pjrt.runtime.events``
keeps (the layers below report there, not here). Cheap enough to be always on: each event
is one dict update.

Example:
    >>> torch_pjrt.metrics.reset()
    >>> y = (x.to("pjrt") * 2).sum().item()
    >>> torch_pjrt.metrics.as_dict()["host_syncs"]
    1
"""

from __future__ import annotations

from torch_pjrt.runtime.events import (
    add_seconds,
    as_dict,
    compilation,
    count,
    describe_change,
    fallback,
    host_sync,
    op,
    report,
    reset,
    tally,
    user_line,
)

__all__ = [
    "add_seconds",
    "as_dict",
    "compilation",
    "count",
    "describe_change",
    "fallback",
    "host_sync",
    "op",
    "report",
    "reset",
    "tally",
    "user_line",
]
