"""Capture and replay: the ops of a region recorded once, replayed as one XLA program.

Between :func:`begin` and :meth:`Capture.end` every op of the device is recorded into
its fused recording (whatever the mode), nothing runs, and nothing is flushed: a read
of a value on the host is refused (:class:`CaptureError`, naming the user's line).
Storage cells are the program's interface, as memory addresses are a CUDA graph's:

- a cell read during the capture becomes an *input*: a pending value standing for
  whatever array the cell holds when the graph is replayed;
- a cell written during the capture becomes an *output*: each replay stores the
  program's value into it (owned: the next replay may donate it);
- numbers (an op's scalars, a CPU scalar tensor's value) are baked in, as a CUDA graph
  bakes kernel arguments; random ops take fresh offsets on every replay.

The capture itself changes nothing: cells get their values back at the end, and a cell
made during the capture stays unwritten until the first replay (it reads as zeros, as
fresh ``empty`` storage does; a CUDA graph's pool memory holds garbage). Such a cell read
by a later capture (the backward graph of ``make_graphed_callables``) is an input of
that one, with the shape it will have.

The program, its inputs and its donations are those of a fused recording
(``fused.replay_program``); the one executor runs it (``runtime.executor``).
"""

from __future__ import annotations

import operator
import weakref

import jax
import jax.numpy as jnp
import numpy as np

from torch_pjrt.config import recording
from torch_pjrt.modes import fused
from torch_pjrt.modes.fused import Pending
from torch_pjrt.runtime import asserts, executor, platform
from torch_pjrt.runtime import events as metrics
from torch_pjrt.runtime.transfer import jax_dtype

__all__ = ["Capture", "CaptureError", "Captured", "active", "begin"]


class CaptureError(RuntimeError):
    """Something a captured graph cannot do was asked for during its capture."""


# flushes that only mark where a program could end (they do nothing in a capture)
_BOUNDARIES = frozenset({"end of step", "optimizer step", "loop", "size cap"})

_HOW = {
    "host read": "reads a tensor's value on the host (.item(), .tolist(), .cpu(), print, "
    "bool(t), or a shape that depends on values, such as nonzero or masked_select)",
    "synchronize": "waits for the device (synchronize)",
    "mode switch": "switches the execution mode",
}
_HOW["value needed"] = _HOW["host read"]

# cells a captured graph writes that were made during its capture: unwritten until the
# graph is replayed; their shape, for later captures that read them
_unwritten: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_is_not = operator.is_not
_STALE = object()  # a cell's last value unknown: the next replay checks it

_active: dict = {}  # device index -> Capture


def active(index: int | None = None):
    """The capture under way (on device ``index``, or any), or None."""
    if index is None:
        return next(iter(_active.values()), None)
    return _active.get(index)


