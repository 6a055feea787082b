"""The nodes of an FX graph of ATen ops as a traced program sees them: which nodes can
run inside one (:func:`node_supported`), and how each node's lowering is called on JAX
values (:class:`Call`; :class:`AutoFunctionalized` for a custom op that mutates its
arguments, as AOT autograd writes it).
"""

from __future__ import annotations

import math
import operator
import os
import re

import jax
import jax.numpy as jnp
import torch
import torch.fx
from torch._ops import OpOverload

from torch_pjrt.ops.registry import (
    HostCheck,
    Lowering,
    Signature,
    graph_dtype_refusal,
    graph_lookup,
    lookup,
    refusal,
)

aten = torch.ops.aten

__all__ = [
    "AUTO_FUNCTIONALIZED",
    "AutoFunctionalized",
    "Call",
    "Unsupported",
    "node_supported",
    "source_line",
    "source_of",
]


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
    torch.sym_sum,
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
    if target is AUTO_FUNCTIONALIZED:
        return AutoFunctionalized.supports(node)
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


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def source_line(node: torch.fx.Node) -> str | None:
    """The user's line a node of a Dynamo or export graph comes from ('file:line'), if
    known: the innermost frame outside PyTorch itself (a ``torch.nn`` layer's ``forward``
    is not the line to change), else the innermost."""
    return source_of(node.meta.get("stack_trace"))


def source_of(stack_trace: str | None) -> str | None:
    """:func:`source_line` for a stack trace's text."""
    found = re.findall(r'File "([^"]+)", line (\d+)', stack_trace or "")
    outside = [f for f in found if not f[0].startswith(_TORCH_DIR)]
    file, line = (outside or found or [(None, None)])[-1]
    return f"{file}:{line}" if file else None


def _scalar(v):
    """A Scalar argument as eager kernels see it: a weakly typed JAX scalar."""
    if isinstance(v, (bool, int, float, complex)):
        return jnp.asarray(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_scalar(x) for x in v)
    return v


class Call:
    """How one node's lowering is called: argument names and kinds from the schema."""

    __slots__ = ("fn", "sig", "scalars", "random", "n_outputs", "host_check")

    def __init__(self, op: OpOverload, lowering: Lowering, in_table: bool):
        self.fn = lowering.fn
        self.sig = Signature(op, lowering.static)
        # the eager kernels' checks of Scalar values, on the graph's constants
        self.host_check = HostCheck.of(lowering, self.sig)
        # eager kernels pass Scalar arguments as weak JAX scalars; graph-only lowerings
        # (allocation, arange) need them as Python numbers
        self.scalars = self.sig.scalars if in_table else []
        self.random = lowering.random

    def __call__(self, args, kwargs, key):
        vals = self.sig.values(args, kwargs)
        if self.host_check is not None:
            self.host_check(vals)
        # (dtypes the CPU kernel has no instance for, which eager calls check too)
        error = None if self.random else graph_dtype_refusal(self.sig, vals)
        if error is not None:
            raise refusal(error)
        for i in self.scalars:
            vals[i] = _scalar(vals[i])
        call = dict(zip(self.sig.names, vals))
        if self.random:
            call["key"] = key
        return self.fn(**call)


AUTO_FUNCTIONALIZED = getattr(torch.ops.higher_order, "auto_functionalized_v2", None)


class AutoFunctionalized:
    """``auto_functionalized_v2(op, **kwargs)``: how AOT autograd writes a call of a custom
    op that mutates its arguments (a ``torch_pjrt.kernel`` with ``mutates_args``). Each
    mutated argument is a base of ``_all_bases`` or a slice of one; the lowering's new
    values are written back into the bases functionally, and the node's value is (the
    op's results, the new bases), as PyTorch's dense implementation returns."""

    __slots__ = ("call", "writes", "n_results", "random")

    def __init__(self, op: OpOverload, lowering: Lowering):
        self.call = Call(op, lowering, True)
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


class _Free:
    """What a free value (:func:`free_values`) is while the program traces."""

    def __repr__(self) -> str:
        return "<free>"


FREE = _Free()


def free_values(inputs, body, calls) -> tuple[frozenset, dict, list]:
    """(positions of inputs, nodes, host nodes) of a graph's free values: non-tensor
    inputs (ints, symbolic ints Dynamo passes, such as a static cache's Python offset)
    and the Python arithmetic on them, that no lowering reads and no tensor depends on,
    so that they only end in outputs (the offset + 1 the cache keeps). They are no part
    of the program (a new value would otherwise build a new one: one program per token),
    and their outputs are computed at each call, from the host nodes: every Python
    arithmetic node on non-tensor values, in graph order (a free one may read one the
    program reads too). The free nodes map to None, in graph order."""

    def tensor(n) -> bool:
        val = n.meta.get("val", n.meta.get("example_value"))
        return isinstance(val, (torch.Tensor, list, tuple))

    host: list = [n for n in inputs if not tensor(n)]
    hosted = set(host)
    for n in body:
        if n.op != "call_function" or n in calls or n.target is torch.ops.aten.copy_.default:
            continue
        if tensor(n) or not n.all_input_nodes:
            continue
        if all(a in hosted for a in n.all_input_nodes):
            host.append(n)
            hosted.add(n)
    needed: set = set()
    for n in reversed(host):  # (users come first)
        for u in n.users:
            if u in needed or (u not in hosted and u.op != "output"):
                needed.add(n)
                break
    position = {n: i for i, n in enumerate(inputs)}
    free = frozenset(position[n] for n in host if n not in needed and n in position)
    nodes = {n: None for n in host if n not in needed and n not in position}
    return free, nodes, [n for n in host if n not in position]
