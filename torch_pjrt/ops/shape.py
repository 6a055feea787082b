"""Shape lowerings: ops that copy or rearrange elements without doing arithmetic."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_pjrt.ops._helpers import check, maybe_wrap_dim, slice_bounds, wrap_dim
from torch_pjrt.ops._promote import result_type
from torch_pjrt.ops.registry import lowers

aten = torch.ops.aten


def _check_cat(tensors, kept, dim: int) -> int:
    """ATen's checks of ``cat``'s shapes, in its words (its Meta kernel words them
    otherwise); the dim, wrapped."""
    for i, t in enumerate(tensors):
        check(
            t.ndim > 0, lambda: f"zero-dimensional tensor (at position {i}) cannot be concatenated"
        )
    dim = maybe_wrap_dim(dim, kept[0].ndim)
    first = kept[0]
    for i, t in enumerate(tensors):
        if t.shape == (0,):
            continue
        check(
            t.ndim == first.ndim,
            lambda: f"Tensors must have same number of dimensions: got {first.ndim} and {t.ndim}",
        )
        for d, (a, b) in enumerate(zip(first.shape, t.shape)):
            check(
                d == dim or a == b,
                lambda: (
                    f"Sizes of tensors must match except in dimension {dim}. Expected "
                    f"size {a} but got size {b} for tensor number {i} in the list."
                ),
            )
    return dim


@lowers(aten.cat.default)
def cat(tensors, dim=0):
    # PyTorch skips legacy empty 1-D tensors of shape (0,) when others have data
    dtype = result_type(*tensors)[1] if tensors else jnp.float32
    kept = [t for t in tensors if t.shape != (0,)]
    if not kept:
        return jnp.zeros((0,), dtype)
    dim = _check_cat(tensors, kept, dim)
    return jnp.concatenate([t.astype(dtype) for t in kept], axis=dim)


@lowers(aten.narrow_copy.default)
def narrow_copy(self, dim, start, length):
    # the checks of ATen's CPU kernel, in its words (its Meta kernel's are narrow's)
    check(self.ndim > 0, "narrow() cannot be applied to a 0-dim tensor.")
    if dim < 0:
        dim = maybe_wrap_dim(dim, self.ndim)
    check(
        dim < self.ndim,
        "Expected dim < static_cast<int64_t>(self_sizes.size()) to be true, but got false.  "
        "(Could this error message be improved?  If so, please report an enhancement "
        "request to PyTorch.)",
    )
    size = self.shape[dim]
    check(
        -size <= start <= size,
        lambda: (
            f"start out of range (expected to be in range of [{-size}, {size}], but got {start})"
        ),
        IndexError,
    )
    start = start + size if start < 0 else start
    check(
        length >= 0 and start <= size - length,
        lambda: f"start ({start}) + length ({length}) exceeds dimension size ({size}).",
    )
    return jax.lax.slice_in_dim(self, start, start + length, axis=dim)


@lowers(aten.stack.default)
def stack(tensors, dim=0):
    dtype = result_type(*tensors)[1]
    dim = wrap_dim(dim, tensors[0].ndim + 1)
    return jnp.stack([t.astype(dtype) for t in tensors], axis=dim)


@lowers(aten.block_diag.default)
def block_diag(tensors):
    dtype = result_type(*tensors)[1] if tensors else jnp.float32
    # 0-d tensors are 1x1 blocks, 1-d tensors (even empty ones) are one row
    blocks = [t.reshape((1,) * (2 - t.ndim) + t.shape).astype(dtype) for t in tensors]
    cols = sum(b.shape[1] for b in blocks)
    rows, left = [], 0
    for b in blocks:
        rows.append(jnp.pad(b, ((0, 0), (left, cols - left - b.shape[1]))))
        left += b.shape[1]
    return jnp.concatenate(rows, axis=0) if rows else jnp.zeros((0, 0), dtype)


@lowers(aten.repeat.default)
def repeat(self, repeats):
    if len(repeats) < self.ndim:
        raise RuntimeError("repeat: fewer repeats than dims")  # PyTorch's message from Meta
    x = self.reshape((1,) * (len(repeats) - self.ndim) + self.shape)
    return jnp.tile(x, tuple(repeats))


@lowers(aten.constant_pad_nd.default)
def constant_pad_nd(self, pad, value=0):
    # pad runs from the last dim backwards; negative amounts crop
    if len(pad) % 2 or len(pad) > 2 * self.ndim:
        raise RuntimeError(f"invalid padding {list(pad)} for a {self.ndim}-d tensor")
    config = [(0, 0, 0)] * self.ndim
    for i in range(len(pad) // 2):
        dim, lo, hi = self.ndim - 1 - i, pad[2 * i], pad[2 * i + 1]
        if self.shape[dim] + min(lo, 0) + min(hi, 0) < 0:  # ATen crops before it pads
            raise RuntimeError(f"padding {lo}, {hi} crops more than dim {dim} holds")
        config[dim] = (lo, hi, 0)
    return jax.lax.pad(self, jnp.asarray(value).astype(self.dtype), config)


@lowers(aten.rot90.default)
def rot90(self, k=1, dims=(0, 1)):
    return jnp.rot90(self, k, axes=tuple(wrap_dim(d, self.ndim) for d in dims))


@lowers(aten.pixel_shuffle.default)
def pixel_shuffle(self, upscale_factor):
    r = upscale_factor
    *batch, c, h, w = self.shape
    n = len(batch)
    x = self.reshape((*batch, c // (r * r), r, r, h, w))
    x = x.transpose((*range(n), n, n + 3, n + 1, n + 4, n + 2))
    return x.reshape((*batch, c // (r * r), h * r, w * r))


@lowers(aten.pixel_unshuffle.default)
def pixel_unshuffle(self, downscale_factor):
    r = downscale_factor
    *batch, c, h, w = self.shape
    n = len(batch)
    x = self.reshape((*batch, c, h // r, r, w // r, r))
    x = x.transpose((*range(n), n, n + 2, n + 4, n + 1, n + 3))
    return x.reshape((*batch, c * r * r, h // r, w // r))


@lowers(aten.flip.default)
def flip(self, dims):
    if self.ndim == 0 or not dims:
        return self
    return jnp.flip(self, axis=tuple(wrap_dim(d, self.ndim) for d in dims))


@lowers(aten.roll.default)
def roll(self, shifts, dims=()):
    if not dims:
        return jnp.roll(self.reshape(-1), shifts[0]).reshape(self.shape)
    return jnp.roll(self, tuple(shifts), axis=tuple(wrap_dim(d, self.ndim) for d in dims))


@lowers(aten.tril.default)
def tril(self, diagonal=0):
    return jnp.tril(self, diagonal)


@lowers(aten.triu.default)
def triu(self, diagonal=0):
    return jnp.triu(self, diagonal)


@lowers(aten.channel_shuffle.default, aten.native_channel_shuffle.default)
def channel_shuffle(self, groups):
    n, c = self.shape[:2]
    rest = self.shape[2:]
    x = self.reshape((n, groups, c // groups) + rest)
    return jnp.swapaxes(x, 1, 2).reshape(self.shape)


# --- scatters into views -------------------------------------------------------------


@lowers(aten.slice_scatter.default)
def slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    dim = wrap_dim(dim, self.ndim)
    start, end, step = slice_bounds(self.shape[dim], start, end, step)
    where = (slice(None),) * dim + (slice(start, end, step),)
    return self.at[where].set(src.astype(self.dtype))


@lowers(aten.select_scatter.default)
def select_scatter(self, src, dim, index):
    dim = wrap_dim(dim, self.ndim)
    index = index + self.shape[dim] if index < 0 else index
    return self.at[(slice(None),) * dim + (index,)].set(src.astype(self.dtype))


def _diagonal_positions(rows: int, cols: int, offset: int):
    length = max(min(rows + min(offset, 0), cols - max(offset, 0)), 0)
    i = np.arange(length)
    return i + max(-offset, 0), i + max(offset, 0)


@lowers(aten.diagonal_scatter.default)
def diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
    dim1, dim2 = wrap_dim(dim1, self.ndim), wrap_dim(dim2, self.ndim)
    x = jnp.moveaxis(self, (dim1, dim2), (-2, -1))
    r, c = _diagonal_positions(x.shape[-2], x.shape[-1], offset)
    x = x.at[..., r, c].set(src.astype(self.dtype))
    return jnp.moveaxis(x, (-2, -1), (dim1, dim2))


@lowers(aten.as_strided_scatter.default)
def as_strided_scatter(self, src, size, stride, storage_offset=None):
    if tuple(src.shape) != tuple(size):
        raise RuntimeError(f"expected src of shape {list(size)}, got {list(src.shape)}")
    # self is dense: its row-major elements are the storage the strided view reads
    index = np.full((), 0 if storage_offset is None else storage_offset, np.int64)
    for n, s in zip(size, stride):
        index = index[..., None] + np.arange(n) * s
    end = 1 + (0 if storage_offset is None else storage_offset)
    end += sum((n - 1) * s for n, s in zip(size, stride) if n)
    check(
        not index.size or (index.min() >= 0 and index.max() < self.size),
        lambda: (
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset "
            f"{storage_offset or 0}, and itemsize {self.dtype.itemsize} requiring a storage size "
            f"of {end * self.dtype.itemsize} are out of bounds for storage of size "
            f"{self.size * self.dtype.itemsize}"
        ),
    )
    flat = self.reshape(-1).at[index.reshape(-1)].set(src.reshape(-1).astype(self.dtype))
    return flat.reshape(self.shape)


@lowers(aten.diag_embed.default)
def diag_embed(self, offset=0, dim1=-2, dim2=-1):
    ndim = self.ndim + 1
    dim1, dim2 = wrap_dim(dim1, ndim), wrap_dim(dim2, ndim)
    n = self.shape[-1] + abs(offset)
    out = jnp.zeros(self.shape[:-1] + (n, n), self.dtype)
    r, c = _diagonal_positions(n, n, offset)
    out = out.at[..., r, c].set(self)
    return jnp.moveaxis(out, (-2, -1), (dim1, dim2))


@lowers(aten.unfold_backward.default)
def unfold_backward(grad_in, input_sizes, dim, size, step):
    if not input_sizes:
        return jnp.sum(grad_in).reshape(())
    dim = wrap_dim(dim, len(input_sizes))
    windows = grad_in.shape[dim]
    positions = (np.arange(windows)[:, None] * step + np.arange(size)[None, :]).reshape(-1)
    g = jnp.moveaxis(grad_in, -1, dim + 1)
    g = g.reshape(g.shape[:dim] + (windows * size,) + g.shape[dim + 2 :])
    out = jnp.zeros(tuple(input_sizes), grad_in.dtype)
    return out.at[(slice(None),) * dim + (positions,)].add(g)


# --- reflection and replication padding -----------------------------------------------


def _source_index(size: int, before: int, after: int, mode: str) -> np.ndarray:
    """For each output position along a padded dim, the input position it copies."""
    j = np.arange(size + before + after) - before
    if mode == "reflect":
        period = 2 * (size - 1)
        j = np.abs(j) % period if period else np.zeros_like(j)
        return np.where(j >= size, period - j, j)
    return np.clip(j, 0, size - 1)


def _pad(x, padding, mode: str):
    for i in range(len(padding) // 2):
        dim = x.ndim - 1 - i
        index = _source_index(x.shape[dim], padding[2 * i], padding[2 * i + 1], mode)
        x = jnp.take(x, index, axis=dim)
    return x


def _pad_backward(grad_output, self, padding, mode: str):
    _, pullback = jax.vjp(lambda x: _pad(x, padding, mode), self)
    return pullback(grad_output.astype(self.dtype))[0]


@lowers(aten.reflection_pad1d, aten.reflection_pad2d, aten.reflection_pad3d)
def reflection_pad(self, padding):
    return _pad(self, padding, "reflect")


@lowers(aten.replication_pad1d, aten.replication_pad2d, aten.replication_pad3d)
def replication_pad(self, padding):
    return _pad(self, padding, "edge")


@lowers(
    aten.reflection_pad1d_backward,
    aten.reflection_pad2d_backward,
    aten.reflection_pad3d_backward,
)
def reflection_pad_backward(grad_output, self, padding):
    return _pad_backward(grad_output, self, padding, "reflect")


@lowers(
    aten.replication_pad1d_backward,
    aten.replication_pad2d_backward,
    aten.replication_pad3d_backward,
)
def replication_pad_backward(grad_output, self, padding):
    return _pad_backward(grad_output, self, padding, "edge")