class Capture:
    """A capture under way on one device (see the module docstring)."""

    def __init__(self, index: int, rng_offset: int):
        self.index = index
        self.rng_offset = rng_offset  # the device's RNG offset when the capture began
        self.line = metrics.user_line()
        self.graph = fused._graph(index)
        # cell -> (value, owned) before the capture. NOTE: weak: a cell that dies during
        # the capture (an activation, a gradient set to None) is no output of the graph
        self.saved: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # id(cell) -> (the input slot standing for its value, the cell): a replay reads
        # these cells (held strongly)
        self.inputs: dict = {}
        self.made: weakref.WeakSet = weakref.WeakSet()  # cells made during the capture
        self.rng: list = []  # (seed slot, offset slot, offset) of each random op
        self.checks: list = []  # (flags, specs, op, line) of the ops' value checks
        # (devices, wrap, to_global, to_local) once a collective was recorded: the graph
        # is then one rank's part of an SPMD program over the process group's devices
        self.mesh = None

    # --- what fused mode and the storage cells report ----------------------------------

    def read(self, cell, value):
        """``cell``'s value as this capture's ops see it: its input (pending) value."""
        key = id(cell)
        if key in self.inputs:  # (the cell's value was overwritten since: not an input)
            return value
        if value is None:  # unwritten: its value is whatever a replay finds there
            if cell in self.made:  # (made by this capture: zeros, as fresh storage)
                return None
            aval = _unwritten.get(cell)
            if aval is None:
                aval = jax.core.ShapedArray((cell.size,), jax_dtype(cell.dtype))
        else:
            aval = value.aval
        if cell not in self.saved:
            self.saved[cell] = (value, cell.owned)
        graph = self.graph
        slot = len(graph.inputs)
        graph.inputs.append(None)  # (the array is the cell's at each replay)
        graph.input_sigs.append(aval)
        self.inputs[key] = (slot, cell)
        p = Pending(fused.shaped(aval), graph, slot)
        cell._value = p
        return p

    def touch(self, cell, old, made: bool = False) -> None:
        """``cell`` is about to be written (``old``: its value before; ``made``: it is
        being made)."""
        if cell not in self.saved:
            self.saved[cell] = (old, cell.owned)
        if made:
            self.made.add(cell)

    def use_mesh(self, devices: tuple, wrap, to_global, to_local) -> None:
        """A collective over ``devices`` was recorded: replays run as SPMD programs,
        ``wrap(run, devices)`` making one rank's replay function the group's (see
        ``torch_pjrt.distributed.compiled``)."""
        if self.mesh is None:
            self.mesh = (devices, wrap, to_global, to_local)
        elif self.mesh[0] != devices:
            self.refuse("", "runs collectives of two process groups")

    def refuse(self, reason: str, what: str | None = None) -> None:
        """A flush for ``reason`` (or an operation ``what``) during the capture: a
        program boundary does nothing; anything else ends the capture with an error."""
        if what is None and reason in _BOUNDARIES:
            return
        how = what or _HOW.get(reason, f"needs a value on the host ({reason})")
        error = CaptureError(
            f"pjrt graph capture: the code at {metrics.user_line()} {how}, which a captured "
            "graph cannot do: a replay runs on the device only, with no host work. Move it "
            "out of the captured region (before capture_begin, or after replay()). The "
            f"capture begun at {self.line} is abandoned."
        )
        self.abort(error)
        raise error

    # --- ending --------------------------------------------------------------------------

    def _finish(self) -> None:
        for cell, (value, owned) in list(self.saved.items()):
            cell._value, cell.owned = value, owned
        self.graph.capture = None
        del _active[self.index]
        fused.capturing -= 1
        recording(False)
        asserts.capture_sink = None

    def abort(self, error: Exception | None = None) -> None:
        """End the capture keeping nothing: every cell as it was before it began."""
        if _active.get(self.index) is not self:
            return
        graph = self.graph
        graph._drop(graph.nodes, error or CaptureError("the graph capture was abandoned"))
        self._finish()

    def end(self) -> Captured:
        """End the capture: the graph to replay. Cells keep their values of before."""
        graph = self.graph
        nodes, sigs = graph.nodes, graph.input_sigs
        wheres: dict = {}  # a value the program computes -> the cells it goes to
        aliases, constants = [], []  # (cell, input slot), (cell, array) to store
        inputs = self.inputs
        for cell in list(self.saved.keys()):
            key = id(cell)
            v = cell._value
            if v.__class__ is Pending and v.graph is graph and v.value is None:
                where = v.where
                if where.__class__ is int:
                    if inputs.get(key, (None,))[0] != where:
                        aliases.append((cell, where))
                else:
                    wheres.setdefault(where, []).append(cell)
            elif v is not None and v.__class__ is not Pending:
                constants.append((cell, v))
        outputs = tuple(wheres)
        out_cells = [wheres[w] for w in outputs]
        avals = [nodes[n][3][i].aval for n, i in outputs]
        # the value checks of the ops recorded: outputs too, read after each replay
        checks = [
            (p.where, specs, op, line)
            for p, specs, op, line in self.checks
            if p.__class__ is Pending and p.graph is graph and p.value is None
        ]
        outputs += tuple([where for where, *_ in checks])
        # an input cell the graph overwrites (a parameter, an optimizer state) whose
        # value keeps its shape: its buffer may be reused for the new value
        # (a value stored with another shape than the graph read it with, a flat copy_
        # into a shaped tensor or a cache read back as the view an op wanted, is taken by
        # the program in the shape it stores, and reshaped inside: a reshape outside it,
        # at each replay, is an eager JAX op of ~50 us, and one of the stored value
        # inside costs XLA copies of the cache where it is updated in place)
        updatable, entering = [], {}
        for k, (cells, aval) in enumerate(zip(out_cells, avals)):
            if len(cells) == 1:
                slot = inputs.get(id(cells[0]), (None,))[0]
                if slot is None or sigs[slot].dtype != aval.dtype:
                    continue
                if sigs[slot].shape != aval.shape:
                    if sigs[slot].size != aval.size:
                        continue
                    entering[slot] = aval.shape
                updatable.append((slot, cells[0]))
        cell_slots = dict(inputs.values())
        # numbers are baked into the program (a random op's seed and offset excepted)
        rng_slots = {s for s, _, _ in self.rng} | {o for _, o, _ in self.rng}
        baked = {
            i: x
            for i, (x, sig) in enumerate(zip(graph.inputs, sigs))
            if sig.__class__ is type and i not in rng_slots
        }
        captured = Captured(
            index=self.index,
            nodes=tuple([node[:3] for node in nodes]),
            sigs=tuple(sigs),
            constants=list(graph.inputs),
            baked=baked,
            cell_slots=sorted(cell_slots.items()),
            rng=[(s, o, offset - self.rng_offset) for s, o, offset in self.rng],
            outputs=outputs,
            entering=entering,
            out_cells=out_cells,
            updatable=sorted(updatable, key=lambda u: u[0]),
            aliases=aliases,
            constant_writes=constants,
            names=list(graph.names),
            checks=[rest for _, *rest in checks],
            line=self.line,
            mesh=self.mesh,
        )
        for cells, aval in zip(out_cells, avals):
            for cell in cells:
                if self.saved[cell][0] is None:  # made during the capture
                    _unwritten[cell] = aval
        graph._drop(
            nodes, CaptureError("a value of a graph capture can be read after replay() only")
        )
        self._finish()
        metrics.count("graph_captures")
        return captured


