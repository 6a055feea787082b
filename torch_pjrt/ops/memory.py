"""Backend primitives that work on tensors, not arrays: allocation, views, copies.

These are registered as raw PrivateUse1 kernels (``@implements``); every other op
goes through the lowering registry.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import torch
from torch._C import DispatchKey, DispatchKeySet

from torch_pjrt import random as pjrt_random
from torch_pjrt import runtime
from torch_pjrt.config import settings
from torch_pjrt.diagnostics import metrics
from torch_pjrt.modes import fused
from torch_pjrt.ops.registry import implements
from torch_pjrt.runtime.transfer import jax_dtype
from torch_pjrt.tensor import (
    _contiguous_strides,
    cast_to,
    cell_of,
    new_tensor,
    read,
    storage_cell,
    storage_size,
    write,
)

aten = torch.ops.aten
_META = DispatchKeySet(DispatchKey.Meta)


def _index(device) -> int:
    if device is None:
        return pjrt_random.current_device()
    device = torch.device(device)
    index = device.index if device.index is not None else pjrt_random.current_device()
    runtime.device(index)  # raises on an invalid ordinal
    return index


def _check_dtype(dtype: torch.dtype) -> None:
    jax_dtype(dtype)  # raises TypeError naming the dtype and platform


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


def empty_strided_tensor(shape, strides, dtype, index) -> torch.Tensor:
    _check_dtype(dtype)
    return new_tensor(shape, dtype, index, strides=strides)


@implements(aten.empty.memory_format)
def empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    dtype = dtype or torch.get_default_dtype()
    shape = tuple(size)
    if any(s < 0 for s in shape):
        raise RuntimeError(f"Trying to create tensor with negative dimension: {list(shape)}")
    if memory_format in (torch.channels_last, torch.channels_last_3d) and len(shape) in (4, 5):
        strides = torch.empty(shape, device="meta", memory_format=memory_format).stride()
        return empty_strided_tensor(shape, strides, dtype, _index(device))
    _check_dtype(dtype)
    return new_tensor(shape, dtype, _index(device))


@implements(aten.empty_strided.default)
def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return empty_strided_tensor(size, stride, dtype or torch.get_default_dtype(), _index(device))


def _meta_view(op):
    def kernel(*args, **kwargs):
        return op.redispatch(_META, *args, **kwargs)

    return kernel


def register_meta_views(implements_fn) -> None:
    """View primitives: PyTorch's Meta kernels make genuine views sharing the storage."""
    for op in (
        aten.as_strided.default,
        aten.view.default,
        aten._reshape_alias.default,
        aten.unfold.default,
        aten.view_as_real.default,
        aten.view_as_complex.default,
        aten.as_strided_.default,
    ):
        implements_fn(op)(_meta_view(op))


register_meta_views(implements)


