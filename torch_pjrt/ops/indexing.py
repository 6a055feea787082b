"""Indexing lowerings: advanced indexing, gathers and scatters, masks, searches.

Boolean masks in ``index``/``index_put`` and the data-dependent ops (``nonzero``,
``masked_select``, ``unique``) need the number of selected elements to fix the result
shape, so they are raw kernels that read that count on the host (a counted host sync)
and then run a static-shape lowering.

Every index is checked on the device as CPU PyTorch checks it, with its exception type
and message (:func:`_check_index`, ``runtime.asserts``): XLA would clamp it, or drop the
write, silently.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_pjrt.device.tensor import wrap
from torch_pjrt.ops._helpers import check, dtype_name, host_int, run_jitted, wrap_dim
from torch_pjrt.ops.registry import Kernel, Lowering, implements, lowers
from torch_pjrt.ops.registry import lowers_in_graphs as in_graphs
from torch_pjrt.ops.variants import _check_overlap, resize_output
from torch_pjrt.runtime import asserts
from torch_pjrt.runtime.transfer import torch_dtype

aten = torch.ops.aten


def _wrap_all(arrays, like: torch.Tensor):
    return tuple(wrap(a, like.device.index or 0) for a in arrays)


def _count_nonzero(t: torch.Tensor) -> int:
    return host_int(run_jitted(jnp.count_nonzero, t))


# --- nonzero and masks ---------------------------------------------------------------


@lowers(aten.nonzero_static.default)
def nonzero_static(self, size, fill_value=-1):
    if self.size == 0:
        return jnp.full((size, self.ndim), fill_value, jnp.int64)
    if self.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    where = jnp.nonzero(self, size=size, fill_value=fill_value)
    return jnp.stack(where, axis=1).astype(jnp.int64)


@implements(aten.nonzero.default)
def nonzero(self):
    return aten.nonzero_static.default(self, size=_count_nonzero(self))


@implements(aten.nonzero.out)
def nonzero_out(self, *, out):
    if out.dtype != torch.int64:  # (ATen's words, its missing space included)
        raise RuntimeError(
            f"nonzero: Expected out tensor to have scalar type Long but got scalar type"
            f"{dtype_name(out.dtype)}"
        )
    result = nonzero(self)
    resize_output(out, result.shape)
    return out.copy_(result)


def _is_mask(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)


def _on_device(t, device):
    if isinstance(t, torch.Tensor) and t.device != device:
        return t.to(device)
    return t


def _expand_masks(self: torch.Tensor, indices) -> list:
    """PyTorch's rule: a k-dim boolean mask is k long index tensors (its nonzero)."""
    out = []
    for t in indices:
        t = _on_device(t, self.device)
        if not _is_mask(t):
            out.append(t)
            continue
        dim = len(out)
        for j, size in enumerate(t.shape):
            if dim + j >= self.dim() or self.shape[dim + j] != size:
                raise IndexError(
                    f"The shape of the mask {list(t.shape)} at index {j} does not match the "
                    f"shape of the indexed tensor {list(self.shape)} at index {dim + j}"
                )
        where = nonzero(t)
        out.extend(where.select(1, j) for j in range(t.dim()))
    return out


def _add_at(self, where, values):
    """``self.at[where].add(values)``; for bool, PyTorch's add is a logical or."""
    if self.dtype != jnp.bool_:
        return self.at[where].add(values)
    return self.astype(jnp.int32).at[where].add(values.astype(jnp.int32)) != 0


def _check_index(index, size: int, message: str, error=IndexError, negative=True) -> None:
    """Check on the device that ``index`` is in ``[-size, size)`` (``negative``) or
    ``[0, size)``; else ``error(message)`` at the next host sync, ``{}`` in ``message``
    being the first bad index."""
    ok = (index < size) & (index >= (-size if negative else 0))
    asserts.check(ok, error, message, asserts.first_bad(index, ok))