def begin(index: int, rng_offset: int) -> Capture:
    """Start capturing the ops of device ``index`` (``rng_offset``: the device's RNG
    offset now; random ops of the capture take offsets relative to it at replay)."""
    if _active:
        other = next(iter(_active.values()))
        raise CaptureError(
            f"pjrt graph capture: a capture is already under way (begun at {other.line}); "
            "one capture may be under way at a time. End it (capture_end) first."
        )
    fused.flush_all("graph capture")
    graph = fused._graph(index)
    capture = Capture(index, rng_offset)
    graph.capture = capture
    _active[index] = capture
    fused.capturing += 1
    recording(True)
    asserts.capture_sink = lambda *check: capture.checks.append(check)
    return capture


def _on(x, device):
    """A number (a random op's seed or offset) as an array on ``device``."""
    if x.__class__ is int:
        return jax.device_put(np.int64(x), device)
    return x


def _packing(fn, k: int):
    """``fn`` with its last ``k`` outputs (check flags, ``asserts``) packed into one."""

    def packed(*args):
        values = fn(*args)
        flags = values[-k:]
        width = max(f.shape[1] for f in flags)
        rows = [jnp.pad(f, ((0, 0), (0, width - f.shape[1]))) for f in flags]
        return [*values[:-k], jnp.concatenate(rows)]

    packed.__name__ = packed.__qualname__ = fn.__name__
    return packed


