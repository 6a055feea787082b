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
import math
import operator
import re

import jax
import jax.numpy as jnp
import torch
import torch.fx
from torch._ops import OpOverload

from torch_pjrt import runtime
from torch_pjrt.compile import buckets, padding_rules
from torch_pjrt.device import random as pjrt_random
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
from torch_pjrt.ops.registry import Lowering, LoweringMissing, Signature, graph_lookup, lookup
from torch_pjrt.runtime import asserts, executor
from torch_pjrt.runtime import events as metrics

aten = torch.ops.aten

try:  # functional collectives in graphs (registers their graph lowerings)
    from torch_pjrt.distributed import compiled as _spmd_collectives
except ImportError:  # (a PyTorch built without torch.distributed)
    _spmd_collectives = None

__all__ = ["GraphProgram", "Unsupported", "node_supported"]

_ids = itertools.count()


class Unsupported(Exception):
    """A node the registry cannot put into a traced program."""


# Python functions Dynamo leaves in graphs for size arithmetic (SymInts are static
# Python ints inside a program)
_PYTHON_OPS = {
    operator.add,
    operator.sub,
    operator.mul,
    operator.floordiv,
    operator.truediv,
    operator.mod,
    operator.neg,
    operator.pow,
    operator.eq,
    operator.ne,
    operator.lt,
    operator.le,
    operator.gt,
    operator.ge,
    operator.getitem,
    math.ceil,
    math.floor,
    math.sqrt,
    torch.sym_float,
    torch.sym_int,
    torch.sym_max,
    torch.sym_min,
    torch.sym_not,
}


def _is_mask(node) -> bool:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.dtype in (torch.bool, torch.uint8)


def _devices(value) -> set:
    found = set()
    for v in value if isinstance(value, (list, tuple)) else (value,):
        if isinstance(v, torch.Tensor):
            found.add(v.device.type)
    return found


def node_supported(node: torch.fx.Node) -> bool:
    """Whether a call_function node can run inside a traced program."""
    target = node.target
    if target in _PYTHON_OPS:
        return True
    if target is _AUTO_FUNCTIONALIZED:
        return _AutoFunctionalized.supports(node)
    if not isinstance(target, OpOverload):
        return False
    if "cpu" in _devices(node.meta.get("val")):
        return False  # host computations (a non-capturable optimizer's step count)
    if target is aten.copy_.default:
        return True
    lowering = graph_lookup(target)
    if lowering is None or lowering.writes:
        return False
    if target in (aten.index.Tensor, aten._unsafe_index.Tensor, aten.index_put.default):
        # boolean masks select a data-dependent number of elements
        indices = node.args[1] if len(node.args) > 1 else node.kwargs.get("indices", ())
        return not any(_is_mask(i) for i in indices)
    return True


def _source_line(node: torch.fx.Node) -> str | None:
    """The user's line a node of a Dynamo graph comes from ('file:line'), if known."""
    found = re.findall(r'File "([^"]+)", line (\d+)', node.meta.get("stack_trace") or "")
    return f"{found[-1][0]}:{found[-1][1]}" if found else None


def _scalar(v):
    """A Scalar argument as eager kernels see it: a weakly typed JAX scalar."""
    if isinstance(v, (bool, int, float, complex)):
        return jnp.asarray(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_scalar(x) for x in v)
    return v


class _Call:
    """How one node's lowering is called: argument names and kinds from the schema."""

    __slots__ = ("fn", "sig", "scalars", "random", "n_outputs")

    def __init__(self, op: OpOverload, lowering: Lowering, in_table: bool):
        self.fn = lowering.fn
        self.sig = Signature(op, lowering.static)
        # eager kernels pass Scalar arguments as weak JAX scalars; graph-only lowerings
        # (allocation, arange) need them as Python numbers
        self.scalars = self.sig.scalars if in_table else []
        self.random = lowering.random

    def __call__(self, args, kwargs, key):
        vals = self.sig.values(args, kwargs)
        for i in self.scalars:
            vals[i] = _scalar(vals[i])
        call = dict(zip(self.sig.names, vals))
        if self.random:
            call["key"] = key
        return self.fn(**call)


_AUTO_FUNCTIONALIZED = getattr(torch.ops.higher_order, "auto_functionalized_v2", None)


