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
from torch_pjrt.runtime import events, platform

__all__ = [
    "Checked",
    "Passing",
    "adopt",
    "became",
    "check",
    "dependence",
    "derive",
    "expect",
    "first_bad",
    "follow",
    "inner",
    "later",
    "mark",
    "origins",
    "passed",
    "reap",
    "refuse_read",
    "restate",
    "settle",
    "tracing",
    "unpack",
    "verify",
    "watching",
]

_local = threading.local()


class _Scope:
    """The checks one trace states: their rows (its extra output) and what each means."""

    __slots__ = ("rows", "specs", "off")

    def __init__(self, off: bool = False):
        self.rows = []  # per check: [ok, *values], int64 scalars
        self.specs = []  # per check: (exception type, message template)
        self.off = off  # a program traced without its checks (see passed)

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

    __slots__ = ("scope", "outer", "off")

    def __init__(self, off: bool = False):
        self.off = off  # no checks stated: the program of inputs that passed them

    def __enter__(self) -> _Scope:
        self.outer = getattr(_local, "scope", None)
        self.scope = _local.scope = _Scope(self.off)
        return self.scope

    def __exit__(self, *exc) -> None:
        _local.scope = self.outer


def inner() -> tracing:
    """``with inner() as scope``: collect the checks of a function traced inside the
    current trace whose tracers cannot leave it (a ``shard_map``'s body). The body
    returns ``scope.returning(...)``'s flags as an output and the caller hands them to
    :func:`restate`."""
    scope = getattr(_local, "scope", None)
    return tracing(scope is None or scope.off)


def restate(flags, specs) -> None:
    """While a program traces: the checks an inner trace stated (:func:`inner`), from the
    packed rows it returned (``flags``, ``(checks, width)``), join the current trace's."""
    scope = getattr(_local, "scope", None)
    if scope is None or scope.off or not specs:
        return
    for i, spec in enumerate(specs):
        scope.rows.append([flags[i, j] for j in range(flags.shape[1])])
        scope.specs.append(spec)


def check(ok, error: type, message: str, *values) -> None:
    """While a program traces: raise ``error(message.format(*values))`` when ``ok`` (a
    boolean array) is not all true. ``values``: integer scalars to format in (the first
    bad ones, :func:`first_bad`). Outside an executor's trace (a shape probe), nothing."""
    scope = getattr(_local, "scope", None)
    if scope is None or scope.off or not settings.checks:
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
    """One program's checks: its flag arrays (or pending value), what they mean, the op,
    where it was called, and the unread checks its inputs came from (``parents``). Once
    read, ``error`` is the exception its values raise (its own failed check's, or a
    parent's), else None."""

    __slots__ = ("flags", "specs", "op", "line", "parents", "read", "error", "held", "__weakref__")

    def __init__(self, flags, specs, op, line, parents):
        self.flags, self.specs, self.op, self.line = flags, specs, op, line
        self.parents = parents
        self.read = False
        self.error = None
        self.held = None  # [False], made True once read and every check held (see passed)


_MAX_EXPECTED = 4096  # checked programs held before their flags are read unasked
_MAX_SOURCES = 64  # unread checks one value may come from before they are read unasked
_expected: list[_Expected] = []
_queue_lock = threading.Lock()  # (verify and reap take records from its front)
# failed checks some value still comes from: values computed from those are followed on
# (a record goes when the last value that names it does)
_failed = weakref.WeakSet()
_read_soon = False  # a value comes from more than _MAX_SOURCES unread checks
_failures = 0  # checks found failed so far (marks left for later compare: _Later)
_reading = 0  # verify calls reading records now (another thread's may be under way)
# NOTE: a value's checks live on the value itself: the records of the checks it was
# computed from (an attribute of JAX's arrays and a slot of fused mode's pending
# values), so following them costs an attribute per input and output, no table
SOURCES = "_torch_pjrt_checks"
try:  # NOTE: the class of JAX's arrays, for a test cheaper than isinstance
    from jax._src.array import ArrayImpl as _ArrayImpl
except ImportError:  # pragma: no cover - a JAX that moved it
    _ArrayImpl = jax.Array