def _bounds(dim: int, size: int) -> str:
    return f"index {{}} is out of bounds for dimension {dim} with size {size}"


def _index_tuple(indices) -> tuple:
    return tuple(slice(None) if i is None else i for i in indices)


def _check_indices(self, indices) -> None:
    """Advanced indexing's check: each index tensor within its dimension (named, as
    ATen names it, by its place among the index tensors: ``x[:, i]``'s is "0")."""
    k = 0
    for d, i in enumerate(indices):
        if i is not None:
            if i.dtype not in (jnp.bool_, jnp.uint8):
                _check_index(i, self.shape[d], _bounds(k, self.shape[d]))
            k += 1


def _index_lowering(self, indices):
    _check_indices(self, indices)
    return self[_index_tuple(indices)]


def _index_put_lowering(self, indices, values, accumulate=False, checked=True):
    values = values.astype(self.dtype)
    masks = [
        i for i, t in enumerate(indices) if t is not None and t.dtype in (jnp.bool_, jnp.uint8)
    ]
    if masks:
        # the caller passes a mask only when values are constant along the masked dims
        before, mask = masks[0], indices[masks[0]].astype(bool)
        mask = mask.reshape((1,) * before + mask.shape + (1,) * (self.ndim - before - mask.ndim))
        return jnp.where(mask, self + values if accumulate else values, self)
    if checked:
        _check_indices(self, indices)
    where = _index_tuple(indices)
    return _add_at(self, where, values) if accumulate else self.at[where].set(values)


_INDEX = Kernel(aten.index.Tensor, Lowering(_index_lowering))
_INDEX_PUT = Kernel(aten.index_put.default, Lowering(_index_put_lowering))


@implements(aten.index.Tensor)
def index(self, indices):
    return _INDEX(self, _expand_masks(self, indices))


@implements(aten.index.Tensor_out)
def index_out(self, indices, *, out):
    result = index(self, indices)
    resize_output(out, result.shape)
    return out.copy_(result)


def _single_mask(self, indices, values) -> bool:
    """Whether ``self[indices] = values`` is a ``where`` on one mask (no nonzero needed)."""
    used = [i for i, t in enumerate(indices) if t is not None]
    if len(used) != 1 or not _is_mask(indices[used[0]]):
        return False
    before, mask = used[0], indices[used[0]]
    # values must be constant along the selected elements, and the mask must fit
    # (else _expand_masks raises PyTorch's error)
    return values.dim() <= self.dim() - before - mask.dim() and tuple(
        self.shape[before : before + mask.dim()]
    ) == tuple(mask.shape)


def _index_put(self, indices, values, accumulate=False):
    values = _on_device(values, self.device)
    if _single_mask(self, indices, values):
        return _INDEX_PUT(self, [_on_device(t, self.device) for t in indices], values, accumulate)
    return _INDEX_PUT(self, _expand_masks(self, indices), values, accumulate)


@implements(aten.index_put.default)
def index_put(self, indices, values, accumulate=False):
    return _index_put(self, indices, values, accumulate)


@implements(aten.index_put_.default)
def index_put_(self, indices, values, accumulate=False):
    return self.copy_(_index_put(self, indices, values, accumulate))


@implements(aten._index_put_impl_.default)
def _index_put_impl_(self, indices, values, accumulate=False, unsafe=False):
    return self.copy_(_index_put(self, indices, values, accumulate))


# --- in graphs: integer indices (boolean masks have data-dependent shapes) ----------------


@in_graphs(aten.index.Tensor)
def index_in_graphs(self, indices):
    return _index_lowering(self, indices)


@in_graphs(aten.index_put.default)
def index_put_in_graphs(self, indices, values, accumulate=False):
    return _index_put_lowering(self, indices, values, accumulate)


# the unsafe variants come from decompositions whose indices are in range by
# construction (upsampling, say): nothing to check
@in_graphs(aten._unsafe_index.Tensor)
def unsafe_index_in_graphs(self, indices):
    return self[_index_tuple(indices)]


