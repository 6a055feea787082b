"""Sorting lowerings: sorts, top-k and order statistics (kthvalue, median, mode), and
searches in sorted sequences (``searchsorted``, ``bucketize``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from torch_pjrt.ops._helpers import (
    check,
    dtype_name,
    from_last,
    is_bool,
    is_float,
    maybe_wrap_dim,
    to_last,
    unsupported,
)
from torch_pjrt.ops._promote import cast, result_type
from torch_pjrt.ops.registry import lowers
from torch_pjrt.runtime.transfer import torch_dtype

aten = torch.ops.aten


# --- sorting and order statistics ---------------------------------------------------


def _sort_last(v, descending=False):
    """Stable sort along the last axis; NaN sorts above everything, -0.0 equals 0.0."""
    keys = v
    if is_float(v):
        keys = jnp.where(jnp.isnan(v), jnp.nan, jnp.where(v == 0, 0, v)).astype(v.dtype)
    if keys.dtype == jnp.bool_:
        keys = keys.astype(jnp.uint8)
    n = v.shape[-1]
    idx = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int64), v.shape)
    if descending:
        # a stable ascending sort of the reversed input, reversed, is a stable descending sort
        keys, idx = keys[..., ::-1], idx[..., ::-1]
    _, perm = lax.sort((keys, idx), dimension=v.ndim - 1, is_stable=True, num_keys=1)
    if descending:
        perm = perm[..., ::-1]
    return jnp.take_along_axis(v, perm, -1), perm


def _back(y, like, dim):
    if like.ndim == 0:
        return y.reshape(())
    return jnp.moveaxis(y, -1, maybe_wrap_dim(dim, like.ndim))


@lowers(aten.sort.default, aten.sort.stable)
def sort(self, dim=-1, descending=False, stable=None):
    values, indices = _sort_last(to_last(self, dim), descending)
    return _back(values, self, dim), _back(indices, self, dim)


@lowers(aten.topk.default)
def topk(self, k, dim=-1, largest=True, sorted=True):
    check(not is_bool(self), "topk does not support bool dtypes on CPU")
    v = to_last(self, dim)
    if not 0 <= k <= v.shape[-1]:
        raise RuntimeError("selected index k out of range")
    values, indices = _sort_last(v, descending=largest)
    return _back(values[..., :k], self, dim), _back(indices[..., :k], self, dim)


def _pick(values, indices, pos):
    """Elements at per-row positions ``pos`` (shape ``values.shape[:-1]``)."""
    pos = pos[..., None]
    return jnp.take_along_axis(values, pos, -1), jnp.take_along_axis(indices, pos, -1)


@lowers(aten.kthvalue.default)
def kthvalue(self, k, dim=-1, keepdim=False):
    if is_bool(self):
        raise unsupported("kthvalue", self)
    v = to_last(self, dim)
    if not 1 <= k <= v.shape[-1]:
        raise IndexError(f"kthvalue(): selected number k out of range for dimension {dim}")
    values, indices = _sort_last(v)
    pos = jnp.full(v.shape[:-1], k - 1)
    val, idx = _pick(values, indices, pos)
    return from_last(val, self, dim, keepdim), from_last(idx, self, dim, keepdim)


def _median_last(v, ignore_nan):
    """Lower median of each row and its index; NaN rows give their first NaN, unless
    ``ignore_nan``."""
    values, indices = _sort_last(v)
    n = v.shape[-1]
    nans = jnp.sum(jnp.isnan(v), -1) if is_float(v) else jnp.zeros(v.shape[:-1], jnp.int64)
    if ignore_nan:
        valid = n - nans
        pos = jnp.where(valid > 0, (valid - 1) // 2, 0)
    else:
        pos = jnp.where(nans > 0, n - nans, (n - 1) // 2)
    return _pick(values, indices, pos)


def _median(self, ignore_nan):
    if is_bool(self):  # (nanmedian's CPU kernels are median's)
        raise unsupported("median", self)
    if self.size == 0:
        return jnp.full((), jnp.nan, self.dtype)
    val, _ = _median_last(self.reshape(1, -1), ignore_nan)
    return val.reshape(())


def _median_dim(self, dim, keepdim, ignore_nan):
    if is_bool(self):
        raise unsupported("median_out", self, cpu=False)
    v = to_last(self, dim)
    if v.shape[-1] == 0:
        raise IndexError(f"median(): Expected reduction dim {dim} to have non-zero size.")
    val, idx = _median_last(v, ignore_nan)
    return from_last(val, self, dim, keepdim), from_last(idx, self, dim, keepdim)


@lowers(aten.median.default)
def median(self):
    return _median(self, ignore_nan=False)


@lowers(aten.median.dim)
def median_dim(self, dim, keepdim=False):
    return _median_dim(self, dim, keepdim, ignore_nan=False)


@lowers(aten.nanmedian.default)
def nanmedian(self):
    return _median(self, ignore_nan=True)


@lowers(aten.nanmedian.dim)
def nanmedian_dim(self, dim, keepdim=False):
    return _median_dim(self, dim, keepdim, ignore_nan=True)


@lowers(aten.mode.default)
def mode(self, dim=-1, keepdim=False):
    """Ties go to the smallest value and the index is its last occurrence, as on the CPU."""
    v = to_last(self, dim)
    values, indices = _sort_last(v)
    n = v.shape[-1]
    iota = jnp.broadcast_to(jnp.arange(n), v.shape)
    starts = jnp.concatenate(
        [jnp.ones(v.shape[:-1] + (1,), bool), values[..., 1:] != values[..., :-1]], -1
    )
    run_start = lax.cummax(jnp.where(starts, iota, 0), v.ndim - 1)
    # the count reached at a position is largest at the end of its run, which is the
    # value's last occurrence in a stable sort; argmax takes the smallest value on ties
    pos = jnp.argmax(iota - run_start, -1)
    val, idx = _pick(values, indices, pos)
    return from_last(val, self, dim, keepdim), from_last(idx, self, dim, keepdim)


# --- sorted searches ---------------------------------------------------------------


def _searchsorted(sorted_sequence, values, right, side, sorter, out_int32):
    side = "right" if right or side == "right" else "left"
    dtype = jnp.result_type(sorted_sequence, values)
    seq, values = sorted_sequence.astype(dtype), jnp.asarray(values).astype(dtype)
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter, axis=-1)
    if seq.shape[-1:] == (0,) or values.size == 0:
        out = jnp.zeros(values.shape, jnp.int64)
    elif seq.ndim <= 1:
        out = jnp.searchsorted(seq, values, side=side)
    else:
        lead = seq.shape[:-1]
        rows = jax.vmap(lambda s, v: jnp.searchsorted(s, v, side=side))
        out = rows(seq.reshape(-1, seq.shape[-1]), values.reshape(int(np.prod(lead)), -1))
        out = out.reshape(values.shape)
    return out.astype(jnp.int32 if out_int32 else jnp.int64)


@lowers(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(sorted_sequence, self, out_int32=False, right=False, side=None, sorter=None):
    return _searchsorted(sorted_sequence, self, right, side, sorter, out_int32)


# up to this many (element, test element) pairs, isin compares every pair; past it, it
# sorts the test elements and searches them (ATen too picks one of the two by size)
_ISIN_PAIRS = 1 << 20


# NOTE: one recorded op where ATen's decomposition makes four (a view, a broadcast
# comparison, ``any`` and a copy): ``generate()``'s logits processors and stopping
# criteria call isin several times a token
def _isin(elements, test_elements, invert):
    for x in (elements, test_elements):  # (in the CPU's words: the Meta kernel's differ)
        dtype = jnp.result_type(x)
        check(
            dtype != jnp.bool_ and not jnp.issubdtype(dtype, jnp.complexfloating),
            lambda: (
                f"Unsupported input type encountered for isin(): {dtype_name(torch_dtype(dtype))}"
            ),
        )
    compute, _ = result_type(elements, test_elements)
    values, tests = cast(elements, compute), cast(test_elements, compute).reshape(-1)
    if tests.size == 0:
        found = jnp.zeros(values.shape, bool)
    elif values.size * tests.size <= _ISIN_PAIRS:
        found = (values[..., None] == tests).any(-1)
    else:  # (NaN sorts last and equals nothing: a NaN is found nowhere, as on the CPU)
        ordered = jnp.sort(tests)
        at = jnp.clip(jnp.searchsorted(ordered, values), 0, tests.size - 1)
        found = ordered[at] == values
    return found != invert


@lowers(aten.isin.Tensor_Tensor)
def isin(elements, test_elements, assume_unique=False, invert=False):
    return _isin(elements, test_elements, invert)


@lowers(aten.isin.Tensor_Scalar)
def isin_scalar(elements, test_element, assume_unique=False, invert=False):
    return _isin(elements, test_element, invert)


@lowers(aten.isin.Scalar_Tensor)
def isin_of_scalar(element, test_elements, assume_unique=False, invert=False):
    return _isin(element, test_elements, invert)


@lowers(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(self, boundaries, out_int32=False, right=False):
    check(
        boundaries.ndim == 1,
        lambda: f"boundaries tensor must be 1 dimension, but got dim({boundaries.ndim})",
    )
    return _searchsorted(boundaries, self, right, None, None, out_int32)