# NOTE: jax.Array.copy_to_host_async costs ~6-12 us a call (it makes the array's sharding
# to see whether it is on one device); the copy itself, of an array on one device, ~0.5 us.
# Until arrays may be laid out over meshes (executor.use_meshes), every array is.
one_device = True
_copy_one = getattr(_ArrayImpl, "_copy_single_device_array_to_host_async", None)
# NOTE: on the CPU platform the copy ahead saves nothing (reading a flag array costs ~3 us
# either way) and costs ~3-5 us a checked call: flags are copied ahead on other platforms
_copy_ahead = None
# the classes of values whose checks are followed: JAX's arrays, and fused mode's
# pending values (which torch_pjrt.modes.fused adds)
VALUE_CLASSES = {_ArrayImpl}


def unpack(checked: Checked, op: str, line: str | None = None, marks=None):
    """The results of a program that ran ``op`` with checks; the checks are read at the
    next host sync (the results refused to reads if one fails). ``line``: where the op
    was called (default: the user's line now). ``marks``: ``marks(record)`` marks the
    inputs of a program that need not be checked again once they passed (with the
    check's record: :meth:`Passing.mark`, :func:`mark`)."""
    results = checked.results
    site = events.user_site() if line is None else line
    if capture_sink is not None:  # a graph capture: its replays report them
        capture_sink(checked.flags, checked.specs, op, site)
        return results
    expect(checked.flags, checked.specs, op, site, results, marks)
    return results


# --- inputs that passed: not checked again ---------------------------------------------
#
# A program's checks are a function of the values of some of its inputs (those its check
# rows depend on: an index, not the tensor it indexes) and of the shapes and dtypes of
# all of them, and JAX arrays never change: once a program's checks passed on some
# arrays, the same program on the same arrays in those places, the other inputs shaped
# alike, passes them again. So a checked call marks input arrays with one token naming
# the program, its key, what stood in each place, and its record; a later call whose
# marked places hold arrays carrying that token, once the record was read and held, runs
# the unchecked variant. Only the arrays of that call carry the token (a fresh array with
# a reused id carries none), so the test is exact; a token holds no array and no record.
#
# Two rules. An eager call (:class:`Passing`) marks only the arrays its checks read,
# found once per key and layout of arguments from the program's jaxpr
# (:func:`dependence`), and asks the others for their shapes and dtypes (the eager loop
# over a fixed index into a table each step updates). A fused recording (:func:`passed`,
# :func:`mark`) asks every input to be the very array that passed: an op that passed on
# a changed table would switch a step's recording to its unchecked variant, a program
# to compile after the steps that warmed it up.

PASSED = "_torch_pjrt_passed"


def _leaves(args) -> list:
    """The leaves of a program's arguments: its argument lists, and tensor lists in them."""
    out = []
    for part in args:
        if part.__class__ is list or part.__class__ is tuple:
            for x in part:
                if x.__class__ is list or x.__class__ is tuple:
                    out.extend(x)
                else:
                    out.append(x)
        else:
            out.append(part)
    return out


def _signature(leaves: list) -> tuple:
    return tuple([id(x) if x.__class__ is _ArrayImpl else x for x in leaves])


def passed(program, key, args) -> bool:
    """A fused recording's rule: whether ``program``'s checks of ``key`` already passed
    on exactly these ``args``, every one (then its unchecked variant gives the same
    results). Written out in one pass: :func:`_leaves` and :func:`_signature` inline."""
    token = None
    sig = []
    for part in args:
        cls = part.__class__
        for x in part if cls is list or cls is tuple else (part,):
            c = x.__class__
            for y in x if c is list or c is tuple else (x,):
                if y.__class__ is _ArrayImpl:
                    mark = getattr(y, PASSED, None)
                    if mark is not token:
                        if token is not None or mark is None or mark[0] is not program:
                            return False
                        token = mark
                    sig.append(id(y))
                elif y.__class__ in VALUE_CLASSES:  # (a pending value: not a concrete input)
                    return False
                else:
                    sig.append(y)
    if token is None or token[1] != key:
        return False
    return token[3][0] and token[2] == tuple(sig)


