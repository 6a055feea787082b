"""One FX graph of ATen ops -> one jitted JAX function, through the lowering registry.

A :class:`GraphProgram` walks the graph's nodes inside a ``jax.jit`` trace, calling
each node's lowering (``registry.graph_lookup``) on JAX values, so the whole graph
becomes a single XLA program. At call time it reads its tensor arguments' arrays,
runs the program, writes the new values of mutated inputs back into their storages
(donating the old buffers where nothing else can see them) and wraps the outputs.
"""

from __future__ import annotations

import collections
import itertools

import jax
import jax.numpy as jnp
import torch
import torch.fx
from torch._ops import OpOverload

from torch_pjrt import runtime
from torch_pjrt.compile import buckets
from torch_pjrt.compile.nodes import (
    AUTO_FUNCTIONALIZED,
    FREE,
    AutoFunctionalized,
    Call,
    Unsupported,
    free_values,
    source_line,
)
from torch_pjrt.compile.padded import PaddedProgram
from torch_pjrt.device import random as pjrt_random
from torch_pjrt.device.binding import device_of, same_device_error, static
from torch_pjrt.device.tensor import (
    argument,
    cell_of,
    keep_layout,
    new_tensor,
    read,
    whole,
    wrap,
    write,
)
from torch_pjrt.modes import fused
from torch_pjrt.ops.registry import LoweringMissing, graph_lookup, lookup
from torch_pjrt.runtime import asserts, executor
from torch_pjrt.runtime import events as metrics

aten = torch.ops.aten

try:  # functional collectives in graphs (registers their graph lowerings)
    from torch_pjrt.distributed import compiled as _spmd_collectives
except ImportError:  # (a PyTorch built without torch.distributed)
    _spmd_collectives = None

__all__ = ["GraphProgram"]

_ids = itertools.count()


