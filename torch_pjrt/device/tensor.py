"""The device tensor: PyTorch owns the view metadata, a storage cell owns the data.

A pjrt tensor is a real PrivateUse1 TensorImpl (sizes, strides, storage offset,
``_base``, version counter: all PyTorch's own). Its StorageImpl has no bytes; the
data is a JAX array kept in a :class:`Cell` hung on the storage's Python object,
which lives exactly as long as the StorageImpl. Every view of a storage shares its
cell, so a write through any view (a scatter into the cell) is seen by all.
"""

from __future__ import annotations

import ctypes
import functools
import math
import struct
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_pjrt import runtime
from torch_pjrt.config import settings
from torch_pjrt.modes import fused
from torch_pjrt.modes.fused import Pending
from torch_pjrt.runtime import executor
from torch_pjrt.runtime.transfer import jax_dtype
from torch_pjrt.runtime.transfer import torch_dtype as _torch_dtype

__all__ = [
    "Cell",
    "argument",
    "cell_of",
    "export",
    "new_tensor",
    "read",
    "read_lazy",
    "whole",
    "write",
    "wrap",
]

_ATTR = "_pjrt_cell"


class Cell:
    """The data of one storage: ``size`` elements of ``dtype`` on JAX device ``index``.

    ``array`` is None until first written (fresh ``empty`` storage), otherwise a JAX
    array holding the storage's elements in row-major order (any shape whose size is
    ``size``; usually the shape of the tensor that made it).

    ``owned``: the cell is the only holder of its array, which a program made for it
    (an op's result, a host transfer) and which nothing has read out since except as a
    program's argument (:func:`argument`). Only an owned array may be donated: when an
    owned cell is overwritten while a fused recording holds its old array as an input,
    the recording may give that buffer to XLA to reuse (:meth:`own`, ``fused.released``);
    a compiled graph donates the buffer of an owned input it updates. Ownership is
    decided here, where values are stored and read, never from reference counts.
    """

    __slots__ = ("_value", "dtype", "index", "size", "owned", "__weakref__")

    def __init__(self, size: int, dtype: torch.dtype, index: int, array=None, owned=False):
        self.size = size
        self.dtype = dtype
        self.index = index
        self._value = array
        self.owned = owned
        if fused.capturing:  # made during a graph capture: unwritten when it ends
            fused.capture_touch(self, None, made=True)

    @property
    def array(self) -> jax.Array | None:
        """The storage's array; a pending value (fused mode) is computed first."""
        v = self._value
        if v.__class__ is Pending:
            v = self._value = v.concrete()  # (a capture refuses to: modes.capture)
        if fused.capturing and v is not None:  # a capture cannot read it on the host
            fused.capture_refuse(self.index)
        return v

    @array.setter
    def array(self, value) -> None:
        """Store a value the cell does not own (it may be held elsewhere too)."""
        if fused.capturing:
            fused.capture_touch(self, self._value)
        if self.owned:
            self._release()
        self._value = value  # an array, or a Pending in fused mode
        self.owned = False

    def own(self, value) -> None:
        """Store a value made for this cell alone (a program's fresh result)."""
        if fused.capturing:
            fused.capture_touch(self, self._value)
        if self.owned:
            self._release()
        self._value = value
        self.owned = True

    def lazy(self):
        """The storage's value, pending values left pending; under a graph capture of its
        device, the pending input that stands for it (``modes.capture``)."""
        v = self._value
        if v.__class__ is Pending and v.value is not None:  # computed: its array
            v = self._value = v.value  # (which later programs read, and checks mark)
        if fused.capturing:
            if v.__class__ is Pending:  # recorded (in this capture, or before it)
                return v
            v = fused.capture_input(self, v)
        return v

    def give_up(self) -> None:
        """The array is being read out to be kept elsewhere: no longer the only holder."""
        self.owned = False

    def _release(self) -> None:
        old = self._value
        if old.__class__ is Pending:
            old = old.value
        if old is not None:
            fused.released(old, self.index)

    def materialize(self, lazy: bool = False):
        """The storage's value, zeros if it was never written (pending if ``lazy``)."""
        v = self.lazy() if lazy else self._value
        if v is None:
            program = _zeros_program(self.size, self.dtype, self.index)
            self.own(fused.apply(program, (), self.index, "zeros"))
            v = self._value
        return v if lazy else self.array


def _make_zeros(size: int, dtype: torch.dtype, index: int):
    return lambda: jnp.zeros((size,), jax_dtype(dtype))