@implements(aten.view.dtype)
def view_dtype(self, dtype):
    if dtype.itemsize != self.dtype.itemsize:
        raise NotImplementedError(
            f"pjrt: viewing a {self.dtype} tensor as {dtype} (a different element size) is "
            "not supported yet"
        )
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
        grown = new_tensor((needed // old.dtype.itemsize + 1,), old.dtype, old.index)
        if old.array is not None:
            flat = old.array.reshape(-1)
            with jax.enable_x64(True):
                cell_of(grown).array = jnp.concatenate(
                    [flat, jnp.zeros((cell_of(grown).size - flat.size,), flat.dtype)]
                )
        storage = grown.untyped_storage()
    return _point_at(self, storage, offset, shape, strides)


def _host_read(t: torch.Tensor) -> jax.Array:
    """t's value, about to be copied to the host (what fused mode recorded runs first)."""
    if settings.mode == "fused":
        fused.flush_all("host read")
    return read(t)


def _to_device(value: jax.Array, index: int) -> jax.Array:
    return jax.device_put(value, runtime.device(index))


def _host_value(src: torch.Tensor, dtype: torch.dtype, shape, index: int) -> jax.Array:
    """A CPU tensor as a JAX array on pjrt:index, cast and broadcast to dtype and shape."""
    value = runtime.from_host(src.contiguous(), runtime.device(index))
    return cast_to(value, dtype, shape, index)


def _value_on(src: torch.Tensor, dtype: torch.dtype, shape, index: int) -> jax.Array:
    """src's value on pjrt:index (from the host or another device), cast and broadcast;
    pending in fused mode when src is on the same device."""
    if src.device.type != "pjrt":
        return _host_value(src, dtype, shape, index)
    if (src.device.index or 0) != index:
        metrics.count("transfers_device_to_device")
        return cast_to(_to_device(read(src), index), dtype, shape, index)
    return cast_to(read(src, settings.mode == "fused"), dtype, shape, index)


@implements(aten.copy_.default)
def copy_(self, src, non_blocking=False):
    if self.device.type == "pjrt":
        write(self, _value_on(src, self.dtype, self.shape, self.device.index or 0))
        return self
    # pjrt -> cpu (or another backend): bring the source to the host first
    host = runtime.to_host(_host_read(src), src.dtype)
    return self.copy_(host)


@implements(aten._copy_from.default)
def _copy_from(self, dst, non_blocking=False):
    return copy_(dst, self, non_blocking)


@implements(aten._copy_from_and_resize.default)
def _copy_from_and_resize(self, dst):
    if tuple(dst.shape) != tuple(self.shape):
        dst.resize_(self.shape)
    return copy_(dst, self)


@implements(aten._to_copy.default)
def _to_copy(
    self,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    non_blocking=False,
    memory_format=None,
):
    dtype = dtype or self.dtype
    target = torch.device(device) if device is not None else self.device
    strides = _copy_strides(self, memory_format)
    if target.type == "pjrt":
        _check_dtype(dtype)
        index = _index(target)
        value = _value_on(self, dtype, self.shape, index)
        if strides is None:
            return new_tensor(self.shape, dtype, index, value)
        order = _memory_order(strides)  # the value laid out as the strides say
        value = fused.apply(_in_memory_order(order), (value,), index, "layout")
        return new_tensor(self.shape, dtype, index, value, strides, size=self.numel())
    # to the CPU (or another backend)
    host = runtime.to_host(_host_read(self), self.dtype)
    if host.dtype != dtype or target.type != "cpu":
        host = host.to(dtype=dtype, device=target)
    if strides is not None:
        host = torch.empty_strided(host.shape, strides, dtype=host.dtype).copy_(host)
    if pin_memory:
        host = host.pin_memory()
    return host


def _copy_strides(src: torch.Tensor, memory_format):
    """The strides of a copy of ``src`` as PyTorch lays it out for ``memory_format``
    (``preserve_format``: src's own when they are dense and non-overlapping), or None
    when that is plain row-major."""
    if memory_format in (None, torch.preserve_format) and src.is_contiguous():
        return None
    if memory_format == torch.contiguous_format:
        return None
    fmt = torch.preserve_format if memory_format is None else memory_format
    strides = torch.empty_like(src, device="meta", memory_format=fmt).stride()
    return None if strides == _contiguous_strides(tuple(src.shape)) else strides


def _memory_order(strides) -> tuple:
    """Dimensions from the outermost in memory to the innermost."""
    return tuple(sorted(range(len(strides)), key=lambda d: -strides[d]))


@functools.lru_cache(maxsize=256)
def _in_memory_order(order: tuple):
    return jax.jit(lambda x: jnp.transpose(x, order).reshape(-1))


@implements(aten._local_scalar_dense.default)
def _local_scalar_dense(self):
    value = runtime.to_host(_host_read(self), self.dtype)
    return value.item()


@implements(aten._has_compatible_shallow_copy_type.default)
def _has_compatible_shallow_copy_type(self, from_):
    """CPU and pjrt dense tensors can take each other's metadata (``param.data = t``).

    NOTE: PyTorch's own check knows only its built-in dense backends. Without this,
    ``module.to("pjrt")`` makes new Parameter objects instead of moving the old ones,
    which unties shared weights (a language model's embedding and output layer) and
    leaves optimizers built before the move holding CPU tensors.
    """
    return (
        self.layout == torch.strided
        and from_.layout == torch.strided
        and {self.device.type, from_.device.type} <= {"cpu", "pjrt"}
    )


@implements(aten._assert_async.default)
def _assert_async(self):
    # NOTE: checked at once (a host sync), as CPU PyTorch does
    if not _local_scalar_dense(self):
        raise RuntimeError("Expected Tensor with single nonzero value, but got zero")


@implements(aten._assert_async.msg)
def _assert_async_msg(self, assert_msg):
    if not _local_scalar_dense(self):
        raise RuntimeError(assert_msg)


@implements(aten.is_pinned.default)
def is_pinned(self, device=None):
    return False


def _pin_memory(self, device=None):
    """Pinned host memory: PJRT stages host<->device copies itself, so a pinned CPU
    tensor is an ordinary CPU copy (what ``pin_memory()`` returns must not alias)."""
    return self.clone()


def _is_pinned_cpu(self, device=None):
    return False


def register_host_pinning(lib) -> None:
    """``pin_memory()`` on CPU tensors with pjrt as the accelerator.

    NOTE: PyTorch asks the PrivateUse1 hooks for a pinned-memory allocator, which the
    pure-Python hooks cannot provide; these CPU kernels answer instead.
    """
    lib.impl("_pin_memory", _pin_memory, "CPU")
    lib.impl("is_pinned", _is_pinned_cpu, "CPU")


_storage_resize = torch.UntypedStorage.resize_


def _resize_storage(storage: torch.UntypedStorage, nbytes: int):
    """``UntypedStorage.resize_`` for pjrt storages: free the device buffer (0 bytes) and
    have it back (the storage's size), as FSDP2 does with its unsharded parameters
    between uses. The buffer comes back as zeros; its values were freed. The storage
    keeps reporting its full size (``nbytes()``), since only C++ can change that."""
    if storage.device.type != "pjrt":
        return _storage_resize(storage, nbytes)
    cell = storage_cell(storage)
    if cell is None or nbytes not in (0, storage.nbytes()):
        raise RuntimeError(
            f"pjrt: a storage can be resized to 0 bytes (freeing its device memory) or "
            f"back to its size ({storage.nbytes()} bytes), not to {nbytes}: resize the "
            "tensor instead (Tensor.resize_ makes a new storage when it grows)"
        )
    if nbytes == 0:
        cell.array = None
    return storage


def register_storage_resize() -> None:
    """Make ``UntypedStorage.resize_`` work for pjrt storages.

    NOTE: PyTorch sends a PrivateUse1 storage's resize to the backend hooks
    (``resizePrivateUse1Bytes``), which a backend registered from Python cannot
    implement; the method is wrapped instead, for pjrt storages only.
    """
    if torch.UntypedStorage.resize_ is _storage_resize:
        torch.UntypedStorage.resize_ = _resize_storage


@implements(aten.record_stream.default)
def record_stream(self, s):
    return None


def storage_bytes(t: torch.Tensor) -> int:
    cell = cell_of(t)
    return cell.size * cell.dtype.itemsize


__all__ = ["empty_strided_tensor", "storage_bytes"]