class GraphProgram:
    """A callable running one FX graph as one XLA program on a pjrt device.

    Args:
        gm: a graph of ATen ops (every call_function node :func:`node_supported`).
        kind: "forward", "backward", "inference" or "part" (for dumps and metrics).
        parent_kind: for a part, the kind of the graph it was split from.
        n_user_outputs: for a training forward, how many outputs are the user's (the
            rest are saved for the backward and may stay padded).
        alias_outputs: positions of outputs that alias an input (no bucket padding
            then: their strides must be the input's).
    """

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        kind: str = "inference",
        parent_kind=None,
        n_user_outputs: int | None = None,
        alias_outputs=frozenset(),
    ):
        self.gm = gm
        self.kind = kind
        # outputs AOT autograd rebuilds as views of an input from our strides
        self.alias_outputs = alias_outputs
        # a training forward returns the user's outputs, then what the backward saves
        self.n_user_outputs = n_user_outputs
        self.parent_kind = parent_kind  # for a part: the kind of the graph it came from
        self.id = next(_ids)
        self.name = f"graph_{self.id:03d}_{kind}"
        nodes = list(gm.graph.nodes)
        self.inputs = [n for n in nodes if n.op == "placeholder"]
        self.body = [n for n in nodes if n.op in ("call_function", "get_attr")]
        output = next(n for n in nodes if n.op == "output")
        self.outputs = (
            list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
        )
        self.output_is_seq = isinstance(output.args[0], (list, tuple))
        position = {n: i for i, n in enumerate(self.inputs)}
        # functionalized in-place updates of inputs: copy_(input, new value)
        self.mutated: dict[int, torch.fx.Node] = {}
        self.calls: dict[torch.fx.Node, Call] = {}
        self.random_nodes = 0
        for n in self.body:
            if n.op != "call_function":
                continue
            if n.target is aten.copy_.default and n.args[0] in position:
                self.mutated[position[n.args[0]]] = n.args[1]
                continue
            if n.target is AUTO_FUNCTIONALIZED and AutoFunctionalized.supports(n):
                self.calls[n] = AutoFunctionalized(n.args[0], lookup(n.args[0]))
                continue
            if isinstance(n.target, OpOverload) and n.target is not aten.copy_.default:
                lowering = graph_lookup(n.target)
                if lowering is None:
                    where = source_line(n) or "a line the graph did not record"
                    raise Unsupported(f"{n.target} (from {where}) has no pjrt lowering")
                self.calls[n] = Call(n.target, lowering, lookup(n.target) is not None)
                self.random_nodes += lowering.random
        self.mutated_positions = tuple(sorted(self.mutated))
        # values no lowering reads (host arithmetic that only ends in outputs): not
        # arguments of the program, their outputs computed at each call (host_outputs)
        self.free, self.free_nodes, self.host_nodes = free_values(
            self.inputs, self.body, self.calls
        )
        # functional collectives of one pjrt group: the program runs SPMD over the group
        self.group_name = None
        if _spmd_collectives is not None:
            single, self.group_name = _spmd_collectives.collective_group(self.calls)
            if not single:
                raise Unsupported("collectives of several process groups in one graph")
            for n in self.calls:
                if _spmd_collectives.is_collective(n):
                    metrics.tally("graph_spmd_collectives", str(n.target))
        self.constants = {n: getattr(gm, n.target) for n in self.body if n.op == "get_attr"}
        self.program = executor.Program(
            "graph",
            self.name,
            self._build,
            _describe,
            kind=kind,
            placed=_placed,
            contents=lambda key: [str(n.target) for n in self.calls],
        )
        self._static_outputs: dict = {}
        self.declined = None  # a lowering declined this graph's arguments: it runs eagerly
        self.dumper = None  # set by the backend: has .active and .write(program, lowered)
        # padding symbolic sizes to buckets, if any (not for SPMD graphs)
        self.plan = buckets.plan(self) if self.group_name is None else None
        self.padded = None if self.plan is None else PaddedProgram(self, self.plan)
        # outputs the user sees keep the strides and offset PyTorch gives them: AOT
        # autograd rebuilds outputs that alias an input from exactly these
        user = len(self.outputs) if self.kind != "backward" else 0
        if self.n_user_outputs is not None:
            user = self.n_user_outputs
        self.layouts = {
            i: layout
            for i, o in enumerate(self.outputs[:user])
            if (layout := _strided_layout(o)) is not None
        }

    # --- tracing ------------------------------------------------------------------

    def _keys(self, rng):
        """A function giving each random node of one run its own key (from the device
        RNG state passed in as ``rng``: seed and offset)."""
        if not self.random_nodes:
            return lambda: None
        base = jax.random.fold_in(jax.random.key(rng[0]), rng[1])
        draws = itertools.count()
        return lambda: jax.random.fold_in(base, next(draws))

    def _evaluate(self, values: list, rng, record: dict):
        env: dict = dict(zip(self.inputs, values))
        next_key = self._keys(rng)

        def load(a):
            return env[a] if isinstance(a, torch.fx.Node) else a

        for n in self.body:
            if n.op == "get_attr":
                env[n] = self._constant(n)
                continue
            if n in self.free_nodes:
                env[n] = FREE
                continue
            args = torch.fx.node.map_aggregate(n.args, load)
            kwargs = torch.fx.node.map_aggregate(n.kwargs, load)
            target = n.target
            if target is aten.copy_.default:
                dst, src = args[0], args[1]
                env[n] = jnp.broadcast_to(jnp.asarray(src).astype(dst.dtype), dst.shape)
                continue
            call = self.calls.get(n)
            if call is None:  # size arithmetic on static Python ints
                env[n] = target(*args, **kwargs)
                continue
            before = asserts.label((target, source_line(n)))  # (what a check names)
            try:
                env[n] = call(args, kwargs, next_key() if call.random else None)
            finally:
                asserts.label(before)
        outs = []
        for i, o in enumerate(self.outputs):
            v = load(o)
            if isinstance(v, jax.Array):
                outs.append(v)
            else:  # a static value (None, a size): returned beside the program
                record[i] = v
                outs.append(None)
        new_values = [env[self.mutated[p]] for p in self.mutated_positions]
        return outs, new_values

    def _constant(self, node):
        value = self.constants[node]
        if isinstance(value, torch.Tensor):
            if value.device.type == "pjrt":
                return read(value)
            return jnp.asarray(value.detach().numpy())
        return value

    def _build(self, key):
        statics, kinds = key[0], key[1]
        record: dict = {}

        def run(donated, arrays, rng):
            metrics.count("compile_traces")
            values = []
            it_arrays, it_donated, it_statics = iter(arrays), iter(donated), iter(statics)
            for kind in kinds:
                if kind == "d":
                    values.append(next(it_donated))
                elif kind == "a":
                    values.append(next(it_arrays))
                elif kind == "h":
                    values.append(FREE)
                else:
                    values.append(next(it_statics))
            return self._evaluate(values, rng, record)

        run.__name__ = run.__qualname__ = self.name  # names the XLA module and its dump
        if self.group_name is not None:  # one rank's graph, as the group's SPMD program
            run = _spmd_collectives.spmd(run, key[5])
            run.__name__ = self.name
        self._static_outputs[key] = record
        return run, "d" in kinds

    # --- calling --------------------------------------------------------------------

    def arguments(self, args, given=None):
        """(donated arrays, other arrays, statics, device index, kinds, cells) of a call;
        cells maps a donated argument's position to its storage cell. ``given``: position
        -> the array to pass for that tensor argument instead of its value."""
        index = device_of(args)
        values, candidates = [], {}
        mutated = self.mutated
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                values.append(static(a))
                continue
            if given and i in given and a.get_device() == index:
                values.append(given[i])
                continue
            if a.is_cpu:
                metrics.count("transfers_to_device")
                values.append(runtime.from_host(a.detach(), runtime.device(index)))
                continue
            if a.get_device() != index:  # (not CPU: a pjrt tensor, as Dynamo traced it)
                raise same_device_error(f"pjrt:{index}", a.device)
            padded = getattr(a, "_pjrt_padded", None)
            if padded is not None and tuple(a.shape) != padded.true_shape:
                # a saved activation that stayed padded (a merged padded dim: its tensor
                # has the padded shape), for a backward that runs at exact sizes
                values.append(buckets.compact(padded))
                continue
            value = whole(a)
            if value is None:
                value = argument(a)
            elif i in mutated and self.group_name is None:
                cell = cell_of(a)
                if cell.owned and cell.dtype == a.dtype:  # (the storage's own array)
                    candidates[i] = cell
            values.append(value)
        if candidates:  # an array passed twice (two views of one storage) stays
            passed = collections.Counter(id(v) for v in values if isinstance(v, jax.Array))
            candidates = {i: c for i, c in candidates.items() if passed[id(values[i])] == 1}
        donated, arrays, statics, kinds = [], [], [], []
        free = self.free
        for i, (a, value) in enumerate(zip(args, values)):
            if i in free:
                kinds.append("h")
            elif not isinstance(a, torch.Tensor):
                statics.append(value)
                kinds.append("s")
            elif i in candidates:
                donated.append(value)
                kinds.append("d")
            else:
                arrays.append(value)
                kinds.append("a")
        return donated, arrays, tuple(statics), index, tuple(kinds), candidates

    def __call__(self, *args):
        if fused.capturing:  # under a graph capture (torch.pjrt.graph): recorded
            return self._record(args)
        if fused.pending_ops():  # ops recorded before the graph (fused mode) run first
            fused.flush_all("compiled graph")
        if self.declined is None:
            try:
                return self._call(args)
            except LoweringMissing as exc:  # a lowering declines what the graph gives it
                self.declined = exc
                metrics.tally("graph_declined", f"{self.name}: {exc.reason or exc}")
        # the graph's ops run one by one: the declined one by the fallback policy
        out = self.gm(*args)
        return list(out) if self.output_is_seq else [out]

    def _call(self, args):
        if self.plan is not None and self.plan.active:
            try:
                return self.padded(args)
            except buckets.NotBucketable as exc:
                self.plan.active = False
                metrics.tally("graph_bucket_fallbacks", f"{self.name}: {exc}")
        donated, arrays, statics, index, kinds, cells = self.arguments(args)
        if executor.mesh_in_use:  # SPMD (distributed/spmd.py): one-device inputs join the mesh
            aligned = executor.align([*donated, *arrays])
            donated, arrays = aligned[: len(donated)], aligned[len(donated) :]
        mesh = None
        if self.group_name is not None:  # every rank's arrays: blocks of global arrays
            mesh = _spmd_collectives.devices(self.group_name, index)
            arrays = _spmd_collectives.to_global(arrays, mesh)
        # NOTE: shapes and dtypes are part of the key (the static outputs recorded at trace
        # time are per key); the executor counts each compilation with what changed
        key = (
            statics,
            kinds,
            tuple([a.aval for a in donated]),
            tuple([a.aval for a in arrays]),
            torch.get_float32_matmul_precision(),  # read by the lowerings as they trace
            mesh,
        )
        if not donated and not arrays:  # a graph that only creates: placed on its device
            key = (*key, index)
        program = self.program
        rng = pjrt_random.next_key_parts(index) if self.random_nodes else (0, 0)
        metrics.count("graph_executions")
        if donated:
            metrics.count("graph_donated_buffers", len(donated))
        if key not in program.cache and self.dumper is not None and self.dumper.active:
            self.dumper.write(self, program.lower(key, donated, arrays, rng))
        outs, new_values = program(key, donated, arrays, rng)
        if mesh is not None:  # this rank's blocks
            local = _spmd_collectives.to_local
            with jax.enable_x64(True):
                outs = [None if o is None else local(o) for o in outs]
                new_values = [local(v) for v in new_values]
        for p, value in zip(self.mutated_positions, new_values):
            cell = cells.get(p)
            if cell is not None:  # the whole storage, already checked: swap the buffer
                if executor.mesh_in_use:  # SPMD: the input keeps its layout
                    value = keep_layout(cell._value, value)
                cell.own(value)
            else:
                write(args[p], value, owned=True)
        return self._results(outs, key, args, index)

    def _results(self, outs, key, args, index: int) -> list:
        """The graph's outputs as tensors (arrays or a capture's pending values): static
        outputs as recorded at trace time, strided ones in their layouts."""
        record = self._static_outputs[key]
        results = []
        values = hosted = None
        for i, a in enumerate(outs):
            if a is None:
                value = record[i]
                if value is FREE:
                    if hosted is None:  # (every free output at once)
                        hosted = self.host_outputs(args)
                    value = hosted[i]
                results.append(value)
                continue
            layout = self.layouts.get(i)
            if layout is not None:
                if values is None:  # this call's symbol values
                    values = self._symbol_values(args)
                layout = _concrete(layout, values, a.shape)
            # (a program's results are new values, each its tensor's own: tensor.Cell)
            results.append(
                wrap(a, index, True) if layout is None else _wrap_strided(a, layout, index)
            )
        return results

    def _record(self, args):
        """The graph as one op of a graph capture (``modes/capture.py``): its program is
        recorded with the capture's pending values as arguments, its outputs are pending
        values, and the inputs it mutates are written (recorded too)."""
        index = device_of(args)
        why = None
        if self.declined is not None:
            why = f"a lowering declines its arguments ({self.declined.reason or self.declined})"
        elif self.plan is not None and self.plan.active:
            why = "its shapes are dynamic (padded to buckets)"
        elif self.group_name is not None or executor.mesh_in_use:
            why = "it runs over a device mesh"
        if why is not None:
            fused.capture_refuse(index, f"calls the compiled graph {self.name}, where {why}")
        arrays, statics, kinds = [], [], []
        for i, a in enumerate(args):
            if i in self.free:
                kinds.append("h")
                continue
            if not isinstance(a, torch.Tensor):
                statics.append(static(a))
                kinds.append("s")
                continue
            if a.is_cpu:
                fused.capture_refuse(index, "passes a CPU tensor to a compiled graph")
            arrays.append(argument(a, True))
            kinds.append("a")
        key = (
            tuple(statics),
            tuple(kinds),
            (),
            tuple([a.aval for a in arrays]),
            torch.get_float32_matmul_precision(),
            None,
        )
        if not arrays:
            key = (*key, index)
        random = bool(self.random_nodes)
        rng = pjrt_random.next_key_parts(index) if random else (0, 0)
        program = self.program.jitted(key)
        recorded = fused.record(program, ((), arrays, rng), index, self.name, random)
        if recorded.__class__ is asserts.Checked:
            recorded = asserts.unpack(recorded, self.name)
        outs, new_values = recorded
        for p, value in zip(self.mutated_positions, new_values):
            write(args[p], value, owned=True)
        return self._results(outs, key, args, index)

    def host_outputs(self, args) -> list:
        """The graph's outputs computed from its free values alone (Python arithmetic on
        ints: ``cache_length + 1``) with this call's arguments, by position (the others
        are not computed here: their entries are meaningless)."""
        env = dict(zip(self.inputs, args))

        def load(a):
            return env.get(a) if isinstance(a, torch.fx.Node) else a

        for n in self.host_nodes:  # (in graph order)
            args_, kwargs = (torch.fx.node.map_aggregate(x, load) for x in (n.args, n.kwargs))
            env[n] = n.target(*args_, **kwargs)
        return [load(o) for o in self.outputs]

    def _symbol_values(self, args) -> dict:
        values = {}
        for node, a in zip(self.inputs, args):
            val = node.meta.get("val")
            if isinstance(val, torch.SymInt) and val.node.expr.is_Symbol:
                values[val.node.expr] = int(a)
            elif isinstance(val, torch.Tensor) and isinstance(a, torch.Tensor):
                for size, n in zip(val.shape, a.shape):
                    if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                        values[size.node.expr] = n
        return values


