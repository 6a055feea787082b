"""Checks of values on the device: PyTorch's errors for bad indices, targets, divisors.

CPU PyTorch raises when an index is past the end, a class target outside the classes, an
integer divided by zero; an XLA program cannot raise. So a lowering that validates
values states the check while it traces (:func:`check`): a boolean "all valid" and the
first bad values, computed inside the program beside its results. The executor returns
them as extra outputs of that program, a :class:`Checked` (:func:`tracing` collects them
per trace), and whoever called the program hands them here (:func:`unpack`) with the op
and the user's line. Nothing
waits: the flags are read at the next point where the host waits anyway (``.item()``,
``.cpu()``, ``print``, ``synchronize()``: every ``events.host_sync``), as CUDA's
asynchronous device-side asserts are, and the first failed check raises PyTorch's own
exception and message there (``IndexError: index 7 is out of bounds for dimension 0
with size 5``), with a note naming the op and the line that called it. In debug mode an
op's checks are read at the op. The device stays usable; the results of the failed op
raise the same error whenever they are read (:func:`refuse_read`).

``TORCH_PJRT_CHECKS=0`` (``config(checks=False)``) traces no checks at all: no extra
outputs, nothing read (peak speed, PyTorch's errors not raised).

Example, in a lowering:
    >>> ok = (index >= -size) & (index < size)
    >>> asserts.check(ok, IndexError, "index {} is out of bounds for dimension 0 with "
    ...               f"size {size}", asserts.first_bad(index, ok))
"""

from __future__ import annotations

import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np

from torch_pjrt.config import settings
from torch_pjrt.runtime import events

__all__ = [
    "Checked",
    "check",
    "expect",
    "first_bad",
    "refuse_read",
    "tracing",
    "unpack",
    "verify",
]

_local = threading.local()


class _Scope:
    """The checks one trace states: their rows (its extra output) and what each means."""

    __slots__ = ("rows", "specs")

    def __init__(self):
        self.rows = []  # per check: [ok, *values], int64 scalars
        self.specs = []  # per check: (exception type, message template)

    def returning(self, results):
        """What the traced program returns: ``results``, or a :class:`Checked` of them
        and its checks, packed into one int64 array (a row per check: 1 where it held,
        then its values; one output, however many checks: each output costs ~1 us a
        call)."""
        if not self.specs:
            return results
        width = max(len(r) for r in self.rows)
        zero = jnp.zeros((), jnp.int64)
        packed = jnp.stack([jnp.stack(r + [zero] * (width - len(r))) for r in self.rows])
        return Checked(results, packed, tuple(self.specs))


@jax.tree_util.register_pytree_node_class
class Checked:
    """A program's results with its checks: ``flags`` (an int64 array, a tracer or a
    pending value: a row per check, 1 where it held, then its values) and ``specs``
    (per check, ``(exception type, message template, label)``, static)."""

    __slots__ = ("results", "flags", "specs")

    def __init__(self, results, flags, specs):
        self.results, self.flags, self.specs = results, flags, specs

    def tree_flatten(self):
        return (self.results, self.flags), self.specs

    @classmethod
    def tree_unflatten(cls, specs, children):
        return cls(children[0], children[1], specs)


class tracing:
    """``with tracing() as scope``: collect the checks the code inside states (an
    executor trace). ``scope.arrays`` and ``scope.specs`` are empty when none were."""

    __slots__ = ("scope", "outer")

    def __enter__(self) -> _Scope:
        self.outer = getattr(_local, "scope", None)
        self.scope = _local.scope = _Scope()
        return self.scope

    def __exit__(self, *exc) -> None:
        _local.scope = self.outer


def check(ok, error: type, message: str, *values) -> None:
    """While a program traces: raise ``error(message.format(*values))`` when ``ok`` (a
    boolean array) is not all true. ``values``: integer scalars to format in (the first
    bad ones, :func:`first_bad`). Outside an executor's trace (a shape probe), nothing."""
    scope = getattr(_local, "scope", None)
    if scope is None or not settings.checks:
        return
    row = [jnp.all(ok).astype(jnp.int64)]
    for v in values:
        v = jnp.asarray(v)
        if not jnp.issubdtype(v.dtype, jnp.integer):
            raise TypeError(f"asserts.check: values are integers, not {v.dtype}")
        row.append(v.astype(jnp.int64).reshape(()))
    scope.rows.append(row)
    scope.specs.append((error, message, getattr(_local, "label", None)))


def label(where) -> object:
    """While a program traces: the checks stated from now on come from ``where`` (an
    ``(op, line)`` pair: a compiled graph's node); returns the label before it."""
    before = getattr(_local, "label", None)
    _local.label = where
    return before


def first_bad(values, ok):
    """The first of ``values`` where ``ok`` is false (broadcast together, row-major)."""
    values, ok = jnp.broadcast_arrays(jnp.asarray(values), jnp.asarray(ok))
    if values.size == 0:
        return jnp.zeros((), values.dtype)
    return values.reshape(-1)[jnp.argmin(ok.reshape(-1))]


# --- what the host waits for ----------------------------------------------------------


