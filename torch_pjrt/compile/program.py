"""One FX graph of ATen ops -> one jitted JAX function, through the lowering registry.

A :class:`GraphProgram` walks the graph's nodes inside a ``jax.jit`` trace, calling
each node's lowering (``registry.graph_lookup``) on JAX values, so the whole graph
becomes a single XLA program. At call time it reads its tensor arguments' arrays,
runs the program, writes the new values of mutated inputs back into their storages
(donating the old buffers where nothing else can see them) and wraps the outputs.
"""

from __future__ import annotations

import itertools
import math
import operator
import sys
import time

import jax
import jax.numpy as jnp
import torch
import torch.fx
from torch._ops import OpOverload

from torch_pjrt import random as pjrt_random
from torch_pjrt import runtime
from torch_pjrt.diagnostics import metrics
from torch_pjrt.ops.registry import Lowering, Signature, graph_lookup, lookup
from torch_pjrt.tensor import cell_of, read, wrap, write

aten = torch.ops.aten

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


def _tensor_kind(v) -> str:
    if isinstance(v, torch.Tensor):
        return "pjrt" if v.device.type == "pjrt" else "host"
    return "static"


class GraphProgram:
    """A callable running one FX graph as one XLA program on a pjrt device.

    Args:
        gm: a graph of ATen ops (every call_function node :func:`node_supported`).
        kind: "forward", "backward", "inference" or "part" (for dumps and metrics).
    """

    def __init__(self, gm: torch.fx.GraphModule, kind: str = "inference"):
        self.gm = gm
        self.kind = kind
        self.id = next(_ids)
        self.name = f"graph_{self.id:03d}_{kind}"
        nodes = list(gm.graph.nodes)
        self.inputs = [n for n in nodes if n.op == "placeholder"]
        self.body = [n for n in nodes if n.op in ("call_function", "get_attr")]
        output = next(n for n in nodes if n.op == "output")
        self.outputs = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [
            output.args[0]
        ]
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
            if isinstance(n.target, OpOverload) and n.target is not aten.copy_.default:
                lowering = graph_lookup(n.target)
                if lowering is None:
                    raise Unsupported(f"{n.target} has no pjrt lowering")
                self.calls[n] = _Call(n.target, lowering, lookup(n.target) is not None)
                self.random_nodes += lowering.random
        self.mutated_positions = tuple(sorted(self.mutated))
        self.constants = {
            n: getattr(gm, n.target) for n in self.body if n.op == "get_attr"
        }
        self._jitted: dict = {}
        self._static_outputs: dict = {}
        self._last_key = None
        self.dumper = None  # set by the backend: has .active and .write(program, lowered)

    # --- tracing ------------------------------------------------------------------

    def _evaluate(self, values: list, rng, record: dict):
        env: dict = dict(zip(self.inputs, values))
        base_key = None
        if self.random_nodes:
            base_key = jax.random.fold_in(jax.random.key(rng[0]), rng[1])
        draws = itertools.count()

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
            key = jax.random.fold_in(base_key, next(draws)) if call.random else None
            env[n] = call(args, kwargs, key)
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

    def _program(self, key):
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
        jitted = jax.jit(run, donate_argnums=(0,) if "d" in kinds else ())
        self._static_outputs[key] = record
        self._jitted[key] = jitted
        return jitted

    # --- calling --------------------------------------------------------------------

    def arguments(self, args):
        """(donated arrays, other arrays, statics, device index, kinds, cells) of a call;
        cells maps a donated argument's position to its storage cell."""
        index = None
        for a in args:
            if isinstance(a, torch.Tensor) and a.device.type == "pjrt":
                index = a.device.index or 0
                break
        if index is None:
            index = pjrt_random.current_device()
        donated, arrays, statics, kinds, cells = [], [], [], [], {}
        mutated = self.mutated
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                device = a.device
                if device.type == "pjrt":
                    if (device.index or 0) != index:
                        raise RuntimeError(
                            "Expected all tensors to be on the same device, but found at "
                            f"least two devices, pjrt:{index} and {device}!"
                        )
                    value = read(a)
                    if i in mutated:
                        cell = _donatable(a, value)
                        if cell is not None:
                            donated.append(value)
                            kinds.append("d")
                            cells[i] = cell
                            continue
                else:
                    metrics.count("transfers_to_device")
                    value = runtime.from_host(a.detach(), runtime.device(index))
                arrays.append(value)
                kinds.append("a")
            else:
                statics.append(_static(a))
                kinds.append("s")
        return donated, arrays, tuple(statics), index, tuple(kinds), cells

    def __call__(self, *args):
        donated, arrays, statics, index, kinds, cells = self.arguments(args)
        # NOTE: shapes and dtypes are part of the key (JAX would retrace silently):
        # every XLA compilation is counted here, with what changed
        key = (
            statics,
            kinds,
            tuple([a.aval for a in donated]),
            tuple([a.aval for a in arrays]),
        )
        jitted = self._jitted.get(key)
        first = jitted is None
        if first:
            cause = _cause(self._last_key, key)
            jitted = self._program(key)
            start = time.perf_counter()
        self._last_key = key
        rng = pjrt_random.next_key_parts(index) if self.random_nodes else (0, 0)
        metrics.count("graph_executions")
        if donated:
            metrics.count("graph_donated_buffers", len(donated))
        with jax.enable_x64(True):
            if first and self.dumper is not None and self.dumper.active:
                self.dumper.write(self, jitted.lower(donated, arrays, rng))
            outs, new_values = jitted(donated, arrays, rng)
            if not donated and not arrays and index != 0:  # a graph that only creates
                outs = jax.device_put(outs, runtime.device(index))
        if first:
            metrics.compilation(
                "graph", self.kind, time.perf_counter() - start, f"{self.name}: {cause}"
            )
        for p, value in zip(self.mutated_positions, new_values):
            cell = cells.get(p)
            if cell is not None:  # the whole storage, already checked: swap the buffer
                cell.array = value
            else:
                write(args[p], value)
        record = self._static_outputs[key]
        return [record[i] if a is None else wrap(a, index) for i, a in enumerate(outs)]


def _cause(old, new) -> str:
    """Why a program is compiled again: what differs between two call keys."""
    if old is None:
        return "first call"
    if old[1] != new[1]:
        return "argument kinds changed (a tensor became a value, or donation changed)"
    if old[0] != new[0]:
        return f"static arguments changed: {old[0]} -> {new[0]}"
    for which, o, n in (("donated input", old[2], new[2]), ("input", old[3], new[3])):
        for i, (a, b) in enumerate(zip(o, n)):
            if a != b:
                return f"{which} {i} changed from {a.str_short()} to {b.str_short()}"
    return "new argument signature"


def _static(a):
    if isinstance(a, torch.SymInt):
        return int(a)
    if isinstance(a, list):
        return tuple(_static(x) for x in a)
    return a


# the references a buffer has when only its storage cell (and this call) hold it:
# the cell's slot, the local name in the caller, getrefcount's argument
_ALONE = 3


def _donatable(t: torch.Tensor, value: jax.Array):
    """The storage cell of an input whose buffer may be donated (the tensor is its whole
    storage, and no other live object holds the array), else None."""
    cell = cell_of(t)
    if cell.array is value and sys.getrefcount(value) <= _ALONE + 1 and cell.dtype == t.dtype:
        return cell
    return None
