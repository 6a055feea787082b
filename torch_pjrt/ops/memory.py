"""Backend primitives that work on tensors, not arrays: allocation, copies, host reads,
host pinning and storage resizing (views, ``set_`` and ``resize_`` are in ``views.py``).

These are registered as raw PrivateUse1 kernels (``@implements``); every other op
goes through the lowering registry. In traced graphs copies are functions of values
(``lowers_in_graphs``, below), and so are factories (``creation.py``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._C import DispatchKey

from torch_pjrt import runtime
from torch_pjrt.config import settings
from torch_pjrt.device import random as pjrt_random
from torch_pjrt.device.tensor import (
    _contiguous_strides,
    argument,
    cast_to,
    cell_of,
    copy_to,
    new_tensor,
    storage_cell,
    write,
)
from torch_pjrt.modes import fused
from torch_pjrt.ops.registry import implements
from torch_pjrt.ops.registry import lowers_in_graphs as in_graphs
from torch_pjrt.runtime import events as metrics
from torch_pjrt.runtime import executor, transfer
from torch_pjrt.runtime.transfer import jax_dtype

aten = torch.ops.aten


def device_index(device) -> int:
    """The index of a factory's ``device=`` (the current device when None), checked."""
    if device is None:
        return pjrt_random.current_device()
    index = pjrt_random.index_of(device)
    runtime.device(index)  # raises on an invalid ordinal
    return index


def check_dtype(dtype: torch.dtype) -> None:
    """Raise a TypeError naming ``dtype`` and the platform when the platform lacks it."""
    jax_dtype(dtype)


def empty_strided_tensor(shape, strides, dtype, index) -> torch.Tensor:
    check_dtype(dtype)
    return new_tensor(shape, dtype, index, strides=strides)


@implements(aten.empty.memory_format)
def empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    dtype = dtype or torch.get_default_dtype()
    shape = tuple(size)
    negative = [s for s in shape if s < 0]
    if negative:  # (CPU PyTorch's words)
        raise RuntimeError(
            f"Trying to create tensor with negative dimension {negative[0]}: {list(shape)}"
        )
    if memory_format in (torch.channels_last, torch.channels_last_3d) and len(shape) in (4, 5):
        strides = torch.empty(shape, device="meta", memory_format=memory_format).stride()
        return empty_strided_tensor(shape, strides, dtype, device_index(device))
    check_dtype(dtype)
    return new_tensor(shape, dtype, device_index(device))


@implements(aten.empty_strided.default)
def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = dtype or torch.get_default_dtype()
    return empty_strided_tensor(size, stride, dtype, device_index(device))


def _host_read(t: torch.Tensor, kept: bool = False) -> jax.Array:
    """t's value, about to be copied to the host (what fused mode recorded runs first).
    A copy that waits keeps nothing, so t's storage keeps owning its array; one that
    does not wait (``kept``) reads the array later, so the storage gives it up (a
    program must not donate its buffer before the copy has read it)."""
    if settings.mode == "fused":
        fused.flush_all("host read")
    value = argument(t)
    if kept and value is cell_of(t)._value:
        cell_of(t).give_up()
    return value


def _to_device(value: jax.Array, index: int) -> jax.Array:
    return jax.device_put(value, runtime.device(index))


def _host_value(src: torch.Tensor, dtype: torch.dtype, shape, index: int) -> jax.Array:
    """A CPU tensor as a JAX array on pjrt:index, cast and broadcast to dtype and shape."""
    if fused.capturing:
        fused.capture_refuse(index, "copies a CPU tensor to the device")
    value = runtime.from_host(src.contiguous(), runtime.device(index))
    return cast_to(value, dtype, shape, index)


def _value_on(src: torch.Tensor, dtype: torch.dtype, shape, index: int) -> jax.Array:
    """A new array of src's value on pjrt:index, cast and broadcast (pending in fused
    mode when src is on the same device). Always a copy, as on CUDA: src's storage keeps
    owning its own array and the destination owns this one (tensor.Cell)."""
    if src.device.type != "pjrt":
        return _host_value(src, dtype, shape, index)
    if (src.device.index or 0) != index:
        metrics.count("transfers_device_to_device")
        return cast_to(_to_device(argument(src), index), dtype, shape, index)
    value = argument(src, settings.mode == "fused")
    if value is cell_of(src)._value:  # src's own array (not a gather of a view): copy it
        return copy_to(value, dtype, shape, index)
    return cast_to(value, dtype, shape, index)


