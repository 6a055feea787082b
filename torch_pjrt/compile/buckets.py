"""Dynamic sizes served by padding to buckets: one XLA program per bucket, exact results.

A graph traced with symbolic sizes (``dynamic=True``, ``mark_dynamic``) would need one
XLA program per concrete size. Instead each symbolic size is padded up to its bucket
(the next power of two by default, ``TORCH_PJRT_BUCKETS``) and the program runs on the
padded shapes, with the true sizes as run-time values. To keep the results exact, the
trace tracks which elements are padding: every dimension of every value is a list of
factors ``(size, symbol or None)`` (a dimension merged from (batch, sequence) has two),
and a padded element is one whose index along a tagged factor is past the symbol's true
size. Ops that could mix padding into valid elements get it masked out first:
reductions and softmax over a padded dimension see the reduction's identity there,
matrix products zero both operands, means divide by the true count. An op with no rule
for padded inputs makes the graph "not bucketable" and it falls back to one program per
size (counted in ``graph_bucket_fallbacks`` with the op). Outputs are views of the
padded result with the true sizes (no copy); activations a training forward saves for
its backward stay padded (``Padded``) and the backward takes them as they are.

This module holds the bucket sizes, the factors bookkeeping, the plan (which inputs are
padded) and padded values in and out of a program; the tracer and the per-op rules are
in ``padding_rules.py``.
"""

from __future__ import annotations

import math
import operator

import jax
import jax.numpy as jnp
import torch

from torch_pjrt.config import settings
from torch_pjrt.device.tensor import _contiguous_strides, new_tensor, storage_cell, wrap

__all__ = ["NotBucketable", "bucket", "plan"]


class NotBucketable(Exception):
    """The graph has an op whose result padding could change: use exact sizes."""


def bucket(size: int) -> int:
    """The padded size for a true size (``TORCH_PJRT_BUCKETS``: ``pow2`` or a list)."""
    spec = settings.buckets
    if spec == "pow2":
        return 1 << max(size - 1, 0).bit_length()
    for b in spec:
        if b >= size:
            return b
    return size  # larger than every bucket: exact


# --- padding bookkeeping ------------------------------------------------------------------


class Sym:
    """A symbolic size inside a padded trace: its padded (static) value, its true
    (traced) value, and, for a plain symbol or a product of them, its factors."""

    __slots__ = ("padded", "true", "factors")

    def __init__(self, padded: int, true, factors):
        self.padded = padded
        self.true = true
        self.factors = factors


def _untagged(shape) -> tuple:
    return tuple(((s, None),) for s in shape)


def _tagged(dim) -> bool:
    return any(t is not None for _, t in dim)


def _any_tagged(factors) -> bool:
    return factors is not None and any(_tagged(d) for d in factors)