# NOTE: a compiled program, because an eager ``jnp.zeros`` costs about 200 us; a fresh
# ``empty`` then ``fill_`` needs one
_zeros_program = executor.helper("zeros", _make_zeros, placed=lambda size, dtype, index: index)


def storage_cell(storage: torch.UntypedStorage) -> Cell | None:
    """The cell of a pjrt storage; None for any other storage."""
    return getattr(storage, _ATTR, None)


def cell_of(t: torch.Tensor) -> Cell:
    storage = t.untyped_storage()
    try:
        return getattr(storage, _ATTR)
    except AttributeError:
        return _adopt(t, storage)


# the fake addresses of the C++ allocator's storages (device/guard.cpp), below those of
# the tensors made here (_next_address)
_ALLOCATED = (0x7D00_0000_0000_0000, 0x7E00_0000_0000_0000)
# the cells of storages handed out as DLPack capsules (device/interop.py), by their fake
# address: a tensor PyTorch makes from such a capsule shares the cell
_exported: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def export(t: torch.Tensor) -> None:
    """``t``'s storage is handed out as a DLPack capsule: a tensor PyTorch makes from it
    (at the same fake address) shares its cell."""
    _exported[t.untyped_storage().data_ptr()] = cell_of(t)


def _adopt(t: torch.Tensor, storage: torch.UntypedStorage) -> Cell:
    """The cell of a storage PyTorch's own constructor made through the C++ allocator
    (``torch.UntypedStorage(n, device="pjrt")``, ``tensor.set_(storage)``): made on
    first use, unwritten (its elements read as zeros, as a fresh ``empty``'s), of the
    dtype of the tensor that uses it first. A storage PyTorch made from a DLPack capsule
    of a pjrt tensor (:func:`export`) shares that tensor's cell."""
    address = storage.data_ptr()
    if t.device.type == "pjrt":
        cell = _exported.get(address)
        if cell is None and _ALLOCATED[0] <= address < _ALLOCATED[1]:
            cell = Cell(storage.nbytes() // t.element_size(), t.dtype, t.device.index)
        if cell is not None:
            setattr(storage, _ATTR, cell)
            return cell
    raise RuntimeError(f"tensor on {t.device} has no pjrt data (it was not made by torch_pjrt)")


# --- making tensors ---------------------------------------------------------------

_DL_CODES = {"b": 6, "i": 0, "u": 1, "f": 2, "c": 5, "V": 4}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", _DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


# NOTE: a capsule is one malloc'd block: the struct, then shape and strides. Each
# layout (shape, strides, dtype) has one block, made once and never freed: a new tensor
# writes its fake address and device index into it and hands it to from_dlpack, which
# copies what it needs. The struct's deleter is null, so PyTorch calls nothing when
# the storage dies (it reads the deleter field then, which is why the block lives on)
# and no Python callback runs inside the C++ destructor. Past _SHARED_BLOCKS layouts
# (shape-polymorphic programs), each tensor gets its own block with libc's free as its
# deleter. The shared block alone saves about 0.9 us per tensor (malloc, packing).
_libc = ctypes.CDLL(None)
_malloc = _libc.malloc
_malloc.restype = ctypes.c_void_p
_malloc.argtypes = [ctypes.c_size_t]
_FREE = ctypes.cast(_libc.free, ctypes.c_void_p).value
_HEADER = ctypes.sizeof(_DLManagedTensor)
# data, device type and id, ndim, dtype code/bits/lanes, shape, strides, byte offset,
# manager context, deleter: the DLManagedTensor layout, packed in one go
_HEADER_FORMAT = "<QiiiBBHQQQQQ"
assert struct.calcsize(_HEADER_FORMAT) == _HEADER
_memmove = ctypes.memmove
_from_dlpack = torch._C._from_dlpack


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


# NOTE: pjrt storages get fake, unique, never-dereferenced data pointers, the way
# CUDA storages hold device addresses the host never touches. Storage-level code
# (torch.save, safetensors, identity checks by data_ptr) needs a non-null pointer and
# the storage's true byte size. The range is far above any host mapping.
_next_address = [0x7E00_0000_0000_0000]
# held while a tensor takes an address and, with a shared block, while from_dlpack reads
# it (reentrant: a finalizer run by a garbage collection inside from_dlpack may make a
# tensor, after the block has been read)
_capsule_lock = threading.RLock()
_SHARED_BLOCKS = 1 << 16
_shared_blocks_made = [0]


@functools.cache
def _dl_dtype(dtype: torch.dtype) -> tuple[int, int]:
    if dtype == torch.bfloat16:
        return 4, 16
    return _DL_CODES[np.dtype(jax_dtype(dtype)).kind], dtype.itemsize * 8


def _handle(index: int, shape, strides, dtype: torch.dtype, nbytes: int) -> torch.Tensor:
    """An empty PrivateUse1 TensorImpl on ``pjrt:index`` with a storage of ``nbytes``.

    NOTE: DLPack's ``kDLExtDev`` maps to PrivateUse1 with a device index, so a
    data-less DLPack capsule is how pure Python makes a tensor on any ``pjrt:i``
    (``torch._C._acc.create_empty_tensor`` only makes ``pjrt:0`` with 0 bytes).
    """
    return _from_template(_template(tuple(shape), tuple(strides), dtype), index, nbytes)


@functools.lru_cache(maxsize=4096)
def _template(shape: tuple, strides: tuple, dtype: torch.dtype) -> tuple:
    """What a capsule of this layout needs besides its address and device: (block
    size, offset of the strides in the block, ndim, the struct's pack, dtype code and
    bits, shape + strides, the shared block or None)."""
    ndim = len(shape)
    code, bits = _dl_dtype(dtype)
    size, strides_at, pack = _HEADER + 16 * ndim, _HEADER + 8 * ndim, _packer(ndim)
    shared = None
    if _shared_blocks_made[0] < _SHARED_BLOCKS:
        block = _malloc(size)
        if block:
            _shared_blocks_made[0] += 1
            _memmove(
                block,
                pack(0, 12, 0, ndim, code, bits, 1, block + _HEADER, block + strides_at, 0, 0,
                     0, *shape, *strides),
                size,
            )  # fmt: skip
            shared = (
                block,
                ctypes.c_uint64.from_address(block),  # data
                ctypes.c_int32.from_address(block + 12),  # device index
            )
    return size, strides_at, ndim, pack, code, bits, shape + strides, shared


def _from_template(template: tuple, index: int, nbytes: int) -> torch.Tensor:
    size, strides_at, ndim, pack, code, bits, dims, shared = template
    with _capsule_lock:
        address = _next_address[0]  # the storage's fake data pointer (above)
        _next_address[0] = address + ((max(nbytes, 1) + 255) & ~255)
        if shared is not None:
            block, data, device = shared
            data.value = address
            device.value = index
            return _from_dlpack(_capsule_new(block, b"dltensor", None))
    block = _malloc(size)
    if not block:
        raise MemoryError("pjrt: out of host memory for a tensor handle")
    packed = pack(
        address, 12, index, ndim, code, bits, 1, block + _HEADER, block + strides_at, 0, 0,
        _FREE, *dims,
    )  # fmt: skip
    _memmove(block, packed, size)
    return _from_dlpack(_capsule_new(block, b"dltensor", None))


@functools.cache
def _packer(ndim: int):
    """Packs a whole capsule block: the DLManagedTensor, then shape and strides."""
    return struct.Struct(f"{_HEADER_FORMAT}{2 * ndim}q").pack


def _contiguous_strides(shape) -> tuple:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(strides))


