"""Views: eagerly, tensors that alias their base, made by PyTorch's Meta kernels (genuine
views sharing the storage, with the right metadata); in traced graphs, functions of values.

Eagerly a view must alias its base, and ``set_`` and ``resize_`` re-point a tensor at a
storage: these are raw kernels (``@implements``). In a functional graph (what AOT
autograd hands ``torch.compile`` backends) views are plain functions of values, lowered
with ``lowers_in_graphs`` so that a whole graph becomes one XLA program; sizes are static
there. Composite views (``t``, ``transpose``, ``expand``...) run eagerly through
PyTorch's own composites and need no eager kernel at all.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from torch._C import DispatchKey, DispatchKeySet

from torch_pjrt.device.tensor import (
    _contiguous_strides,
    _flat_index,
    _reinterpret,
    cell_of,
    new_tensor,
    storage_size,
)
from torch_pjrt.ops._helpers import slice_bounds, wrap_dim
from torch_pjrt.ops.registry import implements
from torch_pjrt.ops.registry import lowers_in_graphs as in_graphs
from torch_pjrt.runtime.transfer import jax_dtype

aten = torch.ops.aten
_META = DispatchKeySet(DispatchKey.Meta)


# --- eagerly: PyTorch's Meta kernels make the views; set_ and resize_ ---------------------


def _point_at(t: torch.Tensor, storage, offset: int, shape, strides) -> torch.Tensor:
    """Make t a view of ``storage`` with the given geometry, in place (``set_``).

    NOTE: pjrt storages are not resizable (their sizes are fixed at creation), and
    PyTorch's Meta ``set_`` insists on a resizable storage unless the new view is
    empty; so t is first set to an empty view, then re-strided in place.
    """
    aten.set_.source_Storage_storage_offset.redispatch(_META, t, storage, offset, (0,), (1,))
    if math.prod(shape) != 0 or tuple(shape) != (0,):
        aten.as_strided_.default.redispatch(_META, t, tuple(shape), tuple(strides), offset)
    return t


def _meta_view(op):
    def kernel(*args, **kwargs):
        return op.redispatch(_META, *args, **kwargs)

    return kernel


# the view primitives the C++ library (device/guard.cpp) registers with PyTorch's own
# kernels when it is built: then these Python ones are not registered (ops.install)
IN_CPP = frozenset(
    {
        aten.as_strided.default,
        aten.view.default,
        aten._reshape_alias.default,
        aten.unfold.default,
        aten.view_as_real.default,
        aten.view_as_complex.default,
    }
)


def register_meta_views(implements_fn) -> None:
    """View primitives: PyTorch's Meta kernels make genuine views sharing the storage."""
    for op in (*IN_CPP, aten.as_strided_.default):
        implements_fn(op)(_meta_view(op))


register_meta_views(implements)


@implements(aten.view.dtype)
def view_dtype(self, dtype):
    # PyTorch's Meta kernel makes the view (the last dimension scaled when the element
    # sizes differ) and raises CPU's errors; reads and writes through a view of another
    # dtype reinterpret the storage's bytes (device/tensor.py, _reinterpret)
    return aten.view.dtype.redispatch(_META, self, dtype)


@implements(aten.set_.source_Storage_storage_offset)
def set_source_storage_offset(self, source, storage_offset, size, stride=()):
    if not stride:
        stride = _contiguous_strides(size)
    return _point_at(self, source, storage_offset, size, stride)


@implements(aten.set_.source_Storage)
def set_source_storage(self, source):
    numel = source.nbytes() // self.dtype.itemsize
    return _point_at(self, source, 0, (numel,), (1,))


@implements(aten.set_.source_Tensor)
def set_source_tensor(self, source):
    return _point_at(
        self, source.untyped_storage(), source.storage_offset(), source.shape, source.stride()
    )


@implements(aten.set_.default)
def set_empty(self):
    fresh = new_tensor((0,), self.dtype, self.device.index or 0)
    return _point_at(self, fresh.untyped_storage(), 0, (0,), (1,))