def mark(program, key, args, record: _Expected) -> None:
    """A fused recording's rule: mark every input array of a checked call."""
    leaves = _leaves(args)
    if any(x.__class__ in VALUE_CLASSES and x.__class__ is not _ArrayImpl for x in leaves):
        return  # (a pending value: no concrete input to mark)
    token = (program, key, _signature(leaves), _held(record))
    for x in leaves:
        if x.__class__ is _ArrayImpl:
            setattr(x, PASSED, token)


def _held(record: _Expected) -> list:
    """The cell a token holds of the record's outcome (not the record: a token must not
    keep a failed record alive, and with it the following of values, as long as its
    inputs live)."""
    record.held = [False]
    return record.held


def dependence(jaxpr, args) -> tuple:
    """``(read, others)``: the argument leaves of a program (each a path of indices into
    its ``args``, in JAX's flattening order) whose values its checks read, and the rest;
    found in its ``jaxpr`` (traced on ``args``' shapes) by dead-code elimination of all
    but the checks' output. Every leaf read without a jaxpr, or when that fails; none
    (never passed) past lists and tuples."""
    paths = []
    for path, _ in jax.tree_util.tree_flatten_with_path(args)[0]:
        if not all(k.__class__ is jax.tree_util.SequenceKey for k in path):
            return (), ()  # (a program's arguments are lists and tuples)
        paths.append(tuple(k.idx for k in path))
    used = _used(jaxpr, len(paths), checks_only=True)
    read = tuple(p for p, u in zip(paths, used) if u)
    return read, tuple(p for p, u in zip(paths, used) if not u)


def _used(jaxpr, count: int, checks_only: bool = False) -> list:
    """For each of a program's ``count`` argument leaves, whether its ``jaxpr`` reads its
    value to compute its outputs (``checks_only``: its last output, the checks' packed
    rows), by dead-code elimination; all of them without a jaxpr, or when that fails."""
    try:
        from jax._src.interpreters import partial_eval as pe

        outs = len(jaxpr.jaxpr.outvars)
        wanted = [False] * (outs - 1) + [True] if checks_only else [True] * outs
        found = pe.dce_jaxpr(jaxpr.jaxpr, wanted)[1]
        if len(found) == count:
            return found
    except Exception:  # noqa: BLE001  (no jaxpr, or an internal of JAX's moved)
        pass
    return [True] * count


def unread_leaves(jaxpr, count: int) -> tuple:
    """The positions of a program's argument leaves (``count`` of them) whose values its
    ``jaxpr`` does not read, only their shapes and dtypes (``zero_``, ``fill_``,
    ``normal_`` on a tensor): its results do not come from their checks."""
    return tuple([i for i, u in enumerate(_used(jaxpr, count)) if not u])


def _layout(args, path=()) -> tuple:
    """The lists, tuples and Nones of ``args`` (lists and tuples only: a program's
    arguments), as ``(path, class, length)``, ``(path, None, 0)``."""
    cls = args.__class__
    if args is None:
        return ((path, None, 0),)
    if cls is not list and cls is not tuple:
        return ()
    out = [(path, cls, len(args))]
    for i, a in enumerate(args):
        out.extend(_layout(a, (*path, i)))
    return tuple(out)


