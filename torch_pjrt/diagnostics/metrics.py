"""Counters of what the device did: ops, compilations, host syncs, transfers, fallbacks.

Cheap enough to be always on: each event is one dict update.

Example:
    >>> torch_pjrt.metrics.reset()
    >>> y = (x.to("pjrt") * 2).sum().item()
    >>> torch_pjrt.metrics.as_dict()["host_syncs"]
    1
"""

from __future__ import annotations

import collections
import sys

__all__ = ["as_dict", "count", "fallback", "host_sync", "report", "reset"]

_counters: collections.Counter = collections.Counter()
_fallbacks: collections.Counter = collections.Counter()
_ops: collections.Counter = collections.Counter()
_syncs: collections.Counter = collections.Counter()


def count(name: str, n: int = 1) -> None:
    _counters[name] += n


def op(name: str) -> None:
    _ops[name] += 1


def fallback(name: str) -> None:
    _fallbacks[name] += 1


def _user_line() -> str:
    """The innermost stack frame outside torch and torch_pjrt, as 'file:line'."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if "/torch/" not in filename and "/torch_pjrt/" not in filename:
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


def host_sync() -> None:
    _counters["host_syncs"] += 1
    _syncs[_user_line()] += 1


def reset() -> None:
    """Set every counter back to zero."""
    for c in (_counters, _fallbacks, _ops, _syncs):
        c.clear()


def as_dict() -> dict:
    """All counters: totals, ops per lowering, CPU fallbacks per op, host syncs per line."""
    out = dict(_counters)
    for key in ("host_syncs", "compilations", "transfers_to_device", "transfers_to_host"):
        out.setdefault(key, 0)
    out["ops"] = dict(_ops)
    out["fallbacks"] = dict(_fallbacks)
    out["host_syncs_by_line"] = dict(_syncs)
    return out


def report() -> str:
    """A readable summary of :func:`as_dict`."""
    d = as_dict()
    lines = ["torch_pjrt metrics"]
    for key in sorted(k for k, v in d.items() if not isinstance(v, dict)):
        lines.append(f"  {key}: {d[key]}")
    for title, table in (
        ("CPU fallbacks", d["fallbacks"]),
        ("host syncs by line", d["host_syncs_by_line"]),
        ("ops", d["ops"]),
    ):
        if table:
            lines.append(f"  {title}:")
            for name, n in sorted(table.items(), key=lambda kv: -kv[1])[:30]:
                lines.append(f"    {n:8d}  {name}")
    return "\n".join(lines)
