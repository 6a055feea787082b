"""Fused mode: ops are recorded as pending values and run as one cached XLA program.

In fused mode an op's kernel does not run its program; it appends a node (the op's
jitted program, where its arguments come from) to the recording of its device and
returns :class:`Pending` values that know only their shape and dtype. Storage cells
hold pending values like arrays. When a value is needed (a host read, a CPU
fallback, ``synchronize()``, the end of a ``torch_pjrt.step()``, a compiled graph, a
mode switch, or ``settings.fused_max_ops`` nodes), the recording is *flushed*: its
nodes are replayed inside one ``jax.jit`` program, which XLA fuses and optimizes as a
whole, and only the values something still holds come out of it.

The program is cached by what determines it: each node's program, how its
arguments connect (recorded inputs by slot, other nodes' outputs by position), the
shapes and dtypes of the inputs, and which values come out. A training loop that
records the same ops every step reuses one program from its second step on.

NOTE: which pending values are still held is read from reference counts: the
recording itself holds each pending value once, in its node's ``outs``; any other
reference (a storage cell, a caller's local) means the value must be an output. This
errs on the side of more outputs, never fewer. Which inputs may be donated is decided
by ownership instead (``tensor.Cell``): an input whose owning cell let it go.
"""

from __future__ import annotations

import functools
import sys
import threading

import jax
import numpy as np
import torch

from torch_pjrt.config import settings
from torch_pjrt.runtime import asserts, executor
from torch_pjrt.runtime import events as metrics

__all__ = [
    "Pending",
    "Unfusable",
    "apply",
    "capture_input",
    "capture_refuse",
    "capture_touch",
    "concrete",
    "flush_all",
    "record",
    "released",
]

_SCALARS = executor.SCALARS
try:  # the class of concrete JAX arrays (an identity test is the cheapest check)
    from jax._src.array import ArrayImpl as _ArrayImpl
except ImportError:  # pragma: no cover - a JAX that moved it: nothing is donated
    _ArrayImpl = None


class Unfusable(Exception):
    """An argument fused mode cannot record; the op runs eagerly instead."""


class Pending:
    """A value a recorded op will produce: its shape and dtype, and later its array."""

    __slots__ = (
        "aval",
        "dtype",
        "error",
        "graph",
        "shape",
        "value",
        "where",
        "_torch_pjrt_checks",  # (asserts.SOURCES: the checks it comes from, or None)
        "__weakref__",
    )

    def __init__(self, out: tuple, graph, where):
        self.aval, self.shape, self.dtype = out
        self.graph = graph
        self.where = where  # (node, output) in the graph's recording
        self.value = None
        self.error = None  # why the program computing it failed
        self._torch_pjrt_checks = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def concrete(self, reason: str = "value needed") -> jax.Array:
        """The array, running the recording first if it has not run yet (``reason`` is
        counted in ``fused_flush_reasons``)."""
        if self.value is None:
            graph = self.graph
            if graph is not None:
                graph.flush(reason, self)
            if self.value is None and self.error is not None:
                raise RuntimeError(
                    "pjrt: the fused program that computes this value failed: "
                    f"{type(self.error).__name__}: {self.error}\n"
                    f"{getattr(self.error, 'pjrt_context', '')}"
                ) from self.error
            if self.value is None:
                raise RuntimeError(
                    "torch_pjrt fused mode: a pending value was dropped before it was "
                    "computed. This is a torch_pjrt bug; please report it, and use "
                    "torch_pjrt.set_mode('eager') meanwhile."
                )
        return self.value

    def __repr__(self) -> str:
        return f"Pending({self.aval.str_short()})"


asserts.VALUE_CLASSES.add(Pending)  # (values computed from checked ones are followed)


def concrete(x, reason: str = "value needed"):
    """``x`` with pending values replaced by their arrays (any pytree)."""
    if x.__class__ is Pending:
        return x.concrete(reason)
    if isinstance(x, (list, tuple)):
        return type(x)(concrete(v, reason) for v in x)
    return x