def _regroup(factors, shape) -> tuple:
    """Factors of a reshape to ``shape``: regroup the row-major atoms; a padded atom may
    not be split or spread over two output dimensions."""
    atoms = [a for d in factors for a in d if a[0] != 1]
    out, i = [], 0
    for size in shape:
        group, acc = [], 1
        while acc < size:
            if i >= len(atoms):
                raise NotBucketable("reshape")
            n, t = atoms[i]
            if acc * n <= size and size % (acc * n) == 0:
                group.append((n, t))
                acc *= n
                i += 1
            elif t is None and (size // acc) > 0 and n % (size // acc) == 0:
                rest = size // acc
                group.append((rest, None))
                atoms[i] = (n // rest, None)
                acc *= rest
            else:
                raise NotBucketable("a reshape that splits a padded dimension")
        out.append(tuple(group) if group else ((1, None),))
    if any(n != 1 for n, _ in atoms[i:]):
        raise NotBucketable("reshape")
    return tuple(out)


def _dim_mask(dim, lengths):
    mask = None
    for n, t in dim:
        part = jnp.ones((n,), bool) if t is None else jnp.arange(n) < lengths[t]
        mask = part if mask is None else (mask[:, None] & part[None, :]).reshape(-1)
    return mask


def mask(factors, lengths):
    """The validity mask of a value (broadcastable to it), or None if nothing is padding."""
    full = None
    ndim = len(factors)
    for d, dim in enumerate(factors):
        if not _tagged(dim):
            continue
        m = _dim_mask(dim, lengths).reshape((1,) * d + (-1,) + (1,) * (ndim - d - 1))
        full = m if full is None else full & m
    return full


def _fill(x, factors, lengths, value):
    m = mask(factors, lengths)
    return x if m is None else jnp.where(m, x, jnp.asarray(value, x.dtype))


def _true_count(factors, dims, lengths):
    count = 1
    for d in dims:
        for n, t in factors[d]:
            count = count * (n if t is None else lengths[t])
    return count


# --- the plan: which inputs are padded ----------------------------------------------------


class Plan:
    """Where a graph's symbolic sizes are: SymInt inputs, and tensor dims that are one."""

    def __init__(self, symbols: dict, tensor_dims: dict):
        self.symbols = symbols  # input position -> symbol name
        self.tensor_dims = tensor_dims  # input position -> [(dim, symbol name)]
        self.names = sorted(set(symbols.values()))
        self.active = True
        self.merged: set = set()  # inputs with a merged dynamic dim (must arrive padded)
        self.derived: dict = {}  # input position -> sympy expression of other symbols
        self.values: dict = {}  # input position -> a symbol only used as a value

    def padded_value(self, position: int, padded: dict) -> int:
        expr = self.derived[position]
        return int(expr.subs({sym: padded[str(sym)] for sym in expr.free_symbols}))


def plan(program) -> Plan | None:
    """The padding plan of a graph, or None when it has no symbolic sizes to pad.

    A training forward hands the activations it saves for the backward over padded as
    they are (``Padded``); the backward takes them so, and pads its other inputs.
    """
    if settings.buckets is None or program.mutated or program.alias_outputs:
        return None
    # the symbols to pad: those that are sizes of tensor inputs (a symbolic int that is
    # only a value, a fill value say, stays exact)
    dims_of = set()
    for node in program.inputs:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            for size in val.shape:
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                    dims_of.add(str(size.node.expr))
    symbols, tensor_dims, derived = {}, {}, {}
    for i, node in enumerate(program.inputs):
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt):
            expr = val.node.expr
            if expr.is_Symbol and str(expr) in dims_of:
                symbols[i] = str(expr)
            elif not expr.is_Symbol:
                derived[i] = expr  # a size computed from symbols (2*s0): kept as it is
    if not symbols:
        return None
    known = set(symbols.values())
    if any(str(sym) not in known for e in derived.values() for sym in e.free_symbols):
        return None
    merged = set()
    for i, node in enumerate(program.inputs):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        dims = []
        for d, s in enumerate(val.shape):
            if isinstance(s, torch.SymInt):
                expr = s.node.expr
                if any(str(sym) not in known for sym in expr.free_symbols):
                    return None
                if expr.is_Symbol:
                    dims.append((d, str(expr)))
                else:
                    merged.add(i)  # only usable when it arrives padded (a saved activation)
        if dims:
            tensor_dims[i] = dims
    result = Plan(symbols, tensor_dims)
    result.merged = merged
    result.derived = derived
    result.values = {  # symbols that are only values: run-time values, not static
        i: str(node.meta["val"].node.expr)
        for i, node in enumerate(program.inputs)
        if i not in symbols
        and isinstance(node.meta.get("val"), torch.SymInt)
        and node.meta["val"].node.expr.is_Symbol
        and _only_a_value(node)
    }
    return result


# size arithmetic a symbol only used as a value may go through (padding_rules.sym_op)
_VALUE_ARITHMETIC = {
    operator.add, operator.sub, operator.mul, operator.floordiv,
    torch.sym_sum, torch.sym_max, torch.sym_min,
}  # fmt: skip


def _only_a_value(node) -> bool:
    """Whether a symbolic int is used only as a value: a tensor operand of ops (a
    position offset: ``torch.arange(n) + past``), an output, or through size arithmetic
    used so (never as a size, a shape or a bound: those need it static). Such a symbol
    is passed to the program as a run-time value: a new value builds no new program
    (a sliding-window cache's position, which grows by one each token)."""
    for user in node.users:
        if user.op == "output":
            continue
        if user.op != "call_function":
            return False
        if user.target in _VALUE_ARITHMETIC:
            if not _only_a_value(user):
                return False
            continue
        if not isinstance(user.target, torch._ops.OpOverload):
            return False
        schema = user.target._schema.arguments
        given = list(zip(schema, user.args))
        given += [(a, user.kwargs[a.name]) for a in schema if a.name in user.kwargs]
        for a, value in given:
            if value is node and str(a.type) != "Tensor":
                return False
            if isinstance(value, (list, tuple)) and any(v is node for v in value):
                return False
    return True


class Padded:
    """Attached to a tensor made by a padded program (``tensor._pjrt_padded``): its
    storage holds the padded array; ``factors`` say where the padding is; ``true`` are
    the symbol values it was made with; ``true_shape`` is the tensor's true shape."""

    __slots__ = ("array", "factors", "true", "true_shape")

    def __init__(self, array, factors, true, true_shape):
        self.array = array
        self.factors = factors
        self.true = true
        self.true_shape = true_shape


def true_shape(factors, true: dict) -> tuple:
    shape = []
    for dim in factors:
        size = 1
        for n, t in dim:
            size *= true[t] if t is not None else n
        shape.append(size)
    return tuple(shape)


def compact(padded: Padded) -> jax.Array:
    """The true-sized array of a padded value (drop the padding, whatever its layout)."""
    a = padded.array
    atoms = [(n, t) for dim in padded.factors for n, t in dim]
    a = a.reshape(tuple(n for n, _ in atoms))
    index = tuple(slice(0, padded.true[t]) if t is not None else slice(None) for _, t in atoms)
    with jax.enable_x64(True):
        return a[index].reshape(padded.true_shape)


def padded_of(t: torch.Tensor):
    """The Padded record of a tensor made by a padded program, if still current."""
    from torch_pjrt.device.tensor import cell_of

    padded = getattr(t, "_pjrt_padded", None)
    if padded is None or cell_of(t).array is not padded.array:
        return None  # none, or written since (its storage holds another array)
    return padded


def pad_input(array: jax.Array, dims, padded_sizes: dict) -> jax.Array:
    """``array`` padded (or cut) along ``dims`` ((dim, symbol) pairs) to the symbols'
    padded sizes: a true-size input padded, or a padded array its view was taken of
    (:func:`prefix_array`) brought to this call's buckets (what it cuts is padding)."""
    if all(array.shape[d] == padded_sizes[name] for d, name in dims):
        return array
    along = dict(dims)
    with jax.enable_x64(True):
        array = array[
            tuple(
                [
                    slice(0, min(n, padded_sizes[along[d]])) if d in along else slice(None)
                    for d, n in enumerate(array.shape)
                ]
            )
        ]
        widths = [(0, 0)] * array.ndim
        for d, name in dims:
            widths[d] = (0, padded_sizes[name] - array.shape[d])
        return jnp.pad(array, widths) if any(w for _, w in widths) else array


def prefix_array(t: torch.Tensor, dims) -> jax.Array | None:
    """The array of t's storage when t is a prefix of it along ``dims`` and all of it
    along the others (a padded program's output, seen with its true sizes: a dynamic
    KV cache handed back to the next step), else None: the program takes that array
    and cuts or pads it itself (no gather of the view, compiled for each length)."""
    if t.is_cpu or t.storage_offset() or t.is_conj() or t.is_neg():
        return None
    if getattr(t, "_pjrt_padded", None) is not None:
        return None
    cell = storage_cell(t.untyped_storage())
    if cell is None or cell.dtype != t.dtype:
        return None
    a = cell.array
    if a is None or a.ndim != t.ndim or tuple(t.shape) == a.shape:
        return None
    along = {d for d, _ in dims}
    for d, (n, m) in enumerate(zip(t.shape, a.shape)):
        if n > m or (n != m and d not in along):
            return None
    strides = _contiguous_strides(a.shape)
    if any(st != want for st, want, n in zip(t.stride(), strides, t.shape) if n > 1):
        return None
    return a


def saved(array: jax.Array, factors, true: dict, index: int) -> torch.Tensor:
    """A saved activation: a true-size view where padding is a prefix, else the padded
    array itself; either way it remembers the padded array for the backward."""
    try:
        t = true_view(array, factors, true, index)
    except NotBucketable:
        t = wrap(array, index)
    t._pjrt_padded = Padded(array, factors, dict(true), true_shape(factors, true))
    return t


def true_view(array: jax.Array, factors, true: dict, index: int) -> torch.Tensor:
    """A tensor with the true sizes viewing a padded result (valid elements form a
    prefix of every dimension: only a dimension's outermost factor may be padded)."""
    from torch_pjrt.runtime.transfer import torch_dtype

    if not any(t is not None for dim in factors for _, t in dim):
        return wrap(array, index)
    shape = []
    for dim in factors:
        if any(t is not None for _, t in dim[1:]):
            raise NotBucketable("an output padded inside a merged dimension")
        (n, t), inner = dim[0], math.prod(m for m, _ in dim[1:])
        shape.append((true[t] if t is not None else n) * inner)
    strides = _contiguous_strides(array.shape)
    return new_tensor(shape, torch_dtype(array.dtype), index, array, strides, size=array.size)