def _note(marks: dict, i: int, mark) -> None:
    """Input ``i``'s value comes from the checks ``mark`` (what ``asserts`` marked it
    with; none when empty)."""
    if mark:
        marks[i] = mark
    else:
        marks.pop(i, None)


def _make_reshapes(shapes: tuple):
    return lambda *values: [v.reshape(shape) for v, shape in zip(values, shapes)]


# the inputs a replay takes in other shapes than their cells hold (a cache an eager
# prefill wrote), all in one program
_reshaped = executor.helper("graph input reshape", _make_reshapes, maxsize=256)

_MAX_PROGRAMS = 64
_programs: dict = {}  # what a capture recorded -> its executor.Program (see Captured)


def _entering(fn, shapes: dict, slots: tuple, kept: list):
    """``fn(donated, kept)`` (a replay program) with the inputs of the slots in ``shapes``
    reshaped to ``shapes[slot]`` first (they come in the shape their cells store)."""

    def entered(donated_inputs, kept_inputs):
        donated_inputs = [
            x.reshape(shapes[i]) if i in shapes else x for i, x in zip(slots, donated_inputs)
        ]
        kept_inputs = [
            x.reshape(shapes[i]) if i in shapes else x for i, x in zip(kept, kept_inputs)
        ]
        return fn(donated_inputs, kept_inputs)

    entered.__name__ = entered.__qualname__ = fn.__name__
    return entered


_value_of = operator.attrgetter("_value")
_owned_of = operator.attrgetter("owned")


def _getter(indices: list):
    """``pool -> [pool[i] for i in indices]``, in C (``operator.itemgetter``)."""
    if not indices:
        return lambda pool: []
    if len(indices) == 1:
        only = indices[0]
        return lambda pool: [pool[only]]
    get = operator.itemgetter(*indices)
    return lambda pool: list(get(pool))


def _own_all(cells: list, values: list, index: int) -> None:
    """``cell.own(value)`` for each pair (``tensor.Cell``): when no capture is under way
    and no recording of device ``index`` could take the old buffers
    (``fused.recording_open``), stored directly, without a release per cell."""
    if fused.capturing or fused.recording_open(index):
        for cell, value in zip(cells, values):
            cell.own(value)
        return
    for cell, value in zip(cells, values):
        cell._value = value
        cell.owned = True


class _Plan:
    """A replay's arguments when the updatable cells that own their values are
    ``owned`` (theirs are donated): the donated slots, and getters of the donated and
    the kept inputs from the cells' values followed by ``Captured._extra``'s."""

    __slots__ = ("donated", "gone", "rest", "extra")

    def __init__(self, captured: Captured, owned: tuple):
        updatable = captured.updatable
        self.donated = tuple([slot for (slot, _), mine in zip(updatable, owned) if mine])
        gone = set(self.donated) | set(captured.baked)
        kept = [i for i in range(len(captured.sigs)) if i not in gone]
        where = {slot: i for i, slot in enumerate(captured._slots)}
        n = len(where)
        extra: list = []
        for s, o, _ in captured.rng:
            extra += (s, o)
        extra += captured._other_slots
        for k, slot in enumerate(extra):  # (a slot named twice: its last value, as before)
            where[slot] = n + k
        self.gone = _getter([where[s] for s in self.donated])
        self.rest = _getter([where[s] for s in kept])
        self.extra = bool(extra)