_lock = threading.RLock()
# NOTE: the number of graph captures under way (torch_pjrt.modes.capture); storage cells
# read it on every access, so it is a plain module global
capturing = 0
# (fn, treedef, argument signatures) -> (output treedef, avals, the argument leaves whose
# values it does not read: asserts.unread_leaves)
_shapes: dict = {}
_MAX_PROGRAMS = 1024  # per device: past it, the oldest program goes
# Loop cuts (see _Graph._loop_check): a recording this long is checked for a repeating
# op sequence, then at twice the length, and so on up to the size cap; a loop's
# steady-state program runs at least _LOOP_UNIT ops (whole periods of the loop).
_LOOP_FIRST_CHECK = 512
_LOOP_UNIT = 128


def shaped(a) -> tuple:
    """A pending value's (aval, shape, dtype) for an array or aval ``a``."""
    aval = jax.core.ShapedArray(a.shape, a.dtype, weak_type=a.weak_type)
    return aval, aval.shape, np.dtype(aval.dtype)


class _Graph:
    """The recording of one device."""

    def __init__(self, index: int):
        self.index = index
        self.last_key = None
        self.cycle = None  # the op signatures of a loop's period, once one was found
        self.capture = None  # the graph capture under way on this device (modes.capture)
        self.program = executor.Program(
            "fused",
            f"pjrt:{index} recording",
            replay_program,
            describe_recording,
            placed=lambda key: index,
            follows=False,  # (a recording's outputs are marked after it ran: _follow)
            contents=recording_contents,
        )
        self._clear()

    def _clear(self):
        self.nodes = []  # (fn, args treedef, refs, outs)
        self.names = []
        self.lines = []  # the user's line that recorded each node
        self.inputs = []
        self.input_sigs = []
        self.input_slots = {}  # id(array) -> slot (arrays stay alive in self.inputs)
        self.checked = {}  # node -> its first output, of each checked op recorded
        self.unread = {}  # node -> its arguments whose values it does not read (zero_'s)
        self.released = set()  # slots of inputs their owning cell let go (donatable)
        self.sigs = []  # op signatures of the first nodes (computed at loop checks)
        # the recording length at which to look for a loop next
        self.next_check = len(self.cycle) if self.cycle else _LOOP_FIRST_CHECK

    def record(self, fn, args: tuple, name: str, random: bool = False, out=None):
        leaves, treedef = jax.tree_util.tree_flatten(args)
        sigs, refs = [], []
        inputs, slots = self.inputs, self.input_slots
        for leaf in leaves:
            cls = leaf.__class__
            if cls is Pending:
                sigs.append(leaf.aval)
                if leaf.value is None and leaf.graph is self:
                    refs.append(leaf.where)
                    continue
                leaf = leaf.concrete()
            elif cls in _SCALARS:
                sigs.append(cls)
                refs.append(len(inputs))
                inputs.append(leaf)
                self.input_sigs.append(cls)
                continue
            elif isinstance(leaf, jax.Array):
                sigs.append(leaf.aval)
            else:
                raise Unfusable(cls.__name__)
            # NOTE: arrays laid out over a mesh are not recorded (their ops run eagerly,
            # where jit follows their shardings): a recording's program puts its outputs
            # on the one device it belongs to
            if executor.mesh_in_use and len(leaf.sharding.device_set) > 1:
                raise Unfusable("an array sharded over a mesh")
            slot = slots.get(id(leaf))
            if slot is None:
                slot = slots[id(leaf)] = len(inputs)
                inputs.append(leaf)
                self.input_sigs.append(leaf.aval)
            refs.append(slot)
        shape_key = (fn, treedef, tuple(sigs))
        found = _shapes.get(shape_key)
        # NOTE: the user's line costs about 1.4 us (Python makes the frame objects), a
        # tenth of a recorded op, so it is kept where the op's signature is new: where a
        # program is new too, and where an error names it (errors of known signatures
        # are raised by eval_shape below, at the op's own call)
        site = None if found is not None else metrics.user_site()
        if found is None and out is not None:  # (given: fn traces only inside a mesh)
            out_leaves, out_treedef = jax.tree_util.tree_flatten(out)
            found = _shapes[shape_key] = (out_treedef, [shaped(o) for o in out_leaves], ())
        if found is None:
            specs = jax.tree_util.tree_unflatten(treedef, [executor.spec(x) for x in leaves])
            unread = ()
            with jax.enable_x64(True):
                if hasattr(fn, "trace"):  # (a jitted program: its jaxpr comes with it)
                    traced = fn.trace(*specs)
                    out = traced.out_info
                    unread = asserts.unread_leaves(traced.jaxpr, len(leaves))
                else:
                    out = jax.eval_shape(fn, *specs)
            out_leaves, out_treedef = jax.tree_util.tree_flatten(out)
            found = _shapes[shape_key] = (out_treedef, [shaped(o) for o in out_leaves], unread)
        out_treedef, out_avals, unread = found
        n = len(self.nodes)
        outs = tuple([Pending(a, self, (n, i)) for i, a in enumerate(out_avals)])
        self.nodes.append((fn, treedef, tuple(refs), outs))
        if unread:  # (its results come from the others alone: _follow)
            self.unread[n] = unread
        self.names.append(name)
        self.lines.append(site)
        metrics.count("fused_ops")
        result = jax.tree_util.tree_unflatten(out_treedef, outs)
        if result.__class__ is asserts.Checked:  # (its results get its record: _follow)
            self.checked[n] = outs[0]
        if self.capture is not None:  # no cuts; a random op's (seed, offset) are inputs
            if random:
                self.capture.rng.append((refs[-2], refs[-1], leaves[-1]))
            return result
        n += 1
        if n >= self.next_check:
            self._loop_check(n)
        if len(self.nodes) >= settings.fused_max_ops:
            self.flush("size cap")
        return result

    # --- loop cuts --------------------------------------------------------------------

    def _signatures(self) -> list:
        """Each node's signature: its op, and where its arguments come from relative to
        it (a recorded input, or the output of the node so many places before). Two
        iterations of a loop have equal signatures, whatever their values."""
        sigs, nodes = self.sigs, self.nodes
        for n in range(len(sigs), len(nodes)):
            fn, treedef, refs, _ = nodes[n]
            rel = tuple([-1 if r.__class__ is int else (n - r[0], r[1]) for r in refs])
            sigs.append((fn, treedef, rel))
        return sigs

    def _loop_check(self, n: int) -> None:
        """Cut a recording that repeats: a loop that never reads a value back (sampling,
        generation, evaluation) would otherwise run as programs cut by the size cap at a
        different op each time, each one new to compile.

        The rule: when the second half of a recording repeats with some period (the
        smallest), the recording runs now, and its last whole periods (at least
        ``_LOOP_UNIT`` ops) become the expected cycle; each following recording runs
        as soon as it has recorded exactly that cycle again, so the loop's steady state
        is one program, compiled once, however many iterations run. A recording that
        breaks the cycle forgets it and is checked again at doubling lengths."""
        sigs = self._signatures()
        cycle = self.cycle
        if cycle is not None and n == len(cycle):
            if cycle == tuple(sigs):
                self.flush("loop")
                return
            self.cycle = None
            self.next_check = max(_LOOP_FIRST_CHECK, 2 * n)
            return
        half = n // 2
        last = sigs[n - 1]
        for p in range(1, (n - half) // 2 + 1):
            if sigs[n - 1 - p] == last and sigs[half : n - p] == sigs[half + p :]:
                unit = p * -(-_LOOP_UNIT // p)
                if unit <= n - half:
                    # as the next recording will see it: values from before the cut
                    # come in as its inputs
                    self.cycle = tuple(
                        (fn, treedef, tuple([-1 if r == -1 or r[0] > k else r for r in rel]))
                        for k, (fn, treedef, rel) in enumerate(sigs[n - unit :])
                    )
                    self.flush("loop")
                    return
                break
        self.next_check = 2 * n

    def flush(self, reason: str, wanted: Pending | None = None) -> None:
        if self.capture is not None:  # a capture runs nothing: refused unless a boundary
            self.capture.refuse(reason)
            return
        with _lock:
            nodes = self.nodes
            if not nodes:
                return
            outputs, held = [], []
            for node in nodes:
                for p in node[3]:
                    # held elsewhere than in this node (and by p and getrefcount's argument)
                    if sys.getrefcount(p) > 3:
                        outputs.append(p.where)
                        held.append(p)
            if asserts.watching():  # (one recording's following waits at most)
                asserts.settle()
            donated = self._donatable(held)
            key = (
                tuple([node[:3] for node in nodes]),
                tuple(self.input_sigs),
                tuple(outputs),
                donated,
            )
            program = self.program
            known = key in program.cache
            inputs = self.inputs
            if donated:
                gone = set(donated)
                kept = [x for i, x in enumerate(inputs) if i not in gone]
                inputs = ([inputs[i] for i in donated], kept)
                metrics.count("fused_donated_buffers", len(donated))
            else:
                inputs = ((), inputs)
            try:
                values = program(key, *inputs)
            except Exception as exc:
                # the recording is dropped; its values report this error when read
                exc.pjrt_context = self._context(reason, exc)
                if hasattr(exc, "add_note"):  # (Python 3.11+)
                    exc.add_note(exc.pjrt_context)
                self._drop(nodes, exc)
                raise
            if known:
                metrics.count("fused_cache_hits")
            elif len(program.cache) > _MAX_PROGRAMS:  # the oldest program goes
                del program.cache[next(iter(program.cache))]
            for p, value in zip(held, values):
                p.value = value
            if asserts.watching():  # values computed from checked ones: their errors
                entering = _marked(self.inputs)
                follow = functools.partial(
                    _follow, key[0], len(self.inputs), entering, self.checked, self.unread, held
                )
                asserts.later(follow, [found for _, found in entering])
            self.last_key = key
            self._drop(nodes, None)
            metrics.count("fused_flushes")
            metrics.count("fused_executions")
            metrics.tally("fused_flush_reasons", reason)
        if wanted is not None and wanted.value is None and wanted.graph is self:
            wanted.graph = None

    def _donatable(self, held: list) -> tuple:
        """Slots of the inputs whose buffers the program may reuse for its outputs: arrays
        whose owning storage cell let them go while this recording held them (the old
        value of a parameter updated in place, say: ``tensor.Cell.own``), and whose shape
        and dtype an output has. Nothing else holds such an array."""
        if not self.released:
            return ()
        free = {}
        for p in held:
            k = (p.shape, p.dtype)
            free[k] = free.get(k, 0) + 1
        donated = []
        inputs = self.inputs
        for i in sorted(self.released):
            x = inputs[i]
            k = (x.shape, x.dtype)
            if free.get(k):
                free[k] -= 1
                donated.append(i)
        return tuple(donated)

    def release(self, array) -> None:
        """``array``'s owning cell let it go: if the recording holds it as an input, no
        one else does, and the program may donate its buffer."""
        slot = self.input_slots.get(id(array))
        if slot is not None and self.inputs[slot] is array and array.__class__ is _ArrayImpl:
            self.released.add(slot)

    def _context(self, reason: str, exc: BaseException) -> str:
        """What failed: the op that raised while the program was built (its name, schema
        and the line that recorded it), else the ops the program ran, each with its line;
        and where the host asked for the values."""
        names = self.names
        lines = ["" if at is None else f" at {at[0]}:{at[1]}" for at in self.lines]
        asked = f"run for '{reason}' at {metrics.user_line()}"
        where = f"the fused program of the {len(names)} ops recorded on pjrt:{self.index}"
        failed = getattr(exc, "pjrt_node", None)
        if failed is not None and failed < len(names):
            return (
                f"pjrt: the op {names[failed]} ({_schema_of(names[failed])}), recorded"
                f"{lines[failed]}, failed as op {failed} of {where}, {asked}."
            )
        shown = [f"{n}{line}" for n, line in zip(names[:8], lines)]
        more = f", ... ({len(names) - 8} more)" if len(names) > 8 else ""
        return (
            f"pjrt: in {where} ({', '.join(shown)}{more}), {asked}. "
            "Run with TORCH_PJRT_MODE=debug to raise at the failing op."
        )

    def _drop(self, nodes, error) -> None:
        for node in nodes:
            for p in node[3]:
                p.graph = None
                p.error = error
        self._clear()

    def __repr__(self) -> str:
        return f"<fused recording of pjrt:{self.index}, {len(self.nodes)} ops>"


def _marked(inputs: list) -> list:
    """``(slot, marks)`` of the recording's inputs that carry marks (:func:`_follow`'s:
    read when its program is called, after every earlier mark was stored; the inputs
    themselves are not kept, so their buffers go as the program is done with them)."""
    marked = asserts.SOURCES
    out = []
    for slot, x in enumerate(inputs):  # (most carry no mark: one attribute lookup each)
        if x.__class__ is _ArrayImpl:
            found = getattr(x, marked, None)
            if found is not None:
                out.append((slot, found))
    return out


def _follow(
    nodes: tuple, n_inputs: int, entering: list, checked: dict, unread: dict, held: list
) -> None:
    """Mark the outputs ``held`` of a recording that ran (``nodes``: its program key's
    ``(fn, treedef, refs)`` each, on ``n_inputs`` inputs, ``entering`` those of them
    that carried marks, :func:`_marked`; ``checked``: its checked ops' first outputs by
    node; ``unread``: the nodes' arguments whose values they do not read) that it
    computed from values of unread or failed checks (its inputs, and the checked ops'
    own results) as coming from them, pending values and their arrays alike: one pass
    over the nodes, each node's sources a bit mask, so that recording an op costs
    nothing more. Left for later (``asserts.later``): after a step the host usually
    waits, its checks are read and hold, and nothing is marked."""
    sources, bits = [], {}

    def picked(m: int) -> list:  # the sources of mask m (its set bits alone: a
        found = []  # recording of n checked ops has n sources and n masks)
        while m:
            low = m & -m
            found.append(sources[low.bit_length() - 1])
            m ^= low
        return found

    def mask(found: tuple) -> int:
        m = 0
        for origin in found:
            bit = bits.get(id(origin))
            if bit is None:
                bit = bits[id(origin)] = len(sources)
                sources.append(origin)
            m |= 1 << bit
        return m

    inputs = [0] * n_inputs  # (each input's mask)
    for slot, found in entering:
        found = asserts.merged((found,))  # (those unread or failed)
        if found:
            inputs[slot] = mask(found)
    masks = []  # (each node's)
    for n, (_, _, refs) in enumerate(nodes):
        if n in unread:  # (a value whose shape alone it reads: not a source)
            refs = [r for j, r in enumerate(refs) if j not in unread[n]]
        m = 0
        for r in refs:
            m |= inputs[r] if r.__class__ is int else masks[r[0]]
        if n in checked:  # a checked op: its record (set on its results by asserts.expect)
            own = checked[n]._torch_pjrt_checks
            if own is not None:
                if m and own[0].read:  # (read already: its values name it and its inputs')
                    m |= mask(own)
                else:
                    if m:  # its inputs' checks are its parents: its values name it alone
                        asserts.adopt(own, picked(m))
                    m = mask(own)
        masks.append(m)
    if not sources:
        return
    by_mask: dict = {}
    for p in held:
        m = masks[p.where[0]]
        if m:
            by_mask.setdefault(m, []).append(p)
    for m, values in by_mask.items():
        asserts.follow(values, tuple(picked(m)))
    asserts.became(held)


def replay_program(key, baked: dict | None = None, inline: bool = False):
    """The traceable function of a recording's program key (nodes, input signatures,
    outputs, donated input slots), and whether its first argument is donated.
    ``baked``: input slots whose values are constants of the program (a captured
    graph's numbers), passed neither donated nor kept. ``inline``: trace each op's
    function itself, not its jitted program (inside a shard_map, where a program that
    places its outputs on one device cannot run)."""
    nodes, sigs, outputs, donated = key
    if inline:
        nodes = [(getattr(fn, "__wrapped__", fn), treedef, refs) for fn, treedef, refs in nodes]
    unflatten, leaves_of = jax.tree_util.tree_unflatten, jax.tree_util.tree_leaves
    baked = baked or {}
    gone = set(donated) | set(baked)
    kept = [i for i in range(len(sigs)) if i not in gone]

    def replay(donated_inputs, kept_inputs):
        inputs = [None] * len(sigs)
        for i, x in baked.items():
            inputs[i] = x
        for i, x in zip(donated, donated_inputs):
            inputs[i] = x
        for i, x in zip(kept, kept_inputs):
            inputs[i] = x
        env = []
        for fn, treedef, refs in nodes:
            args = [inputs[r] if r.__class__ is int else env[r[0]][r[1]] for r in refs]
            try:
                env.append(leaves_of(fn(*unflatten(treedef, args))))
            except Exception as exc:  # (the recording names this node's op and line)
                if not hasattr(exc, "pjrt_node"):
                    exc.pjrt_node = len(env)
                raise
        return [env[n][i] for n, i in outputs]

    replay.__name__ = replay.__qualname__ = f"fused_{len(nodes)}_ops"
    return replay, bool(donated)


def _schema_of(name: str) -> str:
    """The schema of the op named ``name`` (``aten.add.Tensor``), or the name itself for
    the raw kernels' steps (``view``, ``cast``)."""
    namespace, _, rest = name.partition(".")
    packet, _, overload = rest.partition(".")
    try:
        op = getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")
        return str(op._schema)
    except (AttributeError, RuntimeError):
        return name


def _op_name(fn) -> str:
    if fn.__class__ is executor.Helper:
        return fn.program.name
    return getattr(fn, "__name__", type(fn).__name__)


def recording_contents(key) -> list:
    """The ops a recording's program holds, by name (for profiler traces)."""
    return [_op_name(fn) for fn, _, _ in key[0]]


def describe_recording(key, traced) -> list:
    """What a recording's program is made of, for its compile causes: how many ops, each
    op, where each op's arguments come from, the inputs, which values come out, and which
    inputs are donated."""
    nodes, sigs, outputs, donated = key
    return [
        ("ops recorded", len(nodes)),
        *((f"op {i}", _op_name(fn)) for i, (fn, _, _) in enumerate(nodes)),
        *((f"arguments of op {i} ({_op_name(n[0])})", n[1:]) for i, n in enumerate(nodes)),
        *((f"input {i}", s) for i, s in enumerate(sigs)),
        ("values the program's caller holds (its outputs)", outputs),
        ("inputs donated (values the caller no longer holds)", donated),
    ]


_graphs: dict[int, _Graph] = {}


def _graph(index: int) -> _Graph:
    graph = _graphs.get(index)
    if graph is None:
        if not _graphs:  # the first recording: from now on optimizer steps end steps
            from torch.optim.optimizer import register_optimizer_step_post_hook

            from torch_pjrt import modes

            register_optimizer_step_post_hook(modes._after_optimizer_step)
        graph = _graphs[index] = _Graph(index)
    return graph


def recording_open(index: int) -> bool:
    """Whether device ``index`` has a recording with ops in it (one that may hold, and
    so donate, a buffer a storage cell lets go)."""
    graph = _graphs.get(index)
    return graph is not None and bool(graph.nodes)


def released(array, index: int) -> None:
    """A storage cell that owned ``array`` let it go (``tensor.Cell``): the recording of
    its device may donate the buffer if it holds it."""
    if recording_open(index):
        _graphs[index].release(array)


def record(fn, args: tuple, index: int, name: str = "op", random: bool = False, out=None):
    """Record ``fn(*args)`` on device ``index``; returns its outputs as pending values.
    ``random``: the last two leaves of ``args`` are a random op's (seed, offset).
    ``out``: the outputs' shapes (``jax.ShapeDtypeStruct`` leaves), for a function that
    cannot be traced on its own (a collective's per-rank body)."""
    with _lock:
        return _graph(index).record(fn, args, name, random, out)


def capture_input(cell, value):
    """A storage cell's value as the ops recorded now see it: under a graph capture of
    its device, a pending input standing for the cell's array at each replay (see
    ``modes.capture``); else ``value`` itself."""
    graph = _graphs.get(cell.index)
    if graph is None or graph.capture is None:
        return value
    return graph.capture.read(cell, value)


def capture_touch(cell, old, made: bool = False) -> None:
    """A storage cell is about to be written (``old``: its value before; ``made``: it is
    being made): a graph capture of its device restores that value when it ends."""
    graph = _graphs.get(cell.index)
    if graph is not None and graph.capture is not None:
        graph.capture.touch(cell, old, made)


def capture_refuse(index: int | None, what: str | None = None) -> None:
    """Raise if a graph capture is under way (on device ``index``, or any): a value is
    needed on the host, or ``what`` ("copies a CPU tensor to the device", say) is done,
    which a captured graph cannot do."""
    for graph in list(_graphs.values()):
        if graph.capture is not None and (index is None or graph.index == index):
            graph.capture.refuse("value needed", what)


def apply(fn, args: tuple, index: int, name: str):
    """``fn(*args)``: recorded in fused mode, else run (pending arguments computed first)."""
    if settings.mode == "fused":
        try:
            return record(fn, args, index, name)
        except Unfusable:
            pass
    args = executor.align(list(concrete(args)))
    with jax.enable_x64(True):
        return fn(*args)


def flush_all(reason: str) -> None:
    """Run every device's recording."""
    with _lock:
        for graph in list(_graphs.values()):
            graph.flush(reason)


def pending_ops() -> int:
    """Ops recorded and not yet run, on every device."""
    return sum(len(g.nodes) for g in _graphs.values())
