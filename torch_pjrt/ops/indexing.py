"""Indexing lowerings: advanced indexing, masks, ``nonzero``, ``unique``, ``repeat_interleave``
(gathers and scatters along a dim: ``scatter.py``).

Boolean masks in ``index``/``index_put`` and the data-dependent ops (``nonzero``,
``masked_select``, ``unique``) need the number of selected elements to fix the result
shape, so they are raw kernels that read that count on the host (a counted host sync)
and then run a static-shape lowering.

Every index is checked on the device as CPU PyTorch checks it, with its exception type
and message (:func:`_helpers.check_index`, ``runtime.asserts``): XLA would clamp it, or drop the
write, silently.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from torch_pjrt.device.tensor import wrap
from torch_pjrt.ops._helpers import (
    add_at,
    check,
    check_index,
    dtype_name,
    host_int,
    out_of_bounds,
    run_jitted,
    unsupported,
    wrap_dim,
)
from torch_pjrt.ops.registry import Kernel, Lowering, implements, lowers
from torch_pjrt.ops.registry import lowers_in_graphs as in_graphs
from torch_pjrt.ops.scalar_fits import c10_name, value_fits
from torch_pjrt.ops.variants import InplaceKernel, _check_overlap, resize_output
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


def _index_tuple(indices) -> tuple:
    return tuple(slice(None) if i is None else i for i in indices)


def _check_indices(self, indices) -> None:
    """Advanced indexing's check: each index tensor within its dimension (named, as
    ATen names it, by its place among the index tensors: ``x[:, i]``'s is "0")."""
    k = 0
    for d, i in enumerate(indices):
        if i is not None:
            if i.dtype not in (jnp.bool_, jnp.uint8):
                check_index(i, self.shape[d], out_of_bounds(k, self.shape[d]))
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
    return add_at(self, where, values) if accumulate else self.at[where].set(values)


_INDEX = Kernel(aten.index.Tensor, Lowering(_index_lowering))
_INDEX_PUT = Kernel(aten.index_put.default, Lowering(_index_put_lowering))
_INPLACE_INDEX_PUT = InplaceKernel(_INDEX_PUT, aten.index_put_.default)


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


def _index_put_args(self, indices, values) -> tuple:
    values = _on_device(values, self.device)
    if _single_mask(self, indices, values):
        return [_on_device(t, self.device) for t in indices], values
    return _expand_masks(self, indices), values


def _index_put(self, indices, values, accumulate=False):
    return _INDEX_PUT(self, *_index_put_args(self, indices, values), accumulate)


def _index_put_inplace(self, indices, values, accumulate):
    """``self[indices] = values`` as an in-place op: the scatter's result becomes self's
    storage (its old buffer donated, in fused mode) rather than a new tensor copied into
    it, so a small write into a large tensor (a KV cache) does not copy the tensor."""
    _INPLACE_INDEX_PUT(self, *_index_put_args(self, indices, values), accumulate)
    return self


@implements(aten.index_put.default)
def index_put(self, indices, values, accumulate=False):
    return _index_put(self, indices, values, accumulate)


@implements(aten.index_put_.default)
def index_put_(self, indices, values, accumulate=False):
    return _index_put_inplace(self, indices, values, accumulate)


@implements(aten._index_put_impl_.default)
def _index_put_impl_(self, indices, values, accumulate=False, unsafe=False):
    return _index_put_inplace(self, indices, values, accumulate)


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


@lowers(aten.masked_fill.Scalar, fits=("value",))
def masked_fill(self, mask, value):
    value = jnp.asarray(value)
    if jnp.iscomplexobj(value) and not jnp.iscomplexobj(self):
        value = jnp.real(value)  # (a nonzero imaginary part does not fit: refused before)
    return jnp.where(mask, value.astype(self.dtype), self)


@lowers(aten.masked_fill.Tensor)
def masked_fill_tensor(self, mask, value):
    # the value is a 0-dim tensor: whether it fits self's dtype is checked on the device
    # (the CPU reads it: ``value.item()``)
    asserts.check(
        value_fits(value, self.dtype),
        RuntimeError,
        f"value cannot be converted to type {c10_name(torch_dtype(self.dtype))} without overflow",
    )
    return masked_fill(self, mask, value)


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
    if self.is_complex():
        raise unsupported("unique_dim" if sort and dim is not None else "unique", self, cpu=False)
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