class _Expected:
    """One program's checks: its flag arrays (or pending values), what they mean, the
    op, where it was called, and weak references to its results."""

    __slots__ = ("flags", "specs", "op", "line", "results")

    def __init__(self, flags, specs, op, line, results):
        self.flags, self.specs, self.op, self.line = flags, specs, op, line
        self.results = results


_MAX_EXPECTED = 4096  # checked programs held before their flags are read unasked
_expected: list[_Expected] = []
_poisoned: dict = {}  # id(result array) -> the error its reads raise
try:  # NOTE: the class of JAX's arrays, for a test cheaper than isinstance
    from jax._src.array import ArrayImpl as _ArrayImpl
except ImportError:  # pragma: no cover - a JAX that moved it
    _ArrayImpl = jax.Array


def unpack(checked: Checked, op: str, line: str | None = None):
    """The results of a program that ran ``op`` with checks; the checks are read at the
    next host sync (the results refused to reads if one fails). ``line``: where the op
    was called (default: the user's line now)."""
    results = checked.results
    site = events.user_site() if line is None else line
    if capture_sink is not None:  # a graph capture: its replays report them
        capture_sink(checked.flags, checked.specs, op, site)
        return results
    expect(checked.flags, checked.specs, op, site, results)
    return results


# NOTE: set by modes.capture while a graph is captured: (flags, specs, op, line) -> None
capture_sink = None


def expect(flags, specs, op: str, line, results) -> None:
    """Checks a program ran for ``op`` (called at ``line``: 'file:line' or
    ``events.user_site``'s pair), read at the next host sync: ``flags`` (their packed
    array or pending value) and ``specs`` (:class:`Checked`'s); ``results`` (a tree of
    arrays or pending values, or a function giving them later: a captured graph's, whose
    outputs are many) are refused to reads if one fails."""
    if callable(results):
        refs = results
    else:
        leaves = (
            (results,) if results.__class__ is _ArrayImpl else jax.tree_util.tree_leaves(results)
        )
        refs = []
        for r in leaves:
            if r.__class__ is _ArrayImpl:
                refs.append(weakref.ref(r))
            elif getattr(r, "concrete", None) is not None:  # (a pending value: held, as
                refs.append(_Held(r))  # the array it becomes replaces it in its storage)
    if flags.__class__ is _ArrayImpl:  # on its way to the host as soon as it is computed
        flags.copy_to_host_async()
    _expected.append(_Expected(flags, specs, op, line, refs))  # (atomic)
    if settings.mode == "debug":  # synchronous: at the op
        verify(at_op=True)
    elif len(_expected) > _MAX_EXPECTED:  # a loop that never waits: read them now
        verify()


class _Held:
    """A strong reference with a weak reference's call."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __call__(self):
        return self.value


def _value(x):
    concrete = getattr(x, "concrete", None)  # (a fused mode's pending value)
    return concrete() if concrete is not None else x


def verify(at_op: bool = False) -> None:
    """Read every check expected so far; poison the results of each failed one, and raise
    the first one's error (marked ``pjrt_event``: the layers in between pass it on as it
    is). Each program's flags started for the host when it was called (see :func:`expect`):
    reading them here costs about a microsecond each."""
    if not _expected:
        return
    todo = _expected[:]
    del _expected[: len(todo)]  # (what other threads append meanwhile stays)
    records, packed = [], []
    for record in todo:
        try:
            packed.append(_value(record.flags))
        except Exception:  # noqa: BLE001  (the program itself failed: its reader reports it)
            continue
        records.append(record)
    error = None
    for record, flags in zip(records, packed):
        rows = np.asarray(flags)  # (copied to the host already, or now)
        if rows[:, 0].all():
            continue
        for row, (kind, message, where) in zip(rows, record.specs):
            if row[0]:
                continue
            failed = kind(message.format(*[int(v) for v in row[1:]]))
            failed.pjrt_event = True
            when = (
                "(debug mode: at the op)"
                if at_op
                else f"reported at the host's next wait, {events.user_line()} "
                "(TORCH_PJRT_MODE=debug raises at the op)"
            )
            op, line = (
                (record.op, record.line)
                if where is None
                else (
                    f"{where[0]} (in {record.op})",
                    where[1] or record.line,
                )
            )
            if line is None or isinstance(line, tuple):  # (events.user_site's)
                line = "<unknown>" if line is None else f"{line[0]}:{line[1]}"
            if hasattr(failed, "add_note"):
                failed.add_note(f"pjrt: checked on the device in {op}, called at {line}; {when}")
            _poison(record, failed)
            error = error or failed
            break
    if error is not None:
        raise error


def _poison(record: _Expected, error: Exception) -> None:
    found = record.results
    for r in found() if callable(found) else [ref() for ref in found]:
        if r is None:
            continue
        r = getattr(r, "value", r)  # (a pending value: the array it became)
        if r is not None:
            key = id(r)
            _poisoned[key] = error
            weakref.finalize(r, _poisoned.pop, key, None)


def refuse_read(array) -> None:
    """Raise the error of the failed check that made ``array``, if one did."""
    if _poisoned:
        error = _poisoned.get(id(array))
        if error is not None:
            raise type(error)(*error.args) from error


def _on_event(event: str, what: str) -> None:
    if event == "host sync":
        verify()


events.listen(_on_event)  # (the hook of every host sync)