class _AutoFunctionalized:
    """``auto_functionalized_v2(op, **kwargs)``: how AOT autograd writes a call of a custom
    op that mutates its arguments (a ``torch_pjrt.kernel`` with ``mutates_args``). Each
    mutated argument is a base of ``_all_bases`` or a slice of one; the lowering's new
    values are written back into the bases functionally, and the node's value is (the
    op's results, the new bases), as PyTorch's dense implementation returns."""

    __slots__ = ("call", "writes", "n_results", "random")

    def __init__(self, op: OpOverload, lowering: Lowering):
        self.call = _Call(op, lowering, True)
        self.random = lowering.random
        self.writes = lowering.writes
        self.n_results = len(op._schema.returns)

    @staticmethod
    def supports(node: torch.fx.Node) -> bool:
        op = node.args[0] if node.args else None
        lowering = lookup(op) if isinstance(op, OpOverload) else None
        if lowering is None or not lowering.writes:
            return False
        # views regenerated with as_strided: not lowered (slices and whole bases are)
        return not any(k.endswith("_storage_offset") for k in node.kwargs)

    def __call__(self, args, kwargs, key):
        kwargs = dict(kwargs)
        bases = list(kwargs.pop("_all_bases", []))
        kwargs.pop("_only_clone_these_bases", None)
        views = {}
        for name in self.writes:
            index = kwargs.pop(f"_{name}_base_index")
            kwargs.pop(f"_{name}_alias", None)
            if index is None:
                kwargs[name] = None
                continue
            base = bases[index]
            where = None
            if f"_{name}_slice_dim" in kwargs:
                dim = kwargs.pop(f"_{name}_slice_dim")
                start = kwargs.pop(f"_{name}_slice_start")
                end = min(kwargs.pop(f"_{name}_slice_end"), base.shape[dim])
                where = (dim, start, end)
                kwargs[name] = jax.lax.slice_in_dim(base, start, end, axis=dim)
            else:
                kwargs[name] = base
            views[name] = (index, where)
        out = self.call((), kwargs, key)
        out = out if isinstance(out, tuple) else (out,)
        n = len(out) - len(self.writes)
        for name, value in zip(self.writes, out[n:]):
            if name not in views or value is None:
                continue
            index, where = views[name]
            if where is None:
                bases[index] = value
            else:
                dim, start, _ = where
                bases[index] = jax.lax.dynamic_update_slice_in_dim(bases[index], value, start, dim)
        results = out[:n]
        if self.n_results == 0:
            results = (None,)
        return (*results, *bases)


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
        self.calls: dict[torch.fx.Node, _Call] = {}
        self.random_nodes = 0
        for n in self.body:
            if n.op != "call_function":
                continue
            if n.target is aten.copy_.default and n.args[0] in position:
                self.mutated[position[n.args[0]]] = n.args[1]
                continue
            if n.target is _AUTO_FUNCTIONALIZED and _AutoFunctionalized.supports(n):
                self.calls[n] = _AutoFunctionalized(n.args[0], lookup(n.args[0]))
                continue
            if isinstance(n.target, OpOverload) and n.target is not aten.copy_.default:
                lowering = graph_lookup(n.target)
                if lowering is None:
                    raise Unsupported(f"{n.target} has no pjrt lowering")
                self.calls[n] = _Call(n.target, lowering, lookup(n.target) is not None)
                self.random_nodes += lowering.random
        self.mutated_positions = tuple(sorted(self.mutated))
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
            "graph", self.name, self._build, _describe, kind=kind, placed=_placed
        )
        self.padded_program = executor.Program(
            "graph", self.name, self._build_padded, _describe_padded, kind=kind
        )
        self._static_outputs: dict = {}
        self.declined = None  # a lowering declined this graph's arguments: it runs eagerly
        self.dumper = None  # set by the backend: has .active and .write(program, lowered)
        # padding symbolic sizes to buckets, if any (not for SPMD graphs)
        self.plan = buckets.plan(self) if self.group_name is None else None
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
            before = asserts.label((target, _source_line(n)))  # (what a check names)
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

    def _evaluate_padded(self, values, lengths, rng, record, input_factors):
        """Like _evaluate, on values padded to buckets, tracking padding (buckets.py)."""
        env: dict = dict(zip(self.inputs, values))
        trace = padding_rules.PaddedTrace(self, lengths)
        for i, dims in self.plan.tensor_dims.items():
            factors = list(buckets._untagged(values[i].shape))
            for d, name in dims:
                factors[d] = ((values[i].shape[d], name),)
            trace.fac[self.inputs[i]] = tuple(factors)
        for i, factors in input_factors:  # saved activations that arrive padded
            trace.fac[self.inputs[i]] = factors
        next_key = self._keys(rng)

        def raw(a):
            return env[a] if isinstance(a, torch.fx.Node) else a

        def load(a):
            v = env[a] if isinstance(a, torch.fx.Node) else a
            return v.padded if isinstance(v, buckets.Sym) else v

        for n in self.body:
            if n.op == "get_attr":
                env[n] = self._constant(n)
                continue
            raw_args = torch.fx.node.map_aggregate(n.args, raw)
            call = self.calls.get(n)
            if n.target is operator.getitem:  # an output of a multi-output op
                src, i = n.args
                env[n] = env[src][i]
                facs = trace.fac.get(src)
                if facs is not None and facs[i] is not None:
                    trace.fac[n] = facs[i]
                continue
            if call is None:  # size arithmetic
                flat = list(padding_rules._flat(raw_args))
                if any(isinstance(a, buckets.Sym) for a in flat):
                    env[n] = padding_rules.sym_op(n.target, raw_args)
                else:
                    env[n] = n.target(*raw_args, **torch.fx.node.map_aggregate(n.kwargs, raw))
                continue
            args = torch.fx.node.map_aggregate(n.args, load)
            kwargs = torch.fx.node.map_aggregate(n.kwargs, load)
            if n.target is aten.sym_size.int:
                f = trace.f(n.args[0], args[0])
                d = padding_rules._wrap(args[1], len(f))
                env[n] = buckets.Sym(args[0].shape[d], buckets._true_count(f, [d], lengths), f[d])
                continue
            key = next_key() if call.random else None
            env[n], trace.fac[n] = trace.run_node(n, call, args, kwargs, raw_args, key)
        outs = []
        for i, o in enumerate(self.outputs):
            v = env[o] if isinstance(o, torch.fx.Node) else o
            if isinstance(v, jax.Array):
                record[i] = trace.f(o, v)
                outs.append(v)
            elif isinstance(v, buckets.Sym):
                if v.factors is None:
                    raise buckets.NotBucketable("a computed size is an output")
                record[i] = ("size", v.factors)
                outs.append(None)
            elif v is not None:
                raise buckets.NotBucketable("a value is an output")
            else:
                record[i] = None
                outs.append(None)
        return outs

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

    def arguments(self, args):
        """(donated arrays, other arrays, statics, device index, kinds, cells) of a call;
        cells maps a donated argument's position to its storage cell."""
        index = _device_of(args)
        values, candidates = [], {}
        mutated = self.mutated
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                values.append(_static(a))
                continue
            if a.is_cpu:
                metrics.count("transfers_to_device")
                values.append(runtime.from_host(a.detach(), runtime.device(index)))
                continue
            if a.get_device() != index:  # (not CPU: a pjrt tensor, as Dynamo traced it)
                raise RuntimeError(
                    "Expected all tensors to be on the same device, but found at "
                    f"least two devices, pjrt:{index} and {a.device}!"
                )
            value = whole(a)
            if value is None:
                value = argument(a)
                padded = getattr(a, "_pjrt_padded", None)
                if padded is not None and tuple(a.shape) != padded.true_shape:
                    value = buckets.compact(padded)  # stayed padded: drop the padding
            elif i in mutated and self.group_name is None:
                cell = cell_of(a)
                if cell.owned and cell.dtype == a.dtype:  # (the storage's own array)
                    candidates[i] = cell
            values.append(value)
        if candidates:  # an array passed twice (two views of one storage) stays
            passed = collections.Counter(id(v) for v in values if isinstance(v, jax.Array))
            candidates = {i: c for i, c in candidates.items() if passed[id(values[i])] == 1}
        donated, arrays, statics, kinds = [], [], [], []
        for i, (a, value) in enumerate(zip(args, values)):
            if not isinstance(a, torch.Tensor):
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
                return self._call_padded(args)
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
        values = None
        for i, a in enumerate(outs):
            if a is None:
                results.append(record[i])
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
        index = _device_of(args)
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
        for a in args:
            if not isinstance(a, torch.Tensor):
                statics.append(_static(a))
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

    def _call_padded(self, args):
        """Run on inputs padded to buckets; outputs are views with the true sizes."""
        plan = self.plan
        true = {name: int(args[i]) for i, name in plan.symbols.items()}
        padded = {name: buckets.bucket(v) for name, v in true.items()}
        derived_true = [int(args[i]) for i in sorted(plan.derived)]
        args = list(args)
        for i, name in plan.symbols.items():
            args[i] = padded[name]
        for i in plan.derived:
            args[i] = plan.padded_value(i, padded)
        _, arrays, statics, index, kinds, _ = self.arguments(args)
        positions = [i for i, k in enumerate(kinds) if k == "a"]
        input_factors = []
        for j, i in enumerate(positions):
            arrived = buckets.padded_of(args[i])
            if arrived is not None:  # a saved activation, still padded
                if arrived.true != true:
                    raise buckets.NotBucketable("an input padded for other sizes")
                arrays[j] = arrived.array
                input_factors.append((i, arrived.factors))
            elif i in plan.merged:
                raise buckets.NotBucketable("an input with a merged dynamic size")
            elif i in plan.tensor_dims:
                arrays[j] = buckets.pad_input(arrays[j], plan.tensor_dims[i], padded)
        input_factors = tuple(input_factors)
        avals = tuple([a.aval for a in arrays])
        precision = torch.get_float32_matmul_precision()
        key = ("padded", statics, kinds, avals, input_factors, precision)
        program = self.padded_program
        rng = pjrt_random.next_key_parts(index) if self.random_nodes else (0, 0)
        lengths = jnp.asarray([true[name] for name in plan.names] + derived_true, jnp.int32)
        metrics.count("graph_executions")
        if key not in program.cache and self.dumper is not None and self.dumper.active:
            self.dumper.write(self, program.lower(key, arrays, lengths, rng))
        outs = program(key, arrays, lengths, rng)
        record = self._static_outputs[key]
        results = []
        n_user = len(outs) if self.n_user_outputs is None else self.n_user_outputs
        for i, a in enumerate(outs):
            info = record[i]
            if a is None:
                results.append(
                    None if info is None else math.prod(buckets.true_shape((info[1],), true))
                )
            elif i < n_user:
                results.append(buckets.true_view(a, info, true, index))
            else:  # saved for the backward: stays padded (a view of it if that can be)
                results.append(buckets.saved(a, info, true, index))
        return results

    def _build_padded(self, key):
        statics, kinds, input_factors = key[1], key[2], key[4]
        plan = self.plan
        record: dict = {}
        names = plan.names

        derived = {i: len(names) + k for k, i in enumerate(sorted(plan.derived))}

        def run(arrays, lengths_vec, rng):
            metrics.count("compile_traces")
            lengths = {name: lengths_vec[k] for k, name in enumerate(names)}
            values, it_arrays, it_statics = [], iter(arrays), iter(statics)
            for i, kind in enumerate(kinds):
                if kind == "a":
                    values.append(next(it_arrays))
                    continue
                value = next(it_statics)
                name = plan.symbols.get(i)
                if name is not None:
                    value = buckets.Sym(value, lengths[name], ((value, name),))
                elif i in derived:
                    value = buckets.Sym(value, lengths_vec[derived[i]], None)
                values.append(value)
            return self._evaluate_padded(values, lengths, rng, record, input_factors)

        run.__name__ = run.__qualname__ = self.name
        self._static_outputs[key] = record
        return run, False


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


def _describe_padded(key, traced) -> list:
    """What a padded graph program was compiled for: the bucket sizes show in its
    inputs' shapes."""
    _, statics, kinds, avals, input_factors, precision = key
    return [
        ("float32 matmul precision", precision),
        ("argument kinds", kinds),
        ("static arguments", statics),
        ("padding of saved activations", input_factors),
        *((f"input {i}", a) for i, a in enumerate(avals)),
    ]


def _device_of(args) -> int:
    """The device a call runs on: its first device tensor's, else the current one."""
    for a in args:
        if isinstance(a, torch.Tensor) and not a.is_cpu:
            return a.get_device()
    return pjrt_random.current_device()


def _static(a):
    if isinstance(a, torch.SymInt):
        return int(a)
    if isinstance(a, list):
        return tuple(_static(x) for x in a)
    return a
