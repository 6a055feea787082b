"""Lowerings used only inside traced graphs: views, allocation, copies and sizes.

Eagerly, these ops must work on tensors: a view aliases its base (``ops/memory.py``
makes it with PyTorch's Meta kernels), ``empty`` allocates, ``copy_`` writes a
storage. In a functional graph (what AOT autograd hands ``torch.compile`` backends)
they are plain functions of values, and lowering them lets a whole graph become one
XLA program. Composite views (``t``, ``transpose``, ``expand``...) run eagerly through
PyTorch's own composites and need no eager kernel at all.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from torch_pjrt.ops.indexing import _index_lowering, _index_put_lowering
from torch_pjrt.ops.random import _normal, _uniform
from torch_pjrt.ops.registry import lowers_in_graphs as in_graphs
from torch_pjrt.ops.shape import _slice_bounds
from torch_pjrt.runtime.transfer import jax_dtype
from torch_pjrt.tensor import _contiguous_strides, _flat_index, _reinterpret

aten = torch.ops.aten


def _dim(dim: int, ndim: int) -> int:
    return dim % max(ndim, 1) if dim < 0 else dim


def _dtype(dtype, like=None):
    if dtype is not None:
        return jax_dtype(dtype)
    return like.dtype if like is not None else jax_dtype(torch.get_default_dtype())


# --- views, as values ---------------------------------------------------------------


@in_graphs(
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.view_copy.default,
    aten._reshape_alias.default,
    aten._reshape_alias_copy.default,
)
def view(self, size, stride=None):
    return jnp.reshape(self, tuple(size))


@in_graphs(aten.view.dtype)
def view_dtype(self, dtype):
    target = jax_dtype(dtype)
    if self.ndim == 0:
        return _reinterpret(self, target).reshape(())
    flat = _reinterpret(self, target)
    return flat.reshape(self.shape[:-1] + (-1,))


@in_graphs(
    aten.alias.default,
    aten.alias_copy.default,
    aten.detach.default,
    aten.detach_copy.default,
    aten.lift_fresh_copy.default,
    aten.lift_fresh.default,
    aten.clone.default,
)
def identity(self, memory_format=None):
    return self


@in_graphs(aten.t.default, aten.t_copy.default)
def t(self):
    return self.T if self.ndim == 2 else self


@in_graphs(aten.transpose.int, aten.transpose_copy.int)
def transpose(self, dim0, dim1):
    if self.ndim == 0:
        return self
    return jnp.swapaxes(self, _dim(dim0, self.ndim), _dim(dim1, self.ndim))


@in_graphs(aten.permute.default, aten.permute_copy.default)
def permute(self, dims):
    return jnp.transpose(self, tuple(_dim(d, self.ndim) for d in dims))


@in_graphs(aten.expand.default, aten.expand_copy.default)
def expand(self, size, implicit=False):
    lead = len(size) - self.ndim
    shape = tuple(self.shape[i - lead] if s == -1 and i >= lead else s for i, s in enumerate(size))
    return jnp.broadcast_to(self, shape)


@in_graphs(aten.squeeze.default, aten.squeeze_copy.default)
def squeeze(self):
    return jnp.squeeze(self, tuple(i for i, s in enumerate(self.shape) if s == 1))


@in_graphs(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze_copy.dim, aten.squeeze_copy.dims)
def squeeze_dims(self, dim):
    if self.ndim == 0:
        return self
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    dims = {_dim(d, self.ndim) for d in dims}
    return jnp.squeeze(self, tuple(d for d in sorted(dims) if self.shape[d] == 1))


@in_graphs(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def unsqueeze(self, dim):
    return jnp.expand_dims(self, _dim(dim, self.ndim + 1))


@in_graphs(aten.select.int, aten.select_copy.int)
def select(self, dim, index):
    dim = _dim(dim, self.ndim)
    index = index + self.shape[dim] if index < 0 else index
    return jax.lax.index_in_dim(self, index, dim, keepdims=False)


@in_graphs(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(self, dim=0, start=None, end=None, step=1):
    dim = _dim(dim, self.ndim)
    start, end, step = _slice_bounds(self.shape[dim], start, end, step)
    return self[(slice(None),) * dim + (slice(start, end, step),)]


@in_graphs(aten.narrow.default, aten.narrow_copy.default)
def narrow(self, dim, start, length):
    dim = _dim(dim, self.ndim)
    start = start + self.shape[dim] if start < 0 else start
    return jax.lax.slice_in_dim(self, start, start + length, axis=dim)


def _pieces(self, sizes, dim):
    out, at = [], 0
    for size in sizes:
        out.append(jax.lax.slice_in_dim(self, at, at + size, axis=dim))
        at += size
    return out


@in_graphs(aten.split.Tensor, aten.split_copy.Tensor)
def split(self, split_size, dim=0):
    dim = _dim(dim, self.ndim)
    n = self.shape[dim]
    if split_size == 0:
        return [self]
    sizes = [min(split_size, n - i) for i in range(0, n, split_size)] or [0]
    return _pieces(self, sizes, dim)


@in_graphs(aten.split_with_sizes.default, aten.split_with_sizes_copy.default)
def split_with_sizes(self, split_sizes, dim=0):
    return _pieces(self, split_sizes, _dim(dim, self.ndim))


@in_graphs(aten.unbind.int, aten.unbind_copy.int)
def unbind(self, dim=0):
    dim = _dim(dim, self.ndim)
    return [jax.lax.index_in_dim(self, i, dim, keepdims=False) for i in range(self.shape[dim])]


@in_graphs(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal(self, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(self, offset, _dim(dim1, self.ndim), _dim(dim2, self.ndim))


@in_graphs(aten.as_strided.default, aten.as_strided_copy.default)
def as_strided(self, size, stride, storage_offset=None):
    # NOTE: values in a graph are dense row-major arrays, so self's storage is self
    flat = self.reshape(-1)
    offset = storage_offset or 0
    if math.prod(size) == 0:
        return jnp.zeros(tuple(size), self.dtype)
    return flat[_flat_index(tuple(size), tuple(stride)) + offset]


@in_graphs(aten.unfold.default, aten.unfold_copy.default)
def unfold(self, dimension, size, step):
    if self.ndim == 0:
        return self.reshape(1)
    dim = _dim(dimension, self.ndim)
    windows = (self.shape[dim] - size) // step + 1
    starts = jnp.arange(windows) * step
    index = starts[:, None] + jnp.arange(size)[None, :]
    taken = jnp.take(self, index, axis=dim)  # (..., windows, size, ...)
    return jnp.moveaxis(taken, dim + 1, -1)


@in_graphs(aten.view_as_real.default, aten.view_as_real_copy.default)
def view_as_real(self):
    return jnp.stack([jnp.real(self), jnp.imag(self)], axis=-1)


@in_graphs(aten.view_as_complex.default, aten.view_as_complex_copy.default)
def view_as_complex(self):
    return jax.lax.complex(self[..., 0], self[..., 1])


# --- copies ---------------------------------------------------------------------------


@in_graphs(aten._to_copy.default)
def to_copy(
    self,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    non_blocking=False,
    memory_format=None,
):
    return self if dtype is None else self.astype(jax_dtype(dtype))


@in_graphs(torch.ops.prims.convert_element_type.default)
def convert_element_type(a, dtype):
    # left in graphs by decompositions of size arithmetic (symbolic shapes)
    return a.astype(jax_dtype(dtype))


@in_graphs(aten.copy.default)
def copy(self, src, non_blocking=False):
    return jnp.broadcast_to(jnp.asarray(src).astype(self.dtype), self.shape)


# --- allocation -----------------------------------------------------------------------


def _fill_dtype(fill_value):
    if isinstance(fill_value, bool):
        return jnp.bool_
    if isinstance(fill_value, int):
        return jnp.int64
    if isinstance(fill_value, complex):
        wide = torch.get_default_dtype() == torch.float64
        return jax_dtype(torch.complex128 if wide else torch.complex64)
    return jax_dtype(torch.get_default_dtype())


@in_graphs(aten.full.default)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = jax_dtype(dtype) if dtype is not None else _fill_dtype(fill_value)
    return jnp.full(tuple(size), fill_value, dtype)


@in_graphs(aten.full_like.default)
def full_like(
    self, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None
):
    return jnp.full(self.shape, fill_value, _dtype(dtype, self))


@in_graphs(aten.scalar_tensor.default)
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(s, _dtype(dtype))


def _constant(value):
    def allocate(
        size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None
    ):
        return jnp.full(tuple(size), value, _dtype(dtype))

    def like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        return jnp.full(self.shape, value, _dtype(dtype, self))

    def new(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
        return jnp.full(tuple(size), value, _dtype(dtype, self))

    return allocate, like, new


# NOTE: the contents of ``empty`` are unspecified; zeros are as good as any
for _value, _ops in (
    (0, (aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default)),
    (1, (aten.ones.default, aten.ones_like.default, aten.new_ones.default)),
    (0, (aten.empty.memory_format, aten.empty_like.default, aten.new_empty.default)),
):
    for _op, _fn in zip(_ops, _constant(_value)):
        in_graphs(_op)(_fn)


@in_graphs(aten.empty_strided.default)
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), _dtype(dtype))


@in_graphs(aten.new_empty_strided.default)
def new_empty_strided(self, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), _dtype(dtype, self))


@in_graphs(aten.new_full.default)
def new_full(self, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(tuple(size), fill_value, _dtype(dtype, self))


def _arange_dtype(dtype, *values):
    if dtype is not None:
        return dtype
    integral = all(isinstance(v, (bool, int)) for v in values)
    return torch.int64 if integral else torch.get_default_dtype()


@in_graphs(aten.arange.default)
def arange_end(end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return arange(0, end, 1, dtype=dtype)


@in_graphs(aten.arange.start, aten.arange.start_step)
def arange(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    from torch_pjrt.ops.creation import _acc_dtype, _arange_length

    dtype = _arange_dtype(dtype, start, end, step)
    length = _arange_length(start, end, step, dtype)
    acc = _acc_dtype(dtype)
    steps = jnp.asarray(step, acc) * jnp.arange(length, dtype=acc)
    return (jnp.asarray(start, acc) + steps).astype(jax_dtype(dtype))


# --- random draws (eagerly: ``empty`` then an in-place sampler) -------------------------


@in_graphs(aten.rand.default, random=True)
def rand(size, *, dtype=None, layout=None, device=None, pin_memory=None, key):
    return _uniform(key, tuple(size), _dtype(dtype))


@in_graphs(aten.rand_like.default, random=True)
def rand_like(
    self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, key
):
    return _uniform(key, self.shape, _dtype(dtype, self))


@in_graphs(aten.randn.default, random=True)
def randn(size, *, dtype=None, layout=None, device=None, pin_memory=None, key):
    dtype = _dtype(dtype)
    return _normal(key, tuple(size), dtype).astype(dtype)


@in_graphs(aten.randn_like.default, random=True)
def randn_like(
    self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, key
):
    dtype = _dtype(dtype, self)
    return _normal(key, self.shape, dtype).astype(dtype)


# --- indexing with integer indices (boolean masks have data-dependent shapes) ---------


@in_graphs(aten.index.Tensor, aten._unsafe_index.Tensor)
def index(self, indices):
    return _index_lowering(self, indices)


@in_graphs(aten.index_put.default, aten._unsafe_index_put.default)
def index_put(self, indices, values, accumulate=False):
    return _index_put_lowering(self, indices, values, accumulate)


# --- sizes (static in a program) --------------------------------------------------------


@in_graphs(aten.sym_size.int)
def sym_size(self, dim):
    return self.shape[_dim(dim, self.ndim)]


@in_graphs(aten.sym_numel.default)
def sym_numel(self):
    return math.prod(self.shape)


@in_graphs(aten.sym_stride.int)
def sym_stride(self, dim):
    return _contiguous_strides(self.shape)[_dim(dim, self.ndim)]


@in_graphs(aten.sym_storage_offset.default)
def sym_storage_offset(self):
    return 0