@implements(aten.copy_.default)
def copy_(self, src, non_blocking=False):
    if self.device.type == "pjrt":
        write(self, _value_on(src, self.dtype, self.shape, self.device.index or 0), owned=True)
        return self
    # pjrt -> cpu (or another backend): bring the source to the host first
    if (
        non_blocking
        and self.device.type == "cpu"
        and self.dtype == src.dtype
        and self.shape == src.shape
        and self.is_contiguous()
    ):
        transfer.to_host_async(_host_read(src, kept=True), src.dtype, self)
        return self
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
        check_dtype(dtype)
        index = device_index(target)
        value = _value_on(self, dtype, self.shape, index)
        if strides is None:
            return new_tensor(self.shape, dtype, index, value, owned=True)
        order = _memory_order(strides)  # the value laid out as the strides say
        value = fused.apply(_in_memory_order(order), (value,), index, "layout")
        return new_tensor(self.shape, dtype, index, value, strides, self.numel(), owned=True)
    # to the CPU (or another backend)
    if non_blocking and target.type == "cpu" and dtype == self.dtype and strides is None:
        return transfer.to_host_async(_host_read(self, kept=True), dtype)
    host = runtime.to_host(_host_read(self), self.dtype)
    if host.dtype != dtype or target.type != "cpu":
        host = host.to(dtype=dtype, device=target)
    if strides is not None:
        host = torch.empty_strided(host.shape, strides, dtype=host.dtype).copy_(host)
    if pin_memory:
        host = host.pin_memory()
    return host


@implements(aten.clone.default)
def clone(self, memory_format=None):
    # (ATen's composite clone is empty_like, then copy_: a new storage and a write into
    # it; a copy on the same device is _to_copy's, in the layout memory_format gives)
    return _to_copy(self, memory_format=memory_format)


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


_in_memory_order = executor.helper(
    "layout", lambda order: lambda x: jnp.transpose(x, order).reshape(-1), maxsize=256
)


# --- copies in graphs ---------------------------------------------------------------------


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


# Host pinning. PyTorch's CPU kernels ask the current accelerator for a pinned-memory
# allocator (``getPinnedMemoryAllocator``) and whether a pointer is pinned
# (``isPinnedPtr``); once pjrt is registered that is pjrt, on every machine (PyTorch
# asks PrivateUse1 first), and ``torch._C._acc.PrivateUse1Hooks`` lets Python implement
# neither: ``pin_memory()`` raises. The CPU kernels stay PyTorch's: these kernels sit on
# BackendSelect, which every call passes through just above the backend keys, answer the
# calls that pin for pjrt and hand every other call down unchanged.
_BELOW_BACKEND_SELECT = torch._C._dispatch_keyset_full_after(DispatchKey.BackendSelect)
_PINNED = "_pjrt_pinned"  # set on the Python object of a storage pin_memory() made

# PyTorch's own choice of accelerator, where pjrt's registration does not override it
# (the order of at::getAccelerator after PrivateUse1)
_BUILTIN_ACCELERATORS = (
    ("mtia", lambda: torch.mtia.is_available()),
    ("cuda", lambda: torch.cuda.is_available()),
    ("xpu", lambda: torch.xpu.is_available()),
    ("mps", lambda: torch.backends.mps.is_available()),
)