@implements(aten.resize_.default)
def resize_(self, size, memory_format=None):
    shape = tuple(size)
    if any(s < 0 for s in shape):
        raise RuntimeError(f"Trying to create tensor with negative dimension: {list(shape)}")
    if shape == tuple(self.shape) and memory_format is None:
        return self  # as in ATen: the same sizes keep the strides (a transposed out stays so)
    strides = _contiguous_strides(shape)
    offset = self.storage_offset()
    needed = (offset + storage_size(shape, strides)) * self.dtype.itemsize
    storage = self.untyped_storage()
    if needed > storage.nbytes():
        # a bigger storage, holding the old bytes first (PyTorch's realloc semantics)
        old = cell_of(self)
        grown = new_tensor((-(-needed // old.dtype.itemsize),), old.dtype, old.index)
        if old.size and old.array is not None:  # (an empty out= tensor has nothing to keep)
            flat = old.array.reshape(-1)
            with jax.enable_x64(True):
                cell_of(grown).array = jnp.concatenate(
                    [flat, jnp.zeros((cell_of(grown).size - flat.size,), flat.dtype)]
                )
        storage = grown.untyped_storage()
    return _point_at(self, storage, offset, shape, strides)


# --- views in graphs, as values -----------------------------------------------------------


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
def view_dtype_in_graphs(self, dtype):
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
    return jnp.swapaxes(self, wrap_dim(dim0, self.ndim), wrap_dim(dim1, self.ndim))


@in_graphs(aten.permute.default, aten.permute_copy.default)
def permute(self, dims):
    return jnp.transpose(self, tuple(wrap_dim(d, self.ndim) for d in dims))


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
    dims = {wrap_dim(d, self.ndim) for d in dims}
    return jnp.squeeze(self, tuple(d for d in sorted(dims) if self.shape[d] == 1))


@in_graphs(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def unsqueeze(self, dim):
    return jnp.expand_dims(self, wrap_dim(dim, self.ndim + 1))


@in_graphs(aten.select.int, aten.select_copy.int)
def select(self, dim, index):
    dim = wrap_dim(dim, self.ndim)
    index = index + self.shape[dim] if index < 0 else index
    return jax.lax.index_in_dim(self, index, dim, keepdims=False)


@in_graphs(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(self, dim=0, start=None, end=None, step=1):
    dim = wrap_dim(dim, self.ndim)
    start, end, step = slice_bounds(self.shape[dim], start, end, step)
    return self[(slice(None),) * dim + (slice(start, end, step),)]


@in_graphs(aten.narrow.default)
def narrow(self, dim, start, length):
    dim = wrap_dim(dim, self.ndim)
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
    dim = wrap_dim(dim, self.ndim)
    n = self.shape[dim]
    if split_size == 0:
        return [self]
    sizes = [min(split_size, n - i) for i in range(0, n, split_size)] or [0]
    return _pieces(self, sizes, dim)


@in_graphs(aten.split_with_sizes.default, aten.split_with_sizes_copy.default)
def split_with_sizes(self, split_sizes, dim=0):
    return _pieces(self, split_sizes, wrap_dim(dim, self.ndim))


@in_graphs(aten.unbind.int, aten.unbind_copy.int)
def unbind(self, dim=0):
    dim = wrap_dim(dim, self.ndim)
    return [jax.lax.index_in_dim(self, i, dim, keepdims=False) for i in range(self.shape[dim])]


@in_graphs(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal(self, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(self, offset, wrap_dim(dim1, self.ndim), wrap_dim(dim2, self.ndim))


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
    dim = wrap_dim(dimension, self.ndim)
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


# --- sizes in graphs (static in a program) ------------------------------------------------


@in_graphs(aten.sym_size.int)
def sym_size(self, dim):
    return self.shape[wrap_dim(dim, self.ndim)]


@in_graphs(aten.sym_numel.default)
def sym_numel(self):
    return math.prod(self.shape)


@in_graphs(aten.sym_stride.int)
def sym_stride(self, dim):
    return _contiguous_strides(self.shape)[wrap_dim(dim, self.ndim)]


@in_graphs(aten.sym_storage_offset.default)
def sym_storage_offset(self):
    return 0