def storage_size(shape, strides) -> int:
    """Elements a strided view needs from offset 0."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(shape, strides))


@functools.lru_cache(maxsize=4096)
def _dense_layout(shape: tuple) -> tuple:
    """(strides, elements) of a contiguous tensor of this shape."""
    strides = _contiguous_strides(shape)
    return strides, storage_size(shape, strides)


def new_tensor(
    shape, dtype: torch.dtype, index: int, array=None, strides=None, size=None, owned=False
) -> torch.Tensor:
    """A new pjrt tensor (contiguous unless ``strides``) with its own storage cell of
    ``size`` elements (default: just what the view needs); ``owned``: ``array`` was made
    for it alone (see :class:`Cell`)."""
    shape = tuple(shape)
    if strides is None:
        strides, needed = _dense_layout(shape)
    else:
        strides = tuple(strides)
        needed = storage_size(shape, strides)
    size = needed if size is None else size
    if index:  # pjrt:LOCAL_RANK may be another name of this process's pjrt:0
        index = runtime.canonical_index(index)
    t = _handle(index, shape, strides, dtype, size * dtype.itemsize)
    setattr(t.untyped_storage(), _ATTR, Cell(size, dtype, index, array, owned))
    return t


def wrap(array: jax.Array, index: int, owned: bool = False) -> torch.Tensor:
    """A new pjrt tensor holding ``array`` (every eager op's result: kept lean);
    ``owned``: a program made ``array`` for this tensor alone (see :class:`Cell`)."""
    layout = _WRAP_LAYOUTS.get((array.shape, array.dtype))
    if layout is None:
        layout = _wrap_layout(array.shape, array.dtype)
    template, dtype, size, nbytes = layout
    if index:
        index = runtime.canonical_index(index)
    t = _from_template(template, index, nbytes)
    setattr(t.untyped_storage(), _ATTR, Cell(size, dtype, index, array, owned))
    return t


_WRAP_LAYOUTS: dict = {}


def _wrap_layout(shape: tuple, np_dtype) -> tuple:
    """(capsule template, torch dtype, elements, bytes) of a dense array, cached."""
    dtype = _torch_dtype(np_dtype)
    strides, size = _dense_layout(shape)
    if len(_WRAP_LAYOUTS) >= 4096:
        _WRAP_LAYOUTS.clear()
    layout = _WRAP_LAYOUTS[(shape, np_dtype)] = (
        _template(shape, strides, dtype),
        dtype,
        size,
        size * dtype.itemsize,
    )
    return layout


# --- reading and writing views ------------------------------------------------------


def _is_contiguous(shape, strides) -> bool:
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _flat_index(shape, strides):
    idx = jnp.zeros(shape, dtype=jnp.int64)
    for dim, (size, stride) in enumerate(zip(shape, strides)):
        if size > 1 and stride != 0:
            idx = idx + jax.lax.broadcasted_iota(jnp.int64, shape, dim) * stride
    return idx


def _box_dims(shape, strides):
    """The dims that matter of a strided view (size > 1, stride > 0) sorted by stride,
    largest first, with their sizes and strides: ``(order, sizes, steps)``, when each
    stride divides the one before and each dim fits in the ratio (the view is a box of
    a row-major layout: no overlap), else None."""
    dims = [d for d in range(len(shape)) if shape[d] > 1 and strides[d] > 0]
    if not dims:
        return None
    order = sorted(dims, key=lambda d: -strides[d])
    sizes = [shape[d] for d in order]
    steps = [strides[d] for d in order]
    for i in range(1, len(order)):
        if steps[i - 1] % steps[i] or sizes[i] > steps[i - 1] // steps[i]:
            return None
    return tuple(order), tuple(sizes), tuple(steps)


def _box(dims):
    """How to read a strided view as slices, reshapes and a transpose rather than a
    gather, when it is one: ``(order, sizes, strides, reach, pad)`` or None.

    The view's box dims (``dims``, from :func:`_box_dims`) read as a prefix of each dim
    of a row-major box whose dim sizes are the ratios of consecutive strides. The box
    spans ``sizes[0] * strides[0]`` elements from the offset: the ``reach`` elements the
    view touches, then ``pad`` zeros. A view that touches few of the elements it spans
    (a column of a wide matrix) is gathered too: reading the span would cost more."""
    order, sizes, steps = dims
    reach = sum((n - 1) * st for n, st in zip(sizes, steps)) + 1
    span = sizes[0] * steps[0]
    if span > 4 * math.prod(sizes):
        return None
    return order, sizes, steps, reach, span - reach


def _static_box(size: int, offset: int, dims):
    """Where a box view (:func:`_box_dims`) at a known ``offset`` lies in its storage of
    ``size`` elements laid out as a row-major array: ``(layout, starts)``, the storage's
    shape (its first dim, then the ratios of consecutive strides, then the smallest
    stride where it is not 1) and the view's first element in it, or None when the view
    wraps around a dim of that layout (then it is read through its span).

    NOTE: a captured graph's offsets are numbers of its program (``capture``): a view
    read or written there is one slice of a reshape, without the span's dynamic slice,
    padding and reshapes of the general case (a decode step reads ~30 views a layer)."""
    _, sizes, steps = dims
    if size % steps[0]:
        return None
    layout = (size // steps[0],) + tuple([a // b for a, b in zip(steps, steps[1:])])
    starts, rest = [], offset
    for step in steps:
        starts.append(rest // step)
        rest %= step
    if steps[-1] != 1:
        layout += (steps[-1],)
        starts.append(rest)
    if any(s + n > d for s, n, d in zip(starts, sizes, layout)):
        return None
    return layout, tuple(starts)


def _span(flat, offset, box):
    """The ``box`` of a view at ``offset`` of ``flat``, as its row-major block."""
    order, sizes, steps, reach, pad = box
    span = jax.lax.dynamic_slice(flat, (offset,), (reach,))
    if pad:
        span = jnp.concatenate([span, jnp.zeros((pad,), flat.dtype)])
    dims = (sizes[0],) + tuple(steps[i - 1] // steps[i] for i in range(1, len(steps)))
    return span.reshape(dims + (steps[-1],))


def _read_box(flat, offset, shape, box):
    """The view ``(shape, strides)`` at ``offset`` of ``flat`` read through ``box``."""
    sizes = box[1]
    block = _span(flat, offset, box)
    block = block[(slice(None),) + tuple(slice(0, n) for n in sizes[1:]) + (0,)]
    return _arranged(block, box[0], shape)


def _read_static(a, offset: int, shape, dims, part: bool):
    """The box view ``dims`` (:func:`_box_dims`) at a known ``offset`` of the storage's
    array ``a``: one slice of a reshape (:func:`_static_box`), or None (also when it is
    a part of the storage and not ``part``)."""
    found = _static_box(a.size, offset, dims)
    if found is None:
        return None
    layout, starts = found
    limits = tuple([s + n for s, n in zip(starts, dims[1] + (1,))])
    if limits == layout and not any(starts):  # (the whole storage)
        return _arranged(jax.lax.reshape(a, dims[1]), dims[0], shape)
    if not part:
        return None
    block = jax.lax.slice(jax.lax.reshape(a, layout), starts, limits)
    return _arranged(block, dims[0], shape)


def _arranged(block, order, shape):
    """A box's block (its first dims the view's, sorted by stride; then any size-1
    dims) as the view: its dims put in the view's order, then the size-1 dims and the
    broadcast (stride-0) ones."""
    rank = len(order)
    perm = sorted(range(rank), key=lambda i: order[i])
    if perm != list(range(rank)):
        block = jax.lax.transpose(jax.lax.reshape(block, block.shape[:rank]), perm)
    kept = sorted(order)
    full = tuple([shape[d] if d in kept else 1 for d in range(len(shape))])
    if block.shape != full:  # (lax's checks cost ~20 us a call even where nothing changes)
        block = jax.lax.reshape(block, full)
    shape = tuple(shape)
    if full == shape:
        return block
    return jax.lax.broadcast_in_dim(block, shape, tuple(range(len(shape))))


def _make_gather(shape, strides):
    numel = math.prod(shape)
    contiguous = _is_contiguous(shape, strides)
    dims = None if contiguous else _box_dims(shape, strides)
    box = None if dims is None else _box(dims)
    # NOTE: a view whose dims are permuted (a transposed key) is read through its span
    # even at a known offset, unless it is its whole storage (a weight read as W.t()):
    # measured on XLA's CPU compiler with vLLM's decode step, their static slices made
    # the step compile ~25% slower (bigger fusions) and run 2-6% slower; the other
    # views' made no difference there
    in_order = dims is not None and list(dims[0]) == sorted(dims[0])

    def static(a, offset):  # (an offset known when traced: a captured graph's)
        if not contiguous:
            return None if dims is None else _read_static(a, offset, shape, dims, in_order)
        if offset == 0 and numel == a.size:
            return jax.lax.reshape(a, shape)
        if offset + numel > a.size:
            return None
        return jax.lax.reshape(
            jax.lax.slice(jax.lax.reshape(a, (a.size,)), (offset,), (offset + numel,)), shape
        )

    if contiguous:

        def dynamic(a, offset):
            return jax.lax.dynamic_slice(a.reshape(-1), (offset,), (numel,)).reshape(shape)

    elif box is not None:  # slices, a transpose, a broadcast: no gather

        def dynamic(a, offset):
            return _read_box(a.reshape(-1), offset, shape, box)

    else:

        def dynamic(a, offset):
            return a.reshape(-1)[_flat_index(shape, strides) + offset]

    def gather(a, offset):
        if offset.__class__ is int:
            out = static(a, offset)
            if out is not None:
                return out
        return dynamic(a, offset)

    return gather


# NOTE: the storage offset is an argument of the programs, not part of their key, so
# walking a tensor (x[i] for i in range(n)) reuses one program.
_gather_fn = executor.helper("view read", _make_gather, maxsize=4096)


def _write_box(flat, v, offset, shape, box):
    """``flat`` with the view ``(shape, strides)`` at ``offset`` set to ``v``, through
    ``box`` (:func:`_box`; the view does not overlap itself): updates of slices."""
    order, reach = box[0], box[3]
    block = _span(flat, offset, box)
    part = _sorted_part(v, order, shape)
    part = jax.lax.reshape(part, part.shape + (1,))  # (the span's last dim: the smallest stride)
    block = jax.lax.dynamic_update_slice(block, part, (0,) * block.ndim)
    return jax.lax.dynamic_update_slice(flat, block.reshape(-1)[:reach], (offset,))


def _write_static(a, v, offset: int, shape, dims):
    """:func:`_write_box` at a known ``offset``, of the storage's array ``a``: one update
    of a reshape (flat, as :func:`_write_box`'s), or None."""
    found = _static_box(a.size, offset, dims)
    if found is None:
        return None
    layout, starts = found
    part = _sorted_part(v, dims[0], shape)
    if part.ndim < len(layout):  # (the layout's last dim: a smallest stride not 1)
        part = jax.lax.reshape(part, part.shape + (1,))
    block = jax.lax.dynamic_update_slice(jax.lax.reshape(a, layout), part, starts)
    return jax.lax.reshape(block, (a.size,))


def _sorted_part(v, order, shape):
    """The value ``v`` of a box view, its dims sorted as the box's."""
    kept = sorted(order)
    sizes = tuple([shape[d] for d in order])
    perm = [kept.index(d) for d in order]
    if perm != list(range(len(order))):
        v = jax.lax.transpose(jax.lax.reshape(v, tuple([shape[d] for d in kept])), perm)
    return jax.lax.reshape(v, sizes)


def _make_scatter(shape, strides):
    contiguous = _is_contiguous(shape, strides)
    dims = None if contiguous else _box_dims(shape, strides)
    box = None if dims is None else _box(dims)
    if contiguous:

        def dynamic(a, v, offset):
            return jax.lax.dynamic_update_slice(a.reshape(-1), v.reshape(-1), (offset,))

    elif box is not None:  # updates of slices: no scatter

        def dynamic(a, v, offset):
            return _write_box(a.reshape(-1), v.astype(a.dtype), offset, shape, box)

    else:

        def dynamic(a, v, offset):
            idx = (_flat_index(shape, strides) + offset).reshape(-1)
            return a.reshape(-1).at[idx].set(v.reshape(-1))

    def scatter(a, v, offset):
        if dims is not None and offset.__class__ is int:  # (a captured graph's offset)
            out = _write_static(a, v.astype(a.dtype), offset, shape, dims)
            if out is not None:
                return out
        return dynamic(a, v, offset)

    return scatter


_scatter_fn = executor.helper("view write", _make_scatter, maxsize=4096)


_COMPLEX_PARTS = {np.dtype(jnp.complex64): jnp.float32, np.dtype(jnp.complex128): jnp.float64}


def _reinterpret(a: jax.Array, dtype) -> jax.Array:
    """The bytes of ``a`` (flattened) read as ``dtype``: a dtype view of the storage."""
    a = a.reshape(-1)
    if np.dtype(a.dtype) in _COMPLEX_PARTS:  # complex: as interleaved (real, imag) parts
        a = jnp.stack([jnp.real(a), jnp.imag(a)], axis=-1).reshape(-1)
        if np.dtype(dtype) == np.dtype(a.dtype):
            return a
    if np.dtype(dtype) in _COMPLEX_PARTS:
        parts = _reinterpret(a, _COMPLEX_PARTS[np.dtype(dtype)]).reshape(-1, 2)
        return jax.lax.complex(parts[:, 0], parts[:, 1])
    if a.dtype == jnp.bool_:
        a = a.astype(jnp.uint8)
    target = jnp.uint8 if np.dtype(dtype) == np.bool_ else dtype
    src_size, dst_size = np.dtype(a.dtype).itemsize, np.dtype(target).itemsize
    if src_size < dst_size:
        a = a.reshape(-1, dst_size // src_size)
    out = jax.lax.bitcast_convert_type(a, target).reshape(-1)
    return out != 0 if target is not dtype else out


def read(t: torch.Tensor, lazy: bool = False) -> jax.Array:
    """The JAX array of a pjrt tensor's current value (its view of the storage), to keep
    or to store elsewhere: the storage gives up its ownership of the array (see
    :class:`Cell`). Programs' arguments are read with :func:`argument` instead.

    With ``lazy`` (fused mode), the value may be :class:`~torch_pjrt.modes.fused.Pending`.
    """
    cell = getattr(t.untyped_storage(), _ATTR, None)
    if cell is not None:
        cell.owned = False
    return argument(t, lazy)


def argument(t: torch.Tensor, lazy: bool = False) -> jax.Array:
    """:func:`read` for a program's argument: the array goes into a program (or a fused
    recording) and nowhere else, so the storage keeps owning it."""
    a = whole(t, lazy)
    if a is not None:
        return a
    if t.is_conj() or t.is_neg():
        return _resolve_bits(t, _read(t))
    return _read(t, lazy)


def read_lazy(t: torch.Tensor):
    """:func:`read` that leaves fused mode's pending values pending."""
    return read(t, True)


def whole(t: torch.Tensor, lazy: bool = False) -> jax.Array | None:
    """The array of a tensor that is its whole storage (the common case: nothing to
    gather, reinterpret or resolve), else None."""
    cell = getattr(t.untyped_storage(), _ATTR, None)
    if cell is None:
        return None
    array = cell.lazy() if lazy else cell.array
    return array if _is_whole(t, cell, array) else None


def _is_whole(t: torch.Tensor, cell: Cell, array) -> bool:
    return (
        array is not None
        and t.dtype == cell.dtype
        and array.shape == t.shape
        and t.storage_offset() == 0
        and t.is_contiguous()
        and not t.is_conj()
        and not t.is_neg()
    )


def read_on_device(t: torch.Tensor, lazy: bool = False) -> tuple | None:
    """(:func:`argument`'s array, device index) of a pjrt tensor, None for any other
    tensor: one look at the storage, for op calls (``t.device.type`` alone costs
    0.3 us)."""
    cell = getattr(t.untyped_storage(), _ATTR, None)
    if cell is None:
        return None
    array = cell.lazy() if lazy else cell.array
    if _is_whole(t, cell, array):
        return array, cell.index
    return argument(t, lazy), cell.index


def _resolve_bits(t: torch.Tensor, a: jax.Array) -> jax.Array:
    """Apply PyTorch's lazy conjugate and negative bits (they are their own inverses)."""
    with jax.enable_x64(True):
        if t.is_conj():
            a = jnp.conj(a)
        if t.is_neg():
            a = -a
    return a


def shared_array(table: dict, key, make, limit: int = 256) -> jax.Array:
    """``table[key]``, an array made once by ``make()`` and shared by the tensors that
    hold it (never owned by them: none donates it); made again if a program was given it
    and donated it anyway, and the table emptied past ``limit`` entries."""
    a = table.get(key)
    if a is None or a.is_deleted():
        if len(table) >= limit:
            table.clear()
        a = table[key] = make()
    return a


_empties: dict = {}  # (shape, dtype, device index) -> an array without elements


def _make_empty(shape: tuple, dtype: torch.dtype, index: int) -> jax.Array:
    with jax.enable_x64(True):
        return jnp.zeros(shape, jax_dtype(dtype), device=runtime.device(index))


def _empty(shape: tuple, dtype: torch.dtype, index: int) -> jax.Array:
    """An array of ``shape`` with no elements (a read of an empty tensor): made once per
    shape, dtype and device (jnp.zeros runs an op of its own, ~60 us, each time)."""
    key = (shape, dtype, index)
    return shared_array(_empties, key, lambda: _make_empty(shape, dtype, index))


def _read(t: torch.Tensor, lazy: bool = False) -> jax.Array:
    cell = cell_of(t)
    shape = tuple(t.shape)
    if t.numel() == 0:
        return _empty(shape, t.dtype, cell.index)
    a = cell.materialize(lazy)
    same_dtype = t.dtype == cell.dtype
    if same_dtype and a.shape == shape and t.storage_offset() == 0 and t.is_contiguous():
        return a  # the common case: the tensor is its whole storage
    if lazy and same_dtype:  # a view: its gather is recorded too
        out = fused.apply(
            _gather_fn(shape, tuple(t.stride())), (a, t.storage_offset()), cell.index, "view"
        )
        if t.storage_offset() == 0 and out.size == cell.size and t.is_contiguous():
            _keep(cell, out)
        return out
    a = fused.concrete(a)
    with jax.enable_x64(True):
        if not same_dtype:
            a = _reinterpret(a, jax_dtype(t.dtype))
            if a.size * t.dtype.itemsize == cell.size * cell.dtype.itemsize:
                # NOTE: the storage is read as another dtype (a loaded checkpoint's
                # bytes, say): keep it in that dtype so later reads need no bitcast.
                cell.array, cell.dtype, cell.size = a, t.dtype, a.size
        if a.shape == shape and t.storage_offset() == 0 and t.is_contiguous():
            return a
        strides, offset = tuple(t.stride()), t.storage_offset()
        out = _gather_fn(shape, strides)(a, offset)
        if (
            t.dtype == cell.dtype
            and offset == 0
            and out.size == cell.size
            and _is_contiguous(shape, strides)
        ):
            _keep(cell, out)  # the same storage, kept in the shape asked for last
        return out


def _keep(cell: Cell, value) -> None:
    """Keep a new array of the storage's whole value (a gather into another shape) as
    the storage's array: owned as the old one was (:func:`read` gives ownership up
    before it reads, so an array handed out is never owned)."""
    if cell.owned:
        cell.own(value)
    else:
        cell.array = value


def _check_no_overlap(t: torch.Tensor) -> None:
    for size, stride in zip(t.shape, t.stride()):
        if size > 1 and stride == 0:
            raise RuntimeError(
                "unsupported operation: some elements of the input tensor and the written-to "
                "tensor refer to a single memory location. Please clone() the tensor before "
                "performing the operation."
            )


def replace(t: torch.Tensor, value, owned: bool = False) -> bool:
    """Store ``value`` as t's whole storage when that is all a write needs (t covers its
    storage, same shape and dtype: an in-place op's common case); False otherwise.
    ``owned``: a program made ``value`` for t alone (see :class:`Cell`)."""
    cell = getattr(t.untyped_storage(), _ATTR, None)
    if (
        cell is None
        or t.dtype != cell.dtype
        or value.shape != t.shape
        or value.dtype != _NP_DTYPES.get(t.dtype)
        or value.size != cell.size
        or t.storage_offset() != 0
        or not t.is_contiguous()
        or t.is_conj()
        or t.is_neg()
    ):
        return False
    if executor.mesh_in_use:  # SPMD: an in-place op keeps the tensor's layout
        value = keep_layout(cell._value, value)
    if owned:
        cell.own(value)
    else:
        cell.array = value
    return True


_NP_DTYPES = {
    d: np.dtype(jax_dtype(d))
    for d in (
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.bool,
        torch.uint8,
    )
}


def write(t: torch.Tensor, value: jax.Array, owned: bool = False) -> None:
    """Store ``value`` (already of t's shape and dtype) into t's view of its storage;
    ``owned``: a program made ``value`` for t alone (see :class:`Cell`).

    In fused mode (or with a pending ``value``) the write is recorded, not run.
    """
    cell = cell_of(t)
    shape = tuple(t.shape)
    if t.numel() == 0:
        return
    lazy = settings.mode == "fused" or value.__class__ is Pending
    if t.is_conj() or t.is_neg() or t.dtype != cell.dtype:
        lazy, value = False, fused.concrete(value)  # rare: bit-level views run eagerly
        if t.is_conj() or t.is_neg():
            value = _resolve_bits(t, value)
    value = cast_to(value, t.dtype, shape, cell.index)
    offset = t.storage_offset()
    if t.dtype != cell.dtype:
        _check_no_overlap(t)
        with jax.enable_x64(True):
            base = _reinterpret(cell.materialize(), value.dtype)
            new = _scatter_fn(shape, tuple(t.stride()))(base, value, offset)
            cell.own(_reinterpret(new, jax_dtype(cell.dtype)))  # (a new array)
        return
    if offset == 0 and value.size == cell.size and t.is_contiguous():
        if executor.mesh_in_use:  # SPMD: an overwrite (copy_, load_state_dict) keeps the layout
            value = keep_layout(cell._value, value)
        if owned:
            cell.own(value)
        else:
            cell.array = value
        return
    _check_no_overlap(t)
    if value.size == 0:
        return
    base = cell.materialize(lazy)
    cell.own(  # (the scatter makes a new array)
        fused.apply(
            _scatter_fn(shape, tuple(t.stride())), (base, value, offset), cell.index, "view write"
        )
    )


def keep_layout(old, value):
    """``value`` laid out as ``old`` when ``old`` is sharded over a mesh
    (torch_pjrt.distributed.spmd): a tensor's placement outlives writes into it."""
    if not isinstance(old, jax.Array) or old.shape != value.shape:
        return value
    sharding = old.sharding
    if len(sharding.device_set) == 1:
        return value
    value = fused.concrete(value)
    if value.sharding == sharding:
        return value
    with jax.enable_x64(True):
        return jax.device_put(value, sharding)


def cast_to(value, dtype: torch.dtype, shape, index: int):
    """``value`` cast to ``dtype`` and broadcast to ``shape`` (recorded in fused mode)."""
    shape = tuple(shape)
    want = jax_dtype(dtype)
    if value.dtype == want and tuple(value.shape) == shape:
        return value
    return fused.apply(_cast_fn(want, shape), (value,), index, "cast")


def copy_to(value, dtype: torch.dtype, shape, index: int):
    """A new array of ``value`` cast to ``dtype`` and broadcast to ``shape`` (recorded in
    fused mode): :func:`cast_to` that copies when nothing needs casting."""
    return fused.apply(_cast_fn(jax_dtype(dtype), tuple(shape)), (value,), index, "copy")


_cast_fn = executor.helper(
    "cast", lambda dtype, shape: lambda v: jnp.broadcast_to(v.astype(dtype), shape)
)