@in_graphs(aten._unsafe_index_put.default)
def unsafe_index_put_in_graphs(self, indices, values, accumulate=False):
    return _index_put_lowering(self, indices, values, accumulate, checked=False)


@implements(aten.masked_select.default)
def masked_select(self, mask):
    shape = torch.broadcast_shapes(self.shape, mask.shape)
    return index(self.expand(shape).reshape(-1), [mask.expand(shape).reshape(-1)])


@implements(aten.masked_select.out)
def masked_select_out(self, mask, *, out):
    if out.dtype != self.dtype:
        raise RuntimeError("masked_select(): self and result must have the same scalar type")
    _check_overlap([out], (self, mask), {}, any_overlap=True)  # (ATen's assert_no_overlap)
    result = masked_select(self, mask)
    resize_output(out, result.shape)
    return out.copy_(result)


# c10's names of the types a Scalar converts to (``Scalar::to<T>``), as its overflow error
# prints them
_SCALAR_TYPES = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16",
    torch.int64: "int64_t",
    torch.int32: "int",
    torch.int16: "int16_t",
    torch.int8: "int8_t",
    torch.uint8: "uint8_t",
}


@lowers(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(self, mask, value):
    value = jnp.asarray(value)
    # NOTE: the CPU refuses a complex value with a nonzero imaginary part for a real tensor,
    # PyTorch's Meta kernel (run after the lowering) any complex value: refused here, in the
    # CPU's words
    name = _SCALAR_TYPES.get(torch_dtype(self.dtype))
    check(
        name is None or not jnp.iscomplexobj(value),
        lambda: f"value cannot be converted to type {name} without overflow",
    )
    return jnp.where(mask, value.astype(self.dtype), self)


@lowers(aten.masked_scatter.default)
def masked_scatter(self, mask, source):
    shape = jnp.broadcast_shapes(self.shape, mask.shape)
    check(
        self.dtype == source.dtype,
        lambda: (
            "masked_scatter: expected self and source to have same dtypes but got"
            f"{dtype_name(torch_dtype(self.dtype))} and {dtype_name(torch_dtype(source.dtype))}"
        ),
    )  # (ATen's words, its missing space included)
    check(
        mask.dtype == jnp.bool_,
        lambda: (
            "masked_scatter_ only supports boolean masks, but got mask with dtype "
            f"{dtype_name(torch_dtype(mask.dtype))}"
        ),
    )
    self, mask = jnp.broadcast_to(self, shape), jnp.broadcast_to(mask, shape)
    if source.size == 0:
        return self
    flat = mask.reshape(-1)
    position = jnp.clip(jnp.cumsum(flat) - 1, 0, source.size - 1)
    values = source.reshape(-1)[position].reshape(shape).astype(self.dtype)
    return jnp.where(mask, values, self)


# --- gathers and scatters along a dim ----------------------------------------------


def _along(index, dim: int) -> tuple:
    """The full index tuple of a scatter along ``dim``: iotas elsewhere."""
    return tuple(
        index if d == dim else jax.lax.broadcasted_iota(jnp.int64, index.shape, d)
        for d in range(index.ndim)
    )


def _as_1d(x):
    return x.reshape(1) if x.ndim == 0 else x


@lowers(aten.gather.default)
def gather(self, dim, index, sparse_grad=False):
    shape = index.shape
    if index.size == 0:
        return jnp.zeros(shape, self.dtype)
    self, index = _as_1d(self), _as_1d(index)
    dim = wrap_dim(dim, self.ndim)
    size = self.shape[dim]
    _check_index(index, size, _bounds(dim, size), RuntimeError, negative=False)
    src = self[tuple(slice(None) if d == dim else slice(0, n) for d, n in enumerate(index.shape))]
    return jnp.take_along_axis(src, index, axis=dim).reshape(shape)


def _identity(reduce: str, dtype):
    if reduce in ("sum", "mean"):
        return jnp.zeros((), dtype)
    if reduce == "prod":
        return jnp.ones((), dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.asarray(-jnp.inf if reduce == "amax" else jnp.inf, dtype)
    info = jnp.iinfo(dtype) if dtype != jnp.bool_ else None
    if info is None:
        return jnp.asarray(reduce == "amin", dtype)
    return jnp.asarray(info.min if reduce == "amax" else info.max, dtype)


_AT = {"sum": "add", "mean": "add", "prod": "multiply", "amax": "max", "amin": "min"}


def _reduce_into(self, where, src, reduce: str, include_self: bool = True):
    """``self`` with ``src`` reduced into the positions ``where`` (duplicates reduce)."""
    if self.dtype == jnp.bool_:
        # sum and prod of bools are a logical or and and: reduce 0/1 integers instead
        ints = _reduce_into(self.astype(jnp.int32), where, src, reduce, include_self)
        return ints != 0
    src = src.astype(self.dtype)
    base = self
    if not include_self:
        touched = jnp.zeros(self.shape, bool).at[where].set(True)
        base = jnp.where(touched, _identity(reduce, self.dtype), self)
    out = getattr(base.at[where], _AT[reduce])(src)
    if reduce != "mean":
        return out
    count = jnp.full(self.shape, 1 if include_self else 0, self.dtype)
    count = count.at[where].add(jnp.ones(src.shape, self.dtype))
    count = jnp.where(count == 0, jnp.ones((), self.dtype), count)
    if jnp.issubdtype(self.dtype, jnp.inexact):
        return out / count
    return jnp.floor_divide(out, count)


def _scatter_src(src, index):
    return src[tuple(slice(0, n) for n in index.shape)]


def _scatter_where(self, dim, index) -> tuple:
    """The positions a scatter along ``dim`` writes, its index checked as ATen does."""
    size = self.shape[dim]
    _check_index(index, size, _bounds(dim, size), RuntimeError, negative=False)
    return _along(index, dim)


@lowers(aten.scatter)
def scatter(self, dim, index, src=None, value=None, reduce=None):
    if index.size == 0:
        return self
    shape = self.shape
    self, index = _as_1d(self), _as_1d(index)
    dim = wrap_dim(dim, self.ndim)
    if src is None:
        src = jnp.broadcast_to(jnp.asarray(value).astype(self.dtype), index.shape)
    else:
        src = _scatter_src(_as_1d(src), index)
    where = _scatter_where(self, dim, index)
    if reduce is None:
        out = self.at[where].set(src.astype(self.dtype))
    else:
        out = _reduce_into(self, where, src, {"add": "sum", "multiply": "prod"}[reduce])
    return out.reshape(shape)


@lowers(aten.scatter_add.default)
def scatter_add(self, dim, index, src):
    if index.size == 0:
        return self
    shape = self.shape
    self, index, src = _as_1d(self), _as_1d(index), _as_1d(src)
    where = _scatter_where(self, wrap_dim(dim, self.ndim), index)
    return _add_at(self, where, _scatter_src(src, index).astype(self.dtype)).reshape(shape)


@lowers(aten.scatter_reduce.two)
def scatter_reduce(self, dim, index, src, reduce, include_self=True):
    if index.size == 0:
        return self
    shape = self.shape
    self, index, src = _as_1d(self), _as_1d(index), _as_1d(src)
    where = _scatter_where(self, wrap_dim(dim, self.ndim), index)
    return _reduce_into(self, where, _scatter_src(src, index), reduce, include_self).reshape(shape)


_OUT_OF_RANGE = "index out of range in self"  # (index_select, index_add, embedding: ATen's)


def _at_dim(self, dim: int, index, message: str = _OUT_OF_RANGE, negative=False) -> tuple:
    """The positions ``self[..., index, ...]`` along ``dim``, the index checked."""
    dim = wrap_dim(dim, self.ndim)
    _check_index(index, self.shape[dim], message, negative=negative)
    return (slice(None),) * dim + (index.reshape(-1),)


def _source_like(self, dim: int, index, source):
    """``source`` shaped as the positions ``self[..., index, ...]`` it lands in."""
    shape = list(self.shape)
    shape[wrap_dim(dim, self.ndim)] = index.size
    return source.reshape(shape).astype(self.dtype)


@lowers(aten.index_select.default)
def index_select(self, dim, index):
    if self.ndim == 0:
        _check_index(index, 1, _OUT_OF_RANGE, negative=False)
        return self.reshape(1)[index.reshape(-1)].reshape(())
    dim = wrap_dim(dim, self.ndim)
    _check_index(index, self.shape[dim], _OUT_OF_RANGE, negative=False)
    return jnp.take(self, index.reshape(-1), axis=dim)


def _check_source_shape(self, dim: int, index, source) -> None:
    """ATen's check of ``source`` in index_add and index_reduce (``index_func_meta_impl``),
    which PyTorch's Meta kernels do not make: ``self``'s shape but along ``dim``. (When
    the checks ATen makes before it fail, the lowering fails, and the Meta kernel words
    them.)"""
    dim = wrap_dim(dim, self.ndim)
    if not (dim == 0 or dim < source.ndim):
        return
    if index.size != (1 if source.ndim == 0 else source.shape[dim]):
        return
    self_sizes, source_sizes = list(self.shape), list(source.shape)
    if self.ndim and source.ndim:
        del self_sizes[dim], source_sizes[dim]
    check(
        self_sizes == source_sizes,
        lambda: (
            "source tensor shape must match self tensor shape, excluding the specified "
            f"dimension. Got self.shape = {list(self.shape)} source.shape = {list(source.shape)}"
        ),
    )


@lowers(aten.index_add.default)
def index_add(self, dim, index, source, alpha=1):
    _check_source_shape(self, dim, index, source)
    shape = self.shape
    self = _as_1d(self)
    source = _source_like(self, dim, index, source)
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        source = source * jnp.asarray(alpha).astype(self.dtype)
    return _add_at(self, _at_dim(self, dim, index), source).reshape(shape)


@lowers(aten.index_copy.default)
def index_copy(self, dim, index, source):
    shape = self.shape
    self = _as_1d(self)
    source = _source_like(self, dim, index, source)
    d = wrap_dim(dim, self.ndim)
    message = "index_copy_(): " + _bounds(d, self.shape[d])
    return self.at[_at_dim(self, dim, index, message)].set(source).reshape(shape)


@lowers(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(self, dim, index, value):
    shape = self.shape
    self = _as_1d(self)
    value = jnp.asarray(value).astype(self.dtype)
    d = wrap_dim(dim, self.ndim)
    where = _at_dim(self, dim, index, _bounds(d, self.shape[d]), negative=True)
    return self.at[where].set(value).reshape(shape)


@lowers(aten.index_reduce.default)
def index_reduce(self, dim, index, source, reduce, include_self=True):
    _check_source_shape(self, dim, index, source)
    shape = self.shape
    self = _as_1d(self)
    source = _source_like(self, dim, index, source)
    return _reduce_into(self, _at_dim(self, dim, index), source, reduce, include_self).reshape(
        shape
    )


@lowers(aten.put.default)
def put(self, index, source, accumulate=False):
    flat = self.reshape(-1)
    index, source = index.reshape(-1), source.reshape(-1).astype(self.dtype)
    _check_index(index, flat.size, _take_range(flat.size))
    flat = _add_at(flat, index, source) if accumulate else flat.at[index].set(source)
    return flat.reshape(self.shape)


@lowers(aten.take.default)
def take(self, index):
    _check_index(index, self.size, _take_range(self.size))
    return self.reshape(-1)[index]


def _take_range(n: int) -> str:
    return f"out of range: tried to access index {{}} on a tensor of {n} elements."


# --- unique: the number of distinct values is read on the host --------------------------


def _rows(self, dim):
    """``self`` as rows to compare: elements (dim None) or slices along ``dim``."""
    if dim is None:
        return self.reshape(-1, 1)
    x = jnp.moveaxis(self, dim, 0)
    return x.reshape(x.shape[0], int(np.prod(x.shape[1:])))


def _sorted_rows(self, dim):
    rows = _rows(self, dim)
    if rows.shape[0] == 0 or rows.shape[1] == 0:
        order = jnp.arange(rows.shape[0])
    else:
        # lexsort's last key is the primary one
        order = jnp.lexsort(tuple(rows[:, j] for j in reversed(range(rows.shape[1]))))
    return rows[order], order


def _starts(rows):
    """Where a new run of equal rows begins."""
    if rows.shape[0] == 0:
        return jnp.zeros((0,), bool)
    change = jnp.any(rows[1:] != rows[:-1], axis=1)
    return jnp.concatenate([jnp.ones((1,), bool), change])


def _count_runs(self, dim, sort):
    rows = _sorted_rows(self, dim)[0] if sort else _rows(self, dim)
    return jnp.sum(_starts(rows))


def _runs(self, dim, sort, size, return_inverse, return_counts):
    rows, order = _sorted_rows(self, dim) if sort else (_rows(self, dim), None)
    starts = _starts(rows)
    first = jnp.nonzero(starts, size=size, fill_value=0)[0]
    if dim is None:
        output = rows[first, 0]
    else:
        x = jnp.moveaxis(self, dim, 0)
        output = jnp.moveaxis(x[order[first] if sort else first], 0, dim)
    group = jnp.cumsum(starts) - 1
    if sort:
        group = jnp.zeros_like(group).at[order].set(group)
    inverse_shape = self.shape if dim is None else (self.shape[dim],)
    inverse = group.reshape(inverse_shape) if return_inverse else jnp.zeros((0,), jnp.int64)
    ends = jnp.concatenate([first[1:], jnp.full((1,), rows.shape[0])])[:size]
    counts = ends - first if return_counts else jnp.zeros((0,), jnp.int64)
    return output, inverse.astype(jnp.int64), counts.astype(jnp.int64)


def _unique(self: torch.Tensor, dim, sort: bool, return_inverse: bool, return_counts: bool):
    size = host_int(run_jitted(_count_runs, self, dim=dim, sort=sort))
    out = run_jitted(
        _runs,
        self,
        dim=dim,
        sort=sort,
        size=size,
        return_inverse=return_inverse,
        return_counts=return_counts,
    )
    return _wrap_all(out, self)


@implements(aten._unique2.default)
def _unique2(self, sorted=True, return_inverse=False, return_counts=False):
    # NOTE: always sorted; PyTorch leaves the order unspecified for sorted=False
    return _unique(self, None, True, return_inverse, return_counts)


@implements(aten._unique.default)
def _unique_(self, sorted=True, return_inverse=False):
    return _unique(self, None, True, return_inverse, False)[:2]


@implements(aten.unique_dim.default)
def unique_dim(self, dim, sorted=True, return_inverse=False, return_counts=False):
    return _unique(self, wrap_dim(dim, self.dim()), True, return_inverse, return_counts)


@implements(aten.unique_consecutive.default)
def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    dim = None if dim is None else wrap_dim(dim, self.dim())
    return _unique(self, dim, False, return_inverse, return_counts)


@implements(aten.repeat_interleave.Tensor)
def repeat_interleave(repeats, *, output_size=None):
    if output_size is None:
        output_size = host_int(run_jitted(jnp.sum, repeats))
    return wrap(run_jitted(_repeat_index, repeats, size=output_size), repeats.device.index or 0)


def _repeat_index(repeats, size):
    asserts.check(repeats >= 0, RuntimeError, "repeats can not be negative")
    return jnp.repeat(jnp.arange(repeats.shape[0]), repeats, total_repeat_length=size)