class Passing:
    """The eager rule for one program key and one layout of its arguments: which leaves
    its checks read (``read``, ``others``: :func:`dependence`'s paths), and, written out
    as straight-line code once per layout (NOTE: on every eager call of a checked op:
    the walk over all arguments it replaces cost ~1.4 us in situ, 5% of an 8x8
    ``x[i]``), ``fits(args)``, whether ``args`` are laid out as the rule's, and
    ``test(key, args, rule)``, whether they passed the checks of ``key`` (``args``: an
    op's program's, laid out by its kernel as :func:`_written_out` says)."""

    __slots__ = ("program", "read", "others", "test", "fits", "last")

    def __init__(self, program, jaxpr, args):
        self.program = program
        self.last = None  # the token of its last mark (an array carrying it: the test's
        # program, key and read place, known without looking)
        self.read, self.others = dependence(jaxpr, args)
        self.test, self.fits = _written_out(self.read, self.others, _layout(args))

    def mark(self, key, args, record: _Expected) -> None:
        """Mark the read input arrays of a checked call laid out as this rule's."""
        seen, marked = [], []
        for paths, read in ((self.read, True), (self.others, False)):
            for path in paths:
                y = args
                for i in path:
                    y = y[i]
                c = y.__class__
                if not read:
                    seen.append(y.aval if c is _ArrayImpl or c in VALUE_CLASSES else c)
                elif c is _ArrayImpl:
                    marked.append(y)
                    seen.append(id(y))
                else:
                    return  # (a number read: checked every call)
        if not marked:
            return
        token = self.last = (self.program, key, tuple(seen), _held(record))
        for y in marked:
            setattr(y, PASSED, token)


_TESTS: dict = {}  # (read, others, layout) -> the test and fits written out for them


def _written_out(read: tuple, others: tuple, layout: tuple) -> tuple:
    """:class:`Passing`'s ``test`` and ``fits`` for these leaves and layout, as
    straight-line code. ``test``: the layout as it was, every read leaf an array marked
    with one token of the program and key, naming it in its place, the record held, the
    other leaves shaped alike (never, for checks that read no array)."""
    found = _TESTS.get((read, others, layout))
    if found is not None:
        return found

    def name(path) -> str:  # (a local per list: each looked up once)
        return "args" if not path else "n" + "_".join(str(int(i)) for i in path)

    def at(path) -> str:
        return f"{name(path[:-1])}[{int(path[-1])}]"

    # the layout's test, parents first (as _layout lists them); ``test`` compares the
    # lengths alone (a key's lists are lists, its tuples tuples: the binding makes them),
    # below the top two levels (an op's program is called on ``(arrays, scalars, rng)``,
    # a list of one item per tensor and per scalar argument of its schema and rng for a
    # random op alone: registry.Kernel.compute; their items vary: lists of tensors and
    # Nones, of any length)
    laid, lengths = [], []
    below = {p[:k] for p in (*[q for q, _, _ in layout], *read, *others) for k in range(len(p))}
    for path, cls, size in layout:
        varies = len(path) > 1
        if cls is None:
            laid += [f"    if {at(path)} is not None:", "        return False"]
            lengths += laid[-2:] if varies else []
            continue
        node = name(path)
        if path:
            laid += [f"    {node} = {at(path)}"]
            lengths += laid[-1:] if varies or path in below else []  # (else unused)
        laid += [f"    if {node}.__class__ is not {cls.__name__} or len({node}) != {int(size)}:"]
        laid += ["        return False"]
        if varies:
            lengths += [f"    if len({node}) != {int(size)}:", "        return False"]
    code = ["def fits(args):", *laid, "    return True", "def test(key, args, rule):"]
    if read:
        # (a try costs nothing until it catches: an argument not laid out as the rule's)
        body = _tested(read, others, at)
        code += ["    try:", *["    " + line for line in lengths + body]]
        code += ["    except (TypeError, IndexError):", "        return False"]
    else:
        code += ["    return False"]
    space = {"Array": _ArrayImpl, "VALUES": VALUE_CLASSES, "PASSED": PASSED}
    exec("\n".join(code), space)  # noqa: S102  (code made of integer paths and class names)
    if len(_TESTS) >= 1024:
        _TESTS.clear()
    made = _TESTS[(read, others, layout)] = (space["test"], space["fits"])
    return made