class Captured:
    """A captured graph: one program over the cells it read and wrote."""

    def __init__(self, **fields):
        self.__dict__.update(fields)
        self.random_ops = len(self.rng)
        baked, mesh = self.baked, self.mesh
        recorded = (self.nodes, self.sigs, self.outputs)

        # NOTE: the program's key is the donated slots alone (the rest of a recording's
        # key is this graph's, fixed): hashing the whole recording costs ~65 us a call
        entering, checks = self.entering, len(self.checks)
        # (the shapes the program takes its inputs in: their cells', where they differ)
        self.wanted = [
            sig if i not in entering else jax.core.ShapedArray(entering[i], sig.dtype)
            for i, sig in enumerate(self.sigs)
        ]
        recorded_shapes = {i: self.sigs[i].shape for i in entering}
        # every check of the graph in one array and one record per replay (each costs
        # a few microseconds), each row labelled with its op and line
        self.check_specs = tuple(
            [
                (kind, message, label or (op, line))
                for specs, op, line in self.checks
                for kind, message, label in specs
            ]
        )

        def build(donated):
            key = (*recorded, donated)
            fn, donate = fused.replay_program(key, baked, inline=mesh is not None)
            if entering:
                gone = set(donated) | set(baked)
                kept = [i for i in range(len(self.sigs)) if i not in gone]
                fn = _entering(fn, recorded_shapes, donated, kept)
            if checks:
                fn = _packing(fn, checks)
            if mesh is None:
                return fn, donate
            return mesh[1](fn, mesh[0]), donate

        # NOTE: a capture of the same ops over other storages (a recapture for a new KV
        # cache, a second graph of the same step) shares the compiled programs
        shared = None
        if mesh is None:
            numbers = tuple([(k, type(v), v) for k, v in sorted(baked.items())])  # (1 == 1.0)
            shared = (self.index, recorded, numbers, tuple(sorted(entering.items())))
            self.program = _programs.get(shared)
        if shared is None or self.program is None:
            self.program = executor.Program(
                "captured",
                f"the graph captured at {self.line}",
                build,
                lambda donated, traced: fused.describe_recording((*recorded, donated), traced),
                contents=lambda donated: fused.recording_contents(recorded),
                placed=(lambda key, index=self.index: index) if mesh is None else None,
                follows=False,  # (replay() follows its checks, knowing what changed)
            )
            if shared is not None:
                if len(_programs) >= _MAX_PROGRAMS:  # the oldest goes
                    del _programs[next(iter(_programs))]
                _programs[shared] = self.program
        self.replays = 0
        self._bind()

    def _bind(self) -> None:
        """What a replay knows of the cells the graph reads and writes (made again when
        they change: :meth:`rebind`).

        NOTE: a replay's host time is what capture saves, so it skips what it can: the
        cells' values that are the same arrays as at the last replay (or those it wrote
        into them) are not checked again, and the checks they come from are known (an
        array's are fixed when it is made)."""
        self._slots = [slot for slot, _ in self.cell_slots]
        self._cells = [cell for _, cell in self.cell_slots]
        self._raw = None  # the cells' values after the last replay
        self._vals = None  # the same, as the program takes them
        # position -> the checks its value comes from (if any), but for the values the
        # last replay fed back, which come from its checks (_fed_mark) unless noted here
        self._marks: dict = {}
        self._fed_mark = ()
        self._renoted: set = set()  # fed positions noted since the last replay
        position = {id(cell): i for i, cell in enumerate(self._cells)}
        position_of_slot = {slot: i for i, slot in enumerate(self._slots)}
        fed = {position[id(cell)] for _, cell in self.updatable}
        written = [c for cells in self.out_cells for c in cells]
        written += [c for c, _ in self.aliases] + [c for c, _ in self.constant_writes]
        self._stale = sorted(
            {position[id(c)] for c in written if id(c) in position} - fed
        )  # cells read and written that a replay checks again after (shape, owner)
        # the outputs stored into one cell alone (owned by it), and of those the cells
        # the graph reads too: (the value's index, the cell's input position)
        single = [(k, cells[0]) for k, cells in enumerate(self.out_cells) if len(cells) == 1]
        self._single_cells = [cell for _, cell in single]
        self._single_values = _getter([k for k, _ in single])
        self._read_back = [(k, position[id(c)]) for k, c in single if id(c) in position]
        self._shared = [(k, cells) for k, cells in enumerate(self.out_cells) if len(cells) > 1]
        self._fed = fed  # (positions whose values the graph feeds back)
        self._updatable_cells = [cell for _, cell in self.updatable]
        self._plans: dict = {}  # which updatable cells own their value -> _Plan
        rng_slots = {s for s, _, _ in self.rng} | {o for _, o, _ in self.rng}
        self._other_slots = [  # (arrays the graph read that no cell holds)
            i
            for i in range(len(self.sigs))
            if i not in position_of_slot and i not in self.baked and i not in rng_slots
        ]

    def cells(self) -> set:
        """Every storage cell the graph reads or writes."""
        found = set(self._cells)
        found.update([c for cells in self.out_cells for c in cells])
        found.update([c for c, _ in self.aliases] + [c for c, _ in self.constant_writes])
        return found

    def rebind(self, moved: dict) -> None:
        """Read and write other cells from now on: ``moved`` maps a cell of the graph
        to the one that takes its place (of the same size and dtype, on the same device,
        none of them a cell the graph keeps). The same program replays: this is what a
        new capture of the same ops over those cells would give, without capturing
        (``torch.compile``'s reduce-overhead graphs, handed a new KV cache by each
        ``generate()``)."""
        to = lambda c: moved.get(c, c)  # noqa: E731
        self.cell_slots = [(slot, to(c)) for slot, c in self.cell_slots]
        self.out_cells = [[to(c) for c in cells] for cells in self.out_cells]
        self.updatable = [(slot, to(c)) for slot, c in self.updatable]
        self.aliases = [(to(c), slot) for c, slot in self.aliases]
        self.constant_writes = [(to(c), v) for c, v in self.constant_writes]
        self._bind()

    def _value(self, slot: int, cell, reshape: bool = True):
        """``cell``'s value as input ``slot`` takes it (its shape checked; left in the
        cell's shape of the same size unless ``reshape``)."""
        v = cell._value
        if v is None or v.__class__ is Pending:
            v = cell.materialize()
        want = self.wanted[slot]
        if v.shape != want.shape or v.dtype != want.dtype:
            if v.size != want.size or v.dtype != want.dtype:
                raise RuntimeError(
                    f"pjrt graph replay: a tensor the graph captured at {self.line} reads "
                    f"holds {v.dtype}{list(v.shape)} now, but {want.dtype}"
                    f"{list(want.shape)} when it was captured. A graph replays on the "
                    "shapes it was captured with: copy_ new values into the captured "
                    "tensors, or capture a graph for the new shape."
                )
            if reshape:
                v = v.reshape(want.shape)
        return v

    def arguments(self, seed: int = 0, offset: int = 0) -> list:
        """Every input slot's value for a replay now: the cells' arrays, the baked
        numbers, and the random ops' (seed, offset)."""
        return self._slot_values([self._value(s, c) for s, c in self.cell_slots], seed, offset)

    def _slot_values(self, vals: list, seed, offset) -> list:
        """Every input slot's value, given the cells' (``vals``, in ``cell_slots``' order)."""
        args = list(self.constants)
        for slot, v in zip(self._slots, vals):
            args[slot] = v
        for s, o, delta in self.rng:
            args[s], args[o] = seed, offset + delta
        return args

    def _inputs(self) -> list:
        """The cells' values as the program takes them (those that changed since the
        last replay checked now, and the checks they come from noted)."""
        raw, last = list(map(_value_of, self._cells)), self._raw
        if last is not None and not any(map(_is_not, raw, last)):
            return self._vals
        vals = list(self._vals) if last is not None else [None] * len(raw)
        marks, sources, wanted = self._marks, asserts.SOURCES, self.wanted
        fed = self._fed
        odd = []  # (the values held in another shape of the same size)
        for i, (slot, cell) in enumerate(self.cell_slots):
            if last is None or raw[i] is not last[i]:
                v = vals[i] = self._value(slot, cell, reshape=False)
                if v.shape != wanted[slot].shape:
                    odd.append(i)
                _note(marks, i, getattr(v, sources, None))
                if i in fed:
                    self._renoted.add(i)
        if odd:  # one program for them all (an eager reshape costs ~30-50 us each)
            shapes = tuple([wanted[self._slots[i]].shape for i in odd])
            for i, v in zip(odd, _reshaped(shapes)(*[vals[i] for i in odd])):
                vals[i] = v
        self._raw, self._vals = list(map(_value_of, self._cells)), vals
        return vals

    def _plan(self) -> _Plan:
        """How this replay's arguments are gathered: by which updatable cells own their
        value now (those are donated)."""
        owned = tuple(map(_owned_of, self._updatable_cells))
        plan = self._plans.get(owned)
        if plan is None:
            plan = self._plans[owned] = _Plan(self, owned)
        return plan

    def replay(self, seed: int = 0, offset: int = 0) -> None:
        """Run the graph once: its outputs are stored into the cells it writes."""
        # the marks of the last replay's results, stored now if they wait (before the
        # program runs: after it, host work competes with its threads on the CPU)
        asserts.settle()
        vals = self._inputs()
        plan = self._plan()
        pool = vals
        if plan.extra:  # (the random ops' seeds and offsets, arrays not in cells)
            pool = vals + self._extra(seed, offset)
        # the unread or failed checks the inputs come from (for the values the last
        # replay fed back, its own, unless every one of them was replaced since)
        marks, fed_mark = self._marks, self._fed_mark
        if len(self._renoted) == len(self._fed):
            fed_mark = ()
        parents = ()
        if (marks or fed_mark) and asserts.watching():
            parents = asserts.merged([fed_mark, *marks.values()] if marks else [fed_mark])
        gone, rest = plan.gone(pool), plan.rest(pool)
        mesh = self.mesh
        if mesh is not None:  # every rank's arrays: blocks of global arrays
            device = platform.device(self.index)
            rest = [_on(x, device) for x in rest]
            gone, rest = mesh[2](gone, mesh[0]), mesh[2](rest, mesh[0])
        values = self.program(plan.donated, gone, rest)
        if mesh is not None:
            values = [mesh[3](v) for v in values]
        n = len(self.out_cells)
        if self.checks:  # (the value after the cells' is the recorded ops' checks)
            name, specs, line = self.program.name, self.check_specs, self.line
            mark = asserts.expect(values[n], specs, name, line, values[:n], None, parents, True)
        else:
            if parents:
                asserts.follow(values[:n], parents)
            mark = parents
        raw, vals = self._raw, self._vals
        _own_all(self._single_cells, self._single_values(values), self.index)
        for k, cells in self._shared:  # one value, several storages: none owns it alone
            for cell in cells:
                cell.array = values[k]
        if self.aliases:  # (a cell made to alias an input: the value it took now)
            args = self._slot_values(vals, seed, offset)
            for cell, slot in self.aliases:
                cell.array = args[slot]
        for cell, value in self.constant_writes:
            cell.array = value
        for k, i in self._read_back:  # (the program's values: the shapes it takes)
            raw[i] = vals[i] = values[k]
        if self._fed:  # (every fed-back value's mark, in one field: no loop over them)
            self._fed_mark = mark
        if self._renoted:  # (fed back again: their marks are the new fed mark)
            for i in self._renoted:
                marks.pop(i, None)
            self._renoted.clear()
        for i in self._stale:
            raw[i] = _STALE
        self.replays += 1
        metrics.count("graph_replays")

    def _extra(self, seed: int, offset: int) -> list:
        """The input slots' values that are not cells': the random ops' seeds and
        offsets, then the other arrays the graph read (in slot order)."""
        extra = []
        for _, _, delta in self.rng:
            extra += (seed, offset + delta)
        return extra + [self.constants[slot] for slot in self._other_slots]

    def lower(self):
        """The lowered program (for ``Graph.debug_dump``)."""
        args = self.arguments()
        kept = [x for i, x in enumerate(args) if i not in self.baked]
        return self.program.lower((), (), kept)
