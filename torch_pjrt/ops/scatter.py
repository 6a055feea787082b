"""Gathers and scatters along a dim, and their flat forms: ``gather``, ``scatter`` and its
reductions, ``index_select``, ``index_add``, ``index_copy``, ``index_fill``,
``index_reduce``, ``put`` and ``take``.

Every index is checked on the device as CPU PyTorch checks it, with its exception type
and message (``indexing.check_index``, ``runtime.asserts``): XLA would clamp it, or drop
the write, silently.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from torch_pjrt.ops._helpers import (
    add_at,
    check,
    check_index,
    out_of_bounds,
    unsupported,
    wrap_dim,
)
from torch_pjrt.ops._promote import upcast
from torch_pjrt.ops.registry import lowers

aten = torch.ops.aten


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
    check_index(index, size, out_of_bounds(dim, size), RuntimeError, negative=False)
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


def _reduce_into(self, where, src, reduce: str, include_self=True, opmath=False):
    """``self`` with ``src`` reduced into the positions ``where`` (duplicates reduce).
    ``opmath``: half types accumulate in float32 and round once, as ATen's CPU scatter
    kernels do (measured: a bfloat16 ``scatter_add`` with duplicate indices rounds each
    sum once; ``index_reduce`` rounds each step); a mean divides the rounded sum."""
    if self.dtype == jnp.bool_:
        # sum and prod of bools are a logical or and and: reduce 0/1 integers instead
        ints = _reduce_into(self.astype(jnp.int32), where, src, reduce, include_self)
        return ints != 0
    src = src.astype(self.dtype)
    base = self
    if not include_self:
        touched = jnp.zeros(self.shape, bool).at[where].set(True)
        base = jnp.where(touched, _identity(reduce, self.dtype), self)
    if opmath:
        base, src = upcast(base), upcast(src)
    out = getattr(base.at[where], _AT[reduce])(src).astype(self.dtype)
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
    check_index(index, size, out_of_bounds(dim, size), RuntimeError, negative=False)
    return _along(index, dim)


@lowers(aten.scatter, fits=("value",))
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
        reduce = {"add": "sum", "multiply": "prod"}[reduce]
        out = _reduce_into(self, where, src, reduce, opmath=True)
    return out.reshape(shape)


@lowers(aten.scatter_add.default)
def scatter_add(self, dim, index, src):
    if index.size == 0:
        return self
    shape = self.shape
    self, index, src = _as_1d(self), _as_1d(index), _as_1d(src)
    where = _scatter_where(self, wrap_dim(dim, self.ndim), index)
    src = _scatter_src(src, index)
    return _reduce_into(self, where, src, "sum", opmath=True).reshape(shape)


def _no_kernel(self, reduce: str, kernels: dict) -> None:
    """CPU PyTorch's refusal of a reduction it has no kernel for: ``kernels`` maps
    (reduce, "bool" or "complex") to the kernel its message names."""
    kind = "bool" if self.dtype == jnp.bool_ else "complex" if jnp.iscomplexobj(self) else None
    kernel = kernels.get((reduce, kind))
    if kernel is not None:
        raise unsupported(kernel, self, cpu=False)


_SCATTER_REDUCE_KERNELS = {
    ("mean", "bool"): "scatter_gather_tensor_cpu_reduce_mean",
    ("amax", "complex"): "scatter_gather_tensor_cpu_reduce_amax",
    ("amin", "complex"): "scatter_gather_tensor_cpu_reduce_amin",
}


@lowers(aten.scatter_reduce.two)
def scatter_reduce(self, dim, index, src, reduce, include_self=True):
    _no_kernel(self, reduce, _SCATTER_REDUCE_KERNELS)
    if index.size == 0:
        return self
    shape = self.shape
    self, index, src = _as_1d(self), _as_1d(index), _as_1d(src)
    where = _scatter_where(self, wrap_dim(dim, self.ndim), index)
    src = _scatter_src(src, index)
    return _reduce_into(self, where, src, reduce, include_self, opmath=True).reshape(shape)


_OUT_OF_RANGE = "index out of range in self"  # (index_select, index_add, embedding: ATen's)


def _at_dim(self, dim: int, index, message: str = _OUT_OF_RANGE, negative=False) -> tuple:
    """The positions ``self[..., index, ...]`` along ``dim``, the index checked."""
    dim = wrap_dim(dim, self.ndim)
    check_index(index, self.shape[dim], message, negative=negative)
    return (slice(None),) * dim + (index.reshape(-1),)


def _source_like(self, dim: int, index, source):
    """``source`` shaped as the positions ``self[..., index, ...]`` it lands in."""
    shape = list(self.shape)
    shape[wrap_dim(dim, self.ndim)] = index.size
    return source.reshape(shape).astype(self.dtype)


@lowers(aten.index_select.default)
def index_select(self, dim, index):
    if self.ndim == 0:
        check_index(index, 1, _OUT_OF_RANGE, negative=False)
        return self.reshape(1)[index.reshape(-1)].reshape(())
    dim = wrap_dim(dim, self.ndim)
    check_index(index, self.shape[dim], _OUT_OF_RANGE, negative=False)
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


@lowers(aten.index_add.default, static=("alpha",))  # (alpha 1 picks the algorithm)
def index_add(self, dim, index, source, alpha=1):
    _check_source_shape(self, dim, index, source)
    shape = self.shape
    self = _as_1d(self)
    source = _source_like(self, dim, index, source)
    where = _at_dim(self, dim, index)
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        source = source * jnp.asarray(alpha).astype(self.dtype)
    elif self.ndim > 1 and wrap_dim(dim, self.ndim) in (0, self.ndim - 1):
        # ATen's CPU kernel takes its scatter path here (measured: half types summed in
        # float32, rounded once); along a middle dim, of a vector, or with an alpha it
        # adds slice by slice, rounding each step
        return _reduce_into(self, where, source, "sum", opmath=True).reshape(shape)
    return add_at(self, where, source).reshape(shape)


@lowers(aten.index_copy.default)
def index_copy(self, dim, index, source):
    shape = self.shape
    self = _as_1d(self)
    source = _source_like(self, dim, index, source)
    d = wrap_dim(dim, self.ndim)
    message = "index_copy_(): " + out_of_bounds(d, self.shape[d])
    where = _at_dim(self, dim, index, message)
    if index.size == 1:  # (a KV cache's row: one XLA kernel, a scatter's guard makes 3)
        row = where[-1][0]
        starts = [row if i == d else jnp.zeros((), row.dtype) for i in range(self.ndim)]
        return lax.dynamic_update_slice(self, source, starts).reshape(shape)
    return self.at[where].set(source).reshape(shape)


@lowers(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor, fits=("value",))
def index_fill(self, dim, index, value):
    shape = self.shape
    self = _as_1d(self)
    value = jnp.asarray(value).astype(self.dtype)
    d = wrap_dim(dim, self.ndim)
    where = _at_dim(self, dim, index, out_of_bounds(d, self.shape[d]), negative=True)
    return self.at[where].set(value).reshape(shape)


# the kernels index_reduce's CPU messages name: with self, of a matrix (of a vector, or
# without self, any reduction of bools or complex numbers is refused)
_INDEX_REDUCE_KERNELS = {
    ("mean", "bool"): "div_floor_cpu",
    ("amax", "complex"): "maximum_cpu",
    ("amin", "complex"): "minimum_cpu",
}


def _every_reduction(kernel: str) -> dict:
    return {
        (r, kind): kernel for r in ("prod", "mean", "amax", "amin") for kind in ("bool", "complex")
    }


@lowers(aten.index_reduce.default)
def index_reduce(self, dim, index, source, reduce, include_self=True):
    check(
        reduce in ("prod", "mean", "amax", "amin"),
        f"index_reduce(): Expected reduce to be one of prod, mean, amax or amin but got {reduce}.",
    )
    if not include_self:
        kernels = _every_reduction("index_reduce_func_exclude_input_init")
    else:
        kernels = _every_reduction("index_func_") if self.ndim <= 1 else _INDEX_REDUCE_KERNELS
    _no_kernel(self, reduce, kernels)
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
    check_index(index, flat.size, _take_range(flat.size))
    flat = add_at(flat, index, source) if accumulate else flat.at[index].set(source)
    return flat.reshape(self.shape)


@lowers(aten.take.default)
def take(self, index):
    check_index(index, self.size, _take_range(self.size))
    return self.reshape(-1)[index]


def _take_range(n: int) -> str:
    return f"out of range: tried to access index {{}} on a tensor of {n} elements."