def _tested(read: tuple, others: tuple, at) -> list:
    """The lines of :func:`_written_out`'s test after the layout's (``at(path)``: the
    expression of a leaf)."""
    code = [f"    r{j} = {at(p)}" for j, p in enumerate(read)]
    code += [f"    o{j} = {at(p)}" for j, p in enumerate(others)]
    for j in range(len(read)):
        code += [f"    if r{j}.__class__ is not Array:", "        return False"]
    size = len(read) + len(others)
    told = [  # (what the token says: its program, key, and the read arrays' places)
        "    if t is None or t[0] is not rule.program or t[1] != key:",
        "        return False",
        "    s = t[2]",
        f"    if len(s) != {size} or s[0] != id(r0):",
        "        return False",
    ]
    code += ["    t = getattr(r0, PASSED, None)"]
    if len(read) == 1:  # (one read array carrying the rule's last token: it was marked
        # by this rule, of this key, in this place, without looking)
        code += ["    if t is not rule.last:", *["    " + line for line in told]]
        code += ["    else:", "        s = t[2]"]
    else:
        code += told
    for j in range(1, len(read)):
        code += [f"    if getattr(r{j}, PASSED, None) is not t or s[{j}] != id(r{j}):"]
        code += ["        return False"]
    for j in range(len(others)):
        k = len(read) + j
        code += [
            f"    c = o{j}.__class__",
            "    if c is Array or c in VALUES:",
            f"        a = o{j}.aval",
            f"        if a is not s[{k}] and a != s[{k}]:",
            "            return False",
            f"    elif c is not s[{k}]:",
            "        return False",
        ]
    return code + ["    return t[3][0]"]


# NOTE: set by modes.capture while a graph is captured: (flags, specs, op, line) -> None
capture_sink = None


def _values(tree, out: list | None = None) -> list:
    """The arrays and pending values of ``tree`` (NOTE: lists and tuples walked here:
    ``jax.tree_util.tree_leaves`` costs ~0.4 us a leaf)."""
    out = [] if out is None else out
    cls = tree.__class__
    if cls in VALUE_CLASSES:
        out.append(tree)
    elif cls is list or cls is tuple:
        for v in tree:
            c = v.__class__
            if c in VALUE_CLASSES:
                out.append(v)
            elif c is list or c is tuple or c is dict:
                _values(v, out)
    elif cls is dict:
        _values(list(tree.values()), out)
    elif tree is not None and cls not in (int, float, bool):
        out += [v for v in jax.tree_util.tree_leaves(tree) if v.__class__ in VALUE_CLASSES]
    return out


def _store(values, mark: tuple) -> None:
    """Mark ``values`` (arrays or pending values) as computed from the checks ``mark``
    (SOURCES, stored directly: a third cheaper than setattr)."""
    for v in values:
        v._torch_pjrt_checks = mark


def expect(
    flags, specs, op: str, line, results, marks=None, parents=None, lazily: bool = False
) -> None:
    """Checks a program ran for ``op`` (called at ``line``: 'file:line' or
    ``events.user_site``'s pair), read at the next host sync: ``flags`` (their packed
    array or pending value) and ``specs`` (:class:`Checked`'s); ``results`` (a tree of
    arrays or pending values) raise the error when read if one fails, and so does every
    value computed from them (:func:`derive`). ``parents``: the checks the program's
    inputs come from (:func:`origins`), when the caller knows them; else those the
    executor marked the results with. ``marks``: as :func:`unpack`'s. Returns what the
    results are marked with.

    ``lazily`` (a captured graph's replay: ``results`` a list of arrays): the results
    are marked when something first looks at marks (:func:`settle`), or never, when the
    checks are read and held first (a replay, then a host wait: the common case)."""
    values = results if lazily else _values(results)
    if parents is None:
        parents = origins(values)
    global _copy_ahead
    if _copy_ahead is None:
        _copy_ahead = platform.current_platform() != "cpu"
    if flags.__class__ is _ArrayImpl and _copy_ahead:  # on its way to the host now
        if one_device and _copy_one is not None:
            _copy_one(flags)
        else:
            flags.copy_to_host_async()
    record = _Expected(flags, specs, op, line, parents)
    if marks is not None:
        marks(record)
    mine = (record,)
    _expected.append(record)  # (atomic; before what waits on it: _settle_read)
    if lazily:
        _unmarked.append((values, mine))
    else:
        _store(values, mine)
    if settings.mode == "debug":  # synchronous: at the op
        verify(at_op=True)
    elif len(_expected) > _MAX_EXPECTED:  # a loop that never waits: read them now
        verify()
    elif _read_soon:  # (those computed already: no recording is cut for it)
        verify(ready_only=True)
    return mine


