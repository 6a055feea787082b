"""What the device did, as it happens: counters, and the events a policy listens to.

The bottom of torch_pjrt: everything that runs programs, moves data or falls back
reports here; ``torch_pjrt.metrics`` (``diagnostics/metrics.py``) is the public view of
these counters. Cheap enough to be always on: each event is one dict update.

Three events also reach listeners (:func:`listen`), before they are counted:
``"fallback"`` (an op runs on the CPU; ``what`` is the op), ``"host sync"`` (the host
waits for the device; ``what`` is the user's line) and ``"compilation"`` (an XLA program
is built; ``what`` is its cause). Strict mode is such a listener
(``diagnostics/strict.py``): an exception a listener raises reaches the caller marked
``pjrt_event = True``, so the layers in between pass it on unchanged.

Example:
    >>> events.listen(lambda event, what: print(event, what))
    >>> events.host_sync()
    host sync /tmp/example.py:3
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Callable

from torch_pjrt.runtime import profiling

__all__ = [
    "add_seconds",
    "as_dict",
    "compilation",
    "compile_seconds",
    "count",
    "describe_change",
    "fallback",
    "host_sync",
    "listen",
    "op",
    "report",
    "reset",
    "tally",
    "unlisten",
    "user_line",
    "user_site",
]

_counters: collections.Counter = collections.Counter()
_fallbacks: collections.Counter = collections.Counter()
_ops: collections.Counter = collections.Counter()
_syncs: collections.Counter = collections.Counter()
_seconds: collections.Counter = collections.Counter()
# named tables of reasons: graph recompilations by cause, eager graph nodes by op...
_tables: collections.defaultdict = collections.defaultdict(collections.Counter)


def count(name: str, n: int = 1) -> None:
    _counters[name] += n


def op(name: str) -> None:
    _ops[name] += 1


def fallback(name: str) -> None:
    if _listeners:
        _emit("fallback", name)
    _fallbacks[name] += 1


# fn(event, what) for each "fallback", "host sync" and "compilation" event
_listeners: list[Callable[[str, str], None]] = []


def listen(fn: Callable[[str, str], None]) -> None:
    """Call ``fn(event, what)`` for every ``"fallback"``, ``"host sync"`` and
    ``"compilation"`` event from now on (once, however often it is passed)."""
    if fn not in _listeners:
        _listeners.append(fn)


def unlisten(fn: Callable[[str, str], None]) -> None:
    """Stop calling ``fn`` (nothing happens when it was not listening)."""
    if fn in _listeners:
        _listeners.remove(fn)


def _emit(event: str, what: str) -> None:
    for fn in tuple(_listeners):
        try:
            fn(event, what)
        except Exception as exc:
            exc.pjrt_event = True  # a policy's error: the layers below pass it on as is
            raise


_partial = False  # (set while a partial host sync is told to listeners)


def sync_is_partial() -> bool:
    """Whether the host sync being told to listeners waits for part of the work only."""
    return _partial


def user_line() -> str:
    """The innermost stack frame outside torch and torch_pjrt, as 'file:line'."""
    site = user_site()
    return "<unknown>" if site is None else f"{site[0]}:{site[1]}"


_internal: dict = {}  # code object -> whether it belongs to torch or torch_pjrt


def user_site() -> tuple[str, int] | None:
    """The innermost stack frame outside torch and torch_pjrt, as ``(file, line)`` (or
    None): :func:`user_line` without the formatting, for hot paths that keep it."""
    frame = sys._getframe(1)
    internal = _internal
    while frame is not None:
        code = frame.f_code
        inside = internal.get(code)
        if inside is None:
            if len(internal) > 4096:  # (generated code would keep it growing)
                internal.clear()
            name = code.co_filename
            inside = internal[code] = "/torch/" in name or "/torch_pjrt/" in name
        if not inside:
            return code.co_filename, frame.f_lineno
        frame = frame.f_back
    return None


def tally(table: str, key: str, n: int = 1) -> None:
    """Count ``key`` in the named table (shown by :func:`report`)."""
    _tables[table][key] += n


def add_seconds(name: str, seconds: float) -> None:
    _seconds[name] += seconds


def compile_seconds(counters: dict | None = None) -> float:
    """Seconds spent building XLA programs so far, every scope together (the
    ``<scope>_compile_seconds``; ``xla_compile_seconds``, XLA's part of them as JAX
    reports it, is not added again); of ``counters`` (an :func:`as_dict`) when given."""
    table = _seconds if counters is None else counters
    return sum(
        v
        for name, v in table.items()
        if name.endswith("_compile_seconds") and name != "xla_compile_seconds"
    )


def compilation(scope: str, kind: str | None, seconds: float, cause: str) -> None:
    """An XLA program was built: count it (in all and by kind), its time and its cause.

    Example: ``compilation("graph", "forward", 1.2, "first call")`` counts
    ``compilations`` (every scope), ``graph_compilations``,
    ``graph_forward_compilations``, ``graph_compile_seconds`` and the cause in the
    ``graph_compile_causes`` table.
    """
    if _listeners:
        _emit("compilation", cause)
    _counters["compilations"] += 1
    _counters[f"{scope}_compilations"] += 1
    if kind is not None:
        _counters[f"{scope}_{kind}_compilations"] += 1
    _seconds[f"{scope}_compile_seconds"] += seconds
    _tables[f"{scope}_compile_causes"][cause] += 1


def describe_change(old, new) -> str:
    """Why a program is built again: the first difference between two signatures.

    A signature is a sequence of ``(label, value)`` pairs (``("input 0", aval)``,
    ``("argument dim", 1)``); None is the signature before the first call.
    """
    if old is None:
        return "first call"
    for (label, a), (_, b) in zip(old, new):
        if a != b:
            return f"{label} changed from {_short(a)} to {_short(b)}"
    if len(old) != len(new) or [x[0] for x in old] != [x[0] for x in new]:
        return "the arguments changed (number or kinds)"
    return "new argument signature"


def _short(v) -> str:
    return v.str_short() if hasattr(v, "str_short") else repr(v)


def host_sync(partial: bool = False) -> None:
    """The host waits for the device: told to listeners (``runtime.asserts`` reads the
    value checks the device made since the last wait), counted by line. ``partial``: it
    waits for part of the device's work only (an Event's ``synchronize``), so the
    checks read are those of programs that are done (:func:`sync_is_partial`)."""
    global _partial
    line = user_line()
    if _listeners:
        _partial = partial
        try:
            _emit("host sync", line)
        finally:
            _partial = False
    if profiling.active():
        with profiling.span(f"pjrt::host_sync {line}"):
            pass  # (a mark in the trace: the wait itself is the transfer's span)
    _counters["host_syncs"] += 1
    _syncs[line] += 1


def reset() -> None:
    """Set every counter back to zero."""
    for c in (_counters, _fallbacks, _ops, _syncs, _seconds):
        c.clear()
    _tables.clear()


def as_dict() -> dict:
    """All counters: totals, ops per lowering, CPU fallbacks per op, host syncs per line."""
    out = dict(_counters)
    for key in ("host_syncs", "compilations", "transfers_to_device", "transfers_to_host"):
        out.setdefault(key, 0)
    out["ops"] = dict(_ops)
    out["fallbacks"] = dict(_fallbacks)
    out["host_syncs_by_line"] = dict(_syncs)
    out.update({name: round(v, 6) for name, v in _seconds.items()})
    out.update({name: dict(table) for name, table in _tables.items()})
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
        *((name.replace("_", " "), dict(t)) for name, t in sorted(_tables.items())),
        ("ops", d["ops"]),
    ):
        if table:
            lines.append(f"  {title}:")
            for name, n in sorted(table.items(), key=lambda kv: -kv[1])[:30]:
                lines.append(f"    {n:8d}  {name}")
    return "\n".join(lines)