def _dense_cpu(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.layout == torch.strided and not t.is_nested


def _builtin_accelerator() -> str | None:
    """The built-in accelerator usable here (CUDA, ...), which PyTorch would pin for had
    pjrt not registered; None when there is none."""
    for name, available in _BUILTIN_ACCELERATORS:
        if available():
            return name
    return None


def _pin_memory_kernel(keyset, self, device=None):
    """``_pin_memory`` on BackendSelect. With pjrt as the accelerator (no ``device``, no
    built-in accelerator usable; or ``device="pjrt"``), a pinned tensor is an ordinary CPU
    copy: PJRT stages host<->device transfers itself. With a built-in one usable (a CUDA
    program on a machine that has torch_pjrt), that one pins, as PyTorch would without
    pjrt; every other call runs PyTorch's own kernel."""
    below = keyset & _BELOW_BACKEND_SELECT
    if not _dense_cpu(self) or (device is not None and torch.device(device).type != "pjrt"):
        return aten._pin_memory.default.redispatch(below, self, device)
    builtin = _builtin_accelerator() if device is None else None
    if builtin is None:
        pinned = self.clone()  # what pin_memory() returns must not alias its input
    else:
        pinned = aten._pin_memory.default.redispatch(below, self, torch.device(builtin))
    # NOTE: is_pinned() without a device asks pjrt's hooks, which know no pinned pointer:
    # the mark lets it answer True for what pin_memory() returned (so pin_memory() of a
    # pinned tensor returns it, as PyTorch's contract says)
    setattr(pinned.untyped_storage(), _PINNED, True)
    return pinned


def _is_pinned_kernel(keyset, self, device=None):
    """``is_pinned`` on BackendSelect: PyTorch's answer, or True for a tensor whose storage
    ``pin_memory()`` made with pjrt as the target."""
    pinned = aten.is_pinned.default.redispatch(keyset & _BELOW_BACKEND_SELECT, self, device)
    if pinned or not _dense_cpu(self):
        return pinned
    if device is not None and torch.device(device).type != "pjrt":
        return False
    return getattr(self.untyped_storage(), _PINNED, False)


def register_host_pinning(lib) -> None:
    """``pin_memory()`` and ``is_pinned()`` of CPU tensors with pjrt as the accelerator,
    on BackendSelect (the CPU, CUDA and Meta kernels stay PyTorch's)."""
    lib.impl("_pin_memory", _pin_memory_kernel, "BackendSelect", with_keyset=True)
    lib.impl("is_pinned", _is_pinned_kernel, "BackendSelect", with_keyset=True)


_storage_resize = torch.UntypedStorage.resize_  # PyTorch's, a C method


def _resize_pjrt_storage(storage: torch.UntypedStorage, cell, nbytes: int):
    """Free the device buffer (0 bytes) or have it back (the storage's size), as FSDP2 does
    with its unsharded parameters between uses. The buffer comes back as zeros; its values
    were freed. The storage keeps reporting its full size (``nbytes()``), since only C++
    can change that."""
    if nbytes not in (0, storage.nbytes()):
        raise RuntimeError(
            f"pjrt: a storage can be resized to 0 bytes (freeing its device memory) or "
            f"back to its size ({storage.nbytes()} bytes), not to {nbytes}: resize the "
            "tensor instead (Tensor.resize_ makes a new storage when it grows)"
        )
    if nbytes == 0:
        cell.array = None
    return storage


def _resize_or(pytorchs, storage, args, kwargs):
    """A pjrt storage's resize to one int, or ``pytorchs(*args, **kwargs)`` for anything
    else, wrong arguments included, so that its results and errors are PyTorch's own."""
    cell = storage_cell(storage) if isinstance(storage, torch.UntypedStorage) else None
    if cell is None or kwargs or len(args) != 1 or not _is_int(args[0]):
        return pytorchs(*args, **kwargs)
    return _resize_pjrt_storage(storage, cell, int(args[0]))


@functools.wraps(_storage_resize)
def _resize_unbound(storage, *args, **kwargs):
    return _resize_or(functools.partial(_storage_resize, storage), storage, args, kwargs)


class _StorageResize:
    """``UntypedStorage.resize_``. A descriptor, so that PyTorch's method is reached as the
    caller reached this one, bound or through the class (its errors name the class so)."""

    def __get__(self, storage, owner=None):
        if storage is None:
            return _resize_unbound
        pytorchs = _storage_resize.__get__(storage, owner)

        @functools.wraps(pytorchs)
        def resize_(*args, **kwargs):
            return _resize_or(pytorchs, storage, args, kwargs)

        return resize_


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def register_storage_resize() -> None:
    """Make ``UntypedStorage.resize_`` work for pjrt storages; idempotent.

    NOTE: PyTorch sends a PrivateUse1 storage's resize to the backend hooks
    (``resizePrivateUse1Bytes``), which ``torch._C._acc.PrivateUse1Hooks`` does not let
    Python implement, and the method calls no operator a kernel could serve: the method
    itself is replaced, for pjrt storages only (docs/internals.md, "Import hygiene").
    """
    if torch.UntypedStorage.resize_ is _storage_resize:
        torch.UntypedStorage.resize_ = _StorageResize()


@implements(aten.record_stream.default)
def record_stream(self, s):
    return None


__all__ = ["empty_strided_tensor"]