# What waits to be marked, in order: ``(values, mark)`` of results whose marks wait
# (expect's ``lazily``), and :class:`_Later` entries (a fused recording's following).
# NOTE: a captured graph's replay makes ~100 results, a fused training step's recording
# ~300 ops; marking them costs more than the replay's other host work (the recording's:
# ~1% of its step), and after a replay or a step the host usually waits (its checks read
# and held) before anything looks at them. The next replay or flush settles them first
# (so one program's results wait at most)
_unmarked: list = []


class _Later:
    """Marks left for later (:func:`later`): ``mark()`` stores them; ``failures``: how
    many checks had failed when it was left; ``marked``: the marks of its inputs that
    carried any then (kept while a failed check is alive)."""

    __slots__ = ("mark", "failures", "marked")

    def __init__(self, mark, failures: int, marked: list):
        self.mark, self.failures, self.marked = mark, failures, marked

    def needless(self) -> bool:
        """Once every check is read (none expected): whether no value it marks comes from
        a failed one (none failed since it was left; no input marked by a failed one)."""
        if _failures != self.failures:
            return False
        for found in self.marked:
            if _live(found):
                return False
        return True


def later(mark, marks: list) -> None:
    """``mark()`` marks values computed from inputs whose marks were ``marks`` (those
    that carried any) and from the checks of the program that computed them (unread
    now) before anything looks at marks (:func:`settle`), or never, when those checks
    are read and held first."""
    # (without a failed check alive, an input's marks name unread checks, whose failing
    # the count of failures tells, or held ones)
    entry = _Later(mark, _failures, marks if _failed else [])
    if _expected or _reading or _unmarked:
        _unmarked.append(entry)  # (decided when the checks are read, in order)
    elif not entry.needless():  # (every check read: what _settle_read would do now;
        mark()  # a failed check alive, say a kept traceback's, must not hold the
        # recording's values until something looks at marks)


def settle() -> None:
    """Store the marks left for later, in order (a later one may read an earlier one's):
    called before marks are looked at."""
    while _unmarked:
        todo = _unmarked[:]
        del _unmarked[: len(todo)]  # (what other threads append meanwhile stays)
        for entry in todo:
            if entry.__class__ is tuple:
                _store(*entry)  # (each value is the result of one program)
            else:
                entry.mark()


def _settle_read() -> None:
    """After checks were read: the waiting marks of failed checks stored (their values
    refuse reads), those of checks that held dropped, the unread ones kept waiting; a
    recording's following dropped where :meth:`_Later.needless`, else run (all run, in
    order, while a check is unread)."""
    todo = _unmarked[:]
    del _unmarked[: len(todo)]  # (what other threads append meanwhile stays)
    if (_expected or _reading) and any(entry.__class__ is not tuple for entry in todo):
        _unmarked[:0] = todo  # (a recording's following reads its inputs' marks: all
        settle()  # stored first, in order)
        return
    waiting = []
    for entry in todo:  # (in order: a later one may read an earlier one's marks)
        if entry.__class__ is not tuple:  # (every check read: none queued or being read)
            if not entry.needless():
                entry.mark()
            continue
        values, mark = entry
        record = mark[0]
        if not record.read:
            waiting.append(entry)
        elif record.error is not None:
            _store(values, mark)
    _unmarked[:0] = waiting


def _value(x):
    if x.__class__ is _ArrayImpl:
        return x
    concrete = getattr(x, "concrete", None)  # (a fused mode's pending value)
    return concrete() if concrete is not None else x


