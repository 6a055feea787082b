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
op's checks are read at the op. The device stays usable; the results of the failed op,
and every value computed from them (:func:`derive`), raise the same error whenever they
are read (:func:`refuse_read`).

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
    "became",
    "derive",
    "follow",
    "followed",
    "marked",
    "origins",
    "expect",
    "first_bad",
    "refuse_read",
    "tracing",
    "unpack",
    "verify",
    "watching",
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
    op, where it was called, and references to its results."""

    __slots__ = ("flags", "specs", "op", "line", "results")

    def __init__(self, flags, specs, op, line, results):
        self.flags, self.specs, self.op, self.line = flags, specs, op, line
        self.results = results


_MAX_EXPECTED = 4096  # checked programs held before their flags are read unasked
_MAX_TRACKED = 1 << 16  # values followed (results and values computed from them), the same
_expected: list[_Expected] = []
_poisoned: dict = {}  # id(result array) -> the error its reads raise
# id(array or pending value) -> (a weak reference to it, the _Expected records it comes
# from): the results of checks not read yet, and the values computed from them (derive)
_tracked: dict = {}
try:  # NOTE: the class of JAX's arrays, for a test cheaper than isinstance
    from jax._src.array import ArrayImpl as _ArrayImpl
except ImportError:  # pragma: no cover - a JAX that moved it
    _ArrayImpl = jax.Array
# NOTE: jax.Array.copy_to_host_async costs ~6-12 us a call (it makes the array's sharding
# to see whether it is on one device); the copy itself, of an array on one device, ~0.5 us.
# Until arrays may be laid out over meshes (executor.use_meshes), every array is.
one_device = True
_copy_one = getattr(_ArrayImpl, "_copy_single_device_array_to_host_async", None)


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
        if one_device and _copy_one is not None:
            _copy_one(flags)
        else:
            flags.copy_to_host_async()
    record = _Expected(flags, specs, op, line, refs)
    if not callable(refs):
        for ref in refs:
            _tracked[id(ref())] = (ref, (record,))
    _expected.append(record)  # (atomic)
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
    followed = list(_tracked.values())
    if not _expected:
        _tracked.clear()
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
            _poison(record, failed, followed)
            error = error or failed
            break
    if error is not None:
        raise error


def _poison(record: _Expected, error: Exception, followed: list) -> None:
    """Refuse reads of ``record``'s results and of the values computed from them
    (``followed``: the ``(reference, sources)`` of :data:`_tracked`)."""
    found = record.results
    results = list(found()) if callable(found) else [ref() for ref in found]
    results += [ref() for ref, sources in followed if record in sources]
    for r in results:
        if r is not None:
            _poison_value(r, error)


def _poison_value(r, error: Exception) -> None:
    """Reads of ``r`` (an array, or a pending value and the array it becomes) raise
    ``error``."""
    if r.__class__ is not _ArrayImpl:  # (a pending value)
        if r.value is None:  # not computed yet: marked when it is (see became)
            _mark(r, error)
            return
        r = r.value
    _mark(r, error)


def _mark(r, error: Exception) -> None:
    key = id(r)
    if key not in _poisoned:
        weakref.finalize(r, _poisoned.pop, key, None)
    _poisoned[key] = error


def watching() -> bool:
    """Whether values computed now may come from a check not read yet or failed (then
    clients call :func:`derive` and :func:`became`)."""
    return bool(_tracked or _poisoned)


def _origins(inputs, found: list) -> None:
    """Append to ``found`` the sources (a tuple each: unread checks' records, or a failed
    one's error) of the arrays and pending values among ``inputs`` (nested lists and
    tuples). NOTE: on every program call while a check is unread: plain loops, the
    lookup written out for a list's items too (a call per item would cost more than the
    lookup)."""
    values, tracked, poisoned = VALUE_CLASSES, _tracked, _poisoned
    for a in inputs:
        cls = a.__class__
        if cls is list or cls is tuple:
            for b in a:
                c = b.__class__
                if c in values:
                    entry = tracked.get(id(b))
                    if entry is not None and entry[0]() is b:
                        found.append(entry[1])
                    elif poisoned and id(b) in poisoned:
                        found.append((poisoned[id(b)],))
                elif c is list or c is tuple:
                    _origins(b, found)
        elif cls in values:
            entry = tracked.get(id(a))
            if entry is not None and entry[0]() is a:
                found.append(entry[1])
            elif poisoned and id(a) in poisoned:
                found.append((poisoned[id(a)],))


# the classes of values derive follows: JAX's arrays, and fused mode's pending values
# (which torch_pjrt.modes.fused adds)
VALUE_CLASSES = {_ArrayImpl}


def origins(inputs) -> tuple:
    """What ``inputs`` (arrays, pending values, nested lists and tuples of them; other
    leaves ignored) were computed from: the unread checks (records) and failed ones
    (errors) among their sources, each once; empty for values no check made."""
    found: list = []
    _origins(inputs, found)
    if not found:
        return ()
    first = found[0]
    if len(found) == 1 or all([f is first for f in found]):
        return first
    merged: list = []  # (a foreach op's list of values from the same checks: once each)
    for sources in found:
        for origin in sources:
            if origin not in merged:
                merged.append(origin)
    return tuple(merged)


def followed() -> list:
    """``(value, sources)`` of every value followed now (results of unread checks and
    values computed from them), for clients that trace lineage themselves."""
    out = []
    for ref, sources in list(_tracked.values()):
        value = ref()
        if value is not None:
            out.append((value, sources))
    return out


def marked(values) -> list:
    """``(i, sources)`` for each of ``values`` (a flat sequence) that is followed or
    refused (:func:`origins` of the one value)."""
    out = []
    tracked, poisoned = _tracked, _poisoned
    for i, a in enumerate(values):
        entry = tracked.get(id(a))
        if entry is not None and entry[0]() is a:
            out.append((i, entry[1]))
        elif poisoned and id(a) in poisoned:
            out.append((i, (poisoned[id(a)],)))
    return out


def follow(values, sources: tuple) -> None:
    """``values`` (arrays or pending values) were computed from ``sources``
    (:func:`origins`): they raise a failed source's error when read, now or when an
    unread one is read and fails."""
    records, error = sources, None
    for origin in sources:
        if origin.__class__ is not _Expected:  # a failed check's error: refused at once
            records = tuple([o for o in sources if o.__class__ is _Expected])
            error = origin
            break
    tracked = _tracked
    for o in values:
        if records:
            tracked[id(o)] = (weakref.ref(o), records)
        if error is not None:
            _poison_value(o, error)
    if len(_tracked) > _MAX_TRACKED:  # a long run that never waits: read the checks now
        verify()


def derive(inputs, outputs) -> None:
    """``outputs`` (a tree of arrays or pending values) were computed from ``inputs``
    (see :func:`origins`): if an input is the result of a check not read yet, or of one
    that failed, so are the outputs (their reads raise its error). Called by the
    executor for every program call while :func:`watching`."""
    sources = origins(inputs)
    if not sources:
        return
    if outputs.__class__ is _ArrayImpl:
        follow((outputs,), sources)
    else:
        leaves = jax.tree_util.tree_leaves(outputs)
        follow([o for o in leaves if o.__class__ in VALUE_CLASSES], sources)


def became(pendings) -> None:
    """A fused recording ran: its ``pendings`` hold their arrays now, which are what
    later programs read; those of followed or failed values are followed or refused."""
    for p in pendings:
        key = id(p)
        error = _poisoned.get(key)
        if error is not None:
            _mark(p.value, error)
        entry = _tracked.get(key)
        if entry is not None and entry[0]() is p:
            follow((p.value,), entry[1])


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