def _expr(x):
    """An int, or the sympy expression of a symbolic size (read without adding a guard)."""
    return x.node.expr if isinstance(x, torch.SymInt) else int(x)


def _strided_layout(node):
    """(strides, storage offset) of an output whose layout may not be plain row-major;
    symbolic ones are sympy expressions, evaluated per call (``_concrete``)."""
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return None
    shape = tuple(map(_expr, val.shape))
    strides, offset = tuple(map(_expr, val.stride())), _expr(val.storage_offset())
    if all(isinstance(x, int) for x in (*shape, *strides, offset)):
        from torch_pjrt.device.tensor import _is_contiguous

        if offset == 0 and _is_contiguous(shape, strides):
            return None
    return strides, offset


def _concrete(layout, values: dict, shape):
    """The layout with every symbol replaced by this call's value; None when it is
    plain row-major (or cannot be evaluated)."""
    from torch_pjrt.device.tensor import _is_contiguous

    strides, offset = layout
    try:
        strides = tuple(x if isinstance(x, int) else int(x.subs(values)) for x in strides)
        offset = offset if isinstance(offset, int) else int(offset.subs(values))
    except (TypeError, ValueError):
        return None
    if offset == 0 and _is_contiguous(shape, strides):
        return None
    if any(st == 0 and n > 1 for n, st in zip(shape, strides)):
        return None  # an expanded output: stored densely
    return strides, offset


def _wrap_strided(array: jax.Array, layout, index: int) -> torch.Tensor:
    """A new tensor holding ``array`` with the given strides and storage offset."""
    from torch_pjrt.device.tensor import storage_size
    from torch_pjrt.runtime.transfer import torch_dtype

    strides, offset = layout
    shape = tuple(array.shape)
    base = new_tensor((offset + storage_size(shape, strides),), torch_dtype(array.dtype), index)
    view = aten.as_strided.default(base, shape, strides, offset)
    write(view, array)
    return view


def _placed(key):
    """The device of a graph program with no array inputs (its key's last part)."""
    return key[6] if len(key) > 6 else None


def _describe(key, traced) -> list:
    """What a graph program was compiled for (the parts of its call key), for causes."""
    statics, kinds, donated, arrays, precision, mesh = key[:6]
    return [
        ("float32 matmul precision", precision),
        ("the process group's devices", mesh),
        ("argument kinds (a tensor became a value, or donation changed)", kinds),
        ("static arguments", statics),
        *((f"donated input {i}", a) for i, a in enumerate(donated)),
        *((f"input {i}", a) for i, a in enumerate(arrays)),
    ]