def verify(at_op: bool = False, ready_only: bool = False, done_only: bool = False) -> None:
    """Read every check expected so far, in order; a failed one's values (and those
    computed from them, :func:`derive`) raise its error from now on, and the first one
    raises here (marked ``pjrt_event``: the layers in between pass it on as it is). Each
    program's flags started for the host when it was called (see :func:`expect`):
    reading them here costs about a microsecond each. ``ready_only``: only the checks of
    programs that ran (not those of a fused recording still recording). ``done_only``:
    only the checks of programs that are done (a partial host sync: the rest are read at
    a later wait)."""
    global _read_soon, _reading
    _read_soon = False
    if not _expected:
        return
    with _queue_lock:  # (reap takes records from the front too)
        todo = _expected[:]
        del _expected[: len(todo)]  # (what other threads append meanwhile stays)
        _reading += 1
    try:
        error = _read(todo, at_op, ready_only, done_only)
    finally:
        with _queue_lock:
            _reading -= 1
    if _unmarked:
        _settle_read()
    if error is not None:
        raise error


def _read(todo: list, at_op: bool, ready_only: bool, done_only: bool):
    """:func:`verify`'s reading of the records ``todo`` (taken from the queue); returns
    the first failed check's error, or None."""
    global _failures
    if ready_only:  # (a pending value's graph: still recording)
        todo = _requeue(todo, [getattr(r.flags, "graph", None) is None for r in todo])
    if done_only:  # (one test per record: a program may finish meanwhile)
        todo = _requeue(todo, [_done(r.flags) for r in todo])
    error = None
    for record in todo:
        try:
            rows = np.asarray(_value(record.flags))  # (copied to the host already, or now)
        except Exception:  # noqa: BLE001  (the program itself failed: its reader reports it)
            rows = None
        # (a list's test: numpy's own all() costs ~10 us right after a big program)
        failed = (
            None if rows is None or 0 not in rows[:, 0].tolist() else _error(record, rows, at_op)
        )
        if failed is None:
            if record.parents:  # (its inputs' failed checks are its values' too)
                failed = next((p.error for p in record.parents if p.error is not None), None)
        else:
            error = error or failed
        record.read, record.error = True, failed
        if record.held is not None and failed is None and rows is not None:
            record.held[0] = True
        if failed is not None:
            _failed.add(record)
            _failures += 1
        record.flags = record.parents = None
    return error


def _requeue(todo: list, now: list) -> list:
    """The records of ``todo`` to read now (``now``: a bool each); the others go back to
    the front of the queue, in order, before what other threads appended meanwhile."""
    if all(now):
        return todo
    with _queue_lock:
        _expected[:0] = [r for r, n in zip(todo, now) if not n]
    return [r for r, n in zip(todo, now) if n]


def reap() -> bool:
    """Read the checks at the front of the queue whose programs are done and that held
    (an eager op's program is done within microseconds), so that values computed from
    theirs stop being followed (:func:`derive`: ~4 us a program call, every op of a step
    after its first checked one). A failed check, or one computed from unread checks, is
    left to the next wait, which raises it. Returns whether any was read."""
    read = False
    while _expected:
        with _queue_lock:
            if not _expected:
                break
            record = _expected[0]
            flags = record.flags
            if flags.__class__ is not _ArrayImpl or not flags.is_ready():
                break
            for p in record.parents:
                if not p.read or p.error is not None:
                    return read
            rows = np.asarray(flags)
            if 0 in rows[:, 0].tolist():
                break
            del _expected[0]
            record.read = read = True
            if record.held is not None:
                record.held[0] = True
            record.flags = record.parents = None
    return read


def _done(flags) -> bool:
    """Whether the program computing ``flags`` is done (a fused mode's pending value:
    once it ran and its array is)."""
    if flags.__class__ is not _ArrayImpl:
        flags = getattr(flags, "value", None)
        if flags is None:  # (not run yet)
            return False
    return flags.is_deleted() or flags.is_ready()


def _error(record: _Expected, rows, at_op: bool) -> Exception:
    """The exception of ``record``'s first failed check (``rows``: its flags)."""
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
            else (f"{where[0]} (in {record.op})", where[1] or record.line)
        )
        if line is None or isinstance(line, tuple):  # (events.user_site's)
            line = "<unknown>" if line is None else f"{line[0]}:{line[1]}"
        if hasattr(failed, "add_note"):
            failed.add_note(f"pjrt: checked on the device in {op}, called at {line}; {when}")
        return failed
    raise AssertionError("a failed row was not found")  # pragma: no cover


def watching() -> bool:
    """Whether values computed now may come from a check not read yet or failed (then
    clients call :func:`derive`, or :func:`origins` and :func:`follow`)."""
    return bool(_expected) or bool(_failed)


def _live(sources) -> bool:
    for r in sources:
        if not r.read or r.error is not None:
            return True
    return False


def _origins(inputs, found: list) -> None:
    """Append to ``found`` the check records (a tuple each) of the arrays and pending
    values among ``inputs`` (nested lists and tuples). NOTE: on every program call while
    a check is unread: plain loops, the lookup written out for a list's items too (a call
    per item would cost more than the lookup)."""
    values = VALUE_CLASSES
    for a in inputs:
        cls = a.__class__
        if cls is list or cls is tuple:
            for b in a:
                c = b.__class__
                if c in values:
                    sources = getattr(b, SOURCES, None)
                    if sources is not None:
                        found.append(sources)
                elif c is list or c is tuple:
                    _origins(b, found)
        elif cls in values:
            sources = getattr(a, SOURCES, None)
            if sources is not None:
                found.append(sources)


def origins(inputs) -> tuple:
    """The checks ``inputs`` (arrays, pending values, nested lists and tuples of them;
    other leaves ignored) were computed from that are unread or failed, each once;
    empty for values no such check made."""
    if _unmarked:
        settle()
    found: list = []
    _origins(inputs, found)
    if not found:
        return ()
    first = found[0]
    if all([f is first for f in found]):
        return first if _live(first) else ()
    return merged(found)  # (a foreach op's list of values from the same checks: once each)


def merged(found) -> tuple:
    """The checks of several values' marks (what :func:`follow` set), those unread or
    failed, each once."""
    out: list = []
    last = None
    for sources in found:
        if sources is last:  # (values of one program: one mark)
            continue
        last = sources
        for r in sources:
            if (not r.read or r.error is not None) and r not in out:
                out.append(r)
    return tuple(out)


def follow(values, sources: tuple) -> None:
    """``values`` (arrays or pending values) were computed from ``sources``
    (:func:`origins`): they raise a failed source's error when read."""
    global _read_soon
    _store(values, sources)
    if len(sources) > _MAX_SOURCES:  # from many unread checks: read them at the next
        _read_soon = True  # checked op (not here, inside a program call or a flush)


def adopt(records: tuple, parents: list) -> None:
    """``records`` (unread) were computed from values of the checks ``parents``: their
    values raise a failed parent's error too."""
    for r in records:
        if r.__class__ is _Expected and not r.read:
            r.parents = (*r.parents, *[p for p in parents if p not in r.parents])


def derive(inputs, outputs, program=None, key=None) -> None:
    """``outputs`` (a tree of arrays or pending values) were computed from ``inputs``
    (see :func:`origins`): if an input comes from a check not read yet, or from one that
    failed, so do the outputs (their reads raise its error). Called by the executor for
    every program call while :func:`watching`, with the ``program`` and ``key`` called:
    inputs whose values it does not read are not sources (``values_read``, asked only
    when some input comes from such a check)."""
    sources = origins(inputs)
    if sources and reap():  # (checks that held and are read now: not followed)
        sources = origins(inputs)
    if sources and program is not None:
        sources = origins(program.values_read(key, inputs))
    if sources:
        follow(_values(outputs), sources)


def became(pendings) -> None:
    """A fused recording ran: its ``pendings`` hold their arrays now, which are what
    later programs read; they carry the pendings' checks."""
    for p in pendings:
        sources = getattr(p, SOURCES, None)
        if sources is not None:
            setattr(p.value, SOURCES, sources)


def refuse_read(array) -> None:
    """Raise the error of a failed check that ``array`` comes from, if one did (after a
    host sync: every check read)."""
    if _unmarked:
        settle()
    sources = getattr(array, SOURCES, None)
    if sources is not None:
        for r in sources:
            if r.error is not None:
                error = r.error
                raise type(error)(*error.args) from error


def _on_event(event: str, what: str) -> None:
    if event == "host sync":
        verify(done_only=events.sync_is_partial())


events.listen(_on_event)  # (the hook of every host sync)
