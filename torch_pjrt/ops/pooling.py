"""Pooling lowerings: max, average, adaptive and fractional max pooling, with their
backward ops."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_pjrt.ops._helpers import ntuple, vjp
from torch_pjrt.ops._promote import opmath as _opmath
from torch_pjrt.ops._promote import upcast
from torch_pjrt.ops.registry import lowers

aten = torch.ops.aten


HIGHEST = jax.lax.Precision.HIGHEST


# --- pooling -------------------------------------------------------------------------


def _pool_out_size(size, k, s, p, d, ceil_mode):
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return max(out, 0)


class _Window:
    """The static geometry of a pooling over the last n dims."""

    def __init__(self, shape, n, kernel_size, stride, padding, dilation=1, ceil_mode=False):
        self.n = n
        self.k = ntuple(kernel_size, n)
        self.s = ntuple(stride, n) if stride else self.k
        self.p = ntuple(padding, n)
        self.d = ntuple(dilation, n)
        self.sizes = tuple(shape[-n:])
        self.outs = tuple(
            _pool_out_size(*a, ceil_mode) for a in zip(self.sizes, self.k, self.s, self.p, self.d)
        )

    def pad(self, x, fill):
        """x padded so that every window offset is an in-range strided slice."""
        pads = [(0, 0, 0)] * (x.ndim - self.n)
        for size, k, s, p, d, o in zip(self.sizes, self.k, self.s, self.p, self.d, self.outs):
            right = max(0, (o - 1) * s + d * (k - 1) + 1 - (size + p)) if o else 0
            pads.append((p, right, 0))
        return jax.lax.pad(x, jnp.asarray(fill, x.dtype), pads)

    def offsets(self):
        return np.ndindex(*self.k)

    def take(self, xp, offset):
        """The element at kernel ``offset`` of every window: shape (..., *outs)."""
        lead = xp.ndim - self.n
        start = [0] * lead + [o * d for o, d in zip(offset, self.d)]
        limit = list(xp.shape[:lead]) + [
            st + (o - 1) * s + 1 if o else st for st, o, s in zip(start[lead:], self.outs, self.s)
        ]
        return jax.lax.slice(xp, start, limit, [1] * lead + list(self.s))

    def positions(self, offset):
        """Per dim, the (unpadded) input position read at ``offset``, as numpy arrays."""
        return [
            np.arange(o) * s - p + off * d
            for o, s, p, d, off in zip(self.outs, self.s, self.p, self.d, offset)
        ]


def _flat_index(positions, sizes):
    grids = np.meshgrid(*positions, indexing="ij")
    flat = np.zeros(grids[0].shape, np.int64)
    for g, size in zip(grids, sizes):
        flat = flat * size + g
    return flat


def _lowest(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf
    return jnp.iinfo(dtype).min


def _max_pool(self, n, kernel_size, stride, padding, dilation, ceil_mode):
    w = _Window(self.shape, n, kernel_size, stride, padding, dilation, ceil_mode)
    xp = w.pad(self, _lowest(self.dtype))
    # CPU's rule: start at the window's first in-range element, then take any strictly
    # greater value or any NaN, so ties keep the first and NaNs the last.
    first = []
    for size, o, s, p, d in zip(w.sizes, w.outs, w.s, w.p, w.d):
        start = np.arange(o) * s - p
        first.append(np.where(start < 0, start + ((-start + d - 1) // d) * d, start))
    best = jnp.full(self.shape[:-n] + w.outs, _lowest(self.dtype), self.dtype)
    index = jnp.broadcast_to(jnp.asarray(_flat_index(first, w.sizes)), best.shape)
    for offset in w.offsets():
        val = w.take(xp, offset)
        better = val > best
        if jnp.issubdtype(self.dtype, jnp.floating):
            better = better | jnp.isnan(val)
        best = jnp.where(better, val, best)
        index = jnp.where(better, jnp.asarray(_flat_index(w.positions(offset), w.sizes)), index)
    return best, index


def _max_pool_backward(grad_output, self, n, indices):
    lead = self.shape[:-n]
    batch = math.prod(lead)
    plane = math.prod(self.shape[-n:])
    rows = jnp.arange(batch, dtype=jnp.int64)[:, None] * plane
    flat = (indices.reshape(batch, -1) + rows).reshape(-1)
    grad = jnp.zeros((batch * plane,), _opmath(grad_output.dtype))
    grad = grad.at[flat].add(upcast(grad_output).reshape(-1))
    return grad.reshape(self.shape).astype(grad_output.dtype)


@lowers(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(self, 2, kernel_size, stride, padding, dilation, ceil_mode)


@lowers(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(self, 3, kernel_size, stride, padding, dilation, ceil_mode)


@lowers(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(
    grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    return _max_pool_backward(grad_output, self, 2, indices)


@lowers(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(
    grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    return _max_pool_backward(grad_output, self, 3, indices)


def _avg_divisor(w, count_include_pad, divisor_override):
    if divisor_override:
        return np.float64(divisor_override)
    per_dim = []
    for size, o, k, s, p in zip(w.sizes, w.outs, w.k, w.s, w.p):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, size + p)
        if count_include_pad:
            per_dim.append(end - start)
        else:
            per_dim.append(np.minimum(end, size) - np.maximum(start, 0))
    grids = np.meshgrid(*per_dim, indexing="ij")
    return np.prod(np.stack(grids), axis=0)


def _avg_pool(self, n, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor):
    w = _Window(self.shape, n, kernel_size, stride, padding, 1, ceil_mode)
    xp = w.pad(upcast(self), 0)
    total = None
    for offset in w.offsets():
        val = w.take(xp, offset)
        total = val if total is None else total + val
    scale = _avg_divisor(w, count_include_pad, divisor)
    if jnp.issubdtype(self.dtype, jnp.integer):
        return (total // jnp.asarray(scale, total.dtype)).astype(self.dtype)
    return (total / jnp.asarray(scale, total.dtype)).astype(self.dtype)


def _avg_pool_forward(n: int):
    """avg_pool{n}d (the rank of an unbatched 3d input equals a batched 2d one's, so n
    comes from the op, not the input)."""

    def forward(
        self,
        kernel_size,
        stride=(),
        padding=0,
        ceil_mode=False,
        count_include_pad=True,
        divisor_override=None,
    ):
        return _avg_pool(
            self, n, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
        )

    return forward


lowers(aten.avg_pool2d.default)(_avg_pool_forward(2))
lowers(aten.avg_pool3d.default)(_avg_pool_forward(3))


def _avg_pool_backward(n: int):
    """avg_pool{n}d_backward: the gradient of the forward pooling (one function, n dims)."""

    pool = _avg_pool_forward(n)

    def backward(
        grad_output,
        self,
        kernel_size,
        stride,
        padding,
        ceil_mode,
        count_include_pad,
        divisor_override,
    ):
        def forward(x):
            args = (kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
            return pool(x, *args)

        return vjp(forward, (self,), grad_output, (True,))[0]

    return backward


lowers(aten.avg_pool2d_backward.default)(_avg_pool_backward(2))
lowers(aten.avg_pool3d_backward.default)(_avg_pool_backward(3))


def _adaptive_bounds(size, out):
    i = np.arange(out)
    return (i * size) // out, -((-(i + 1) * size) // out)


def _adaptive_avg_pool(self, output_size):
    n = len(output_size)
    x = upcast(self)
    lead = self.ndim - n
    for dim, (size, out) in enumerate(zip(self.shape[-n:], output_size)):
        start, end = _adaptive_bounds(size, out)
        pos = np.arange(size)
        member = (pos[None, :] >= start[:, None]) & (pos[None, :] < end[:, None])
        # a 0/1 matrix sums each window exactly as CPU does; divide by its length after
        total = jnp.tensordot(
            x, jnp.asarray(member.T, x.dtype), axes=([lead + dim], [0]), precision=HIGHEST
        )
        total = jnp.moveaxis(total, -1, lead + dim)
        x = total / jnp.asarray((end - start).reshape((-1,) + (1,) * (n - dim - 1)), x.dtype)
    return x.astype(self.dtype)


@lowers(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(self, output_size):
    return _adaptive_avg_pool(self, tuple(output_size))


@lowers(aten._adaptive_avg_pool3d.default)
def _adaptive_avg_pool3d(self, output_size):
    return _adaptive_avg_pool(self, tuple(output_size))


def _adaptive_avg_pool_backward(grad_output, self, n):
    output_size = grad_output.shape[-n:]
    return vjp(lambda x: _adaptive_avg_pool(x, output_size), (self,), grad_output, (True,))[0]


@lowers(aten._adaptive_avg_pool2d_backward.default)
def _adaptive_avg_pool2d_backward(grad_output, self):
    return _adaptive_avg_pool_backward(grad_output, self, 2)


@lowers(aten._adaptive_avg_pool3d_backward.default)
def _adaptive_avg_pool3d_backward(grad_output, self):
    return _adaptive_avg_pool_backward(grad_output, self, 3)


def _adaptive_max_pool(self, output_size):
    n = len(output_size)
    lead = self.shape[:-n]
    starts, lengths = [], []
    for size, out in zip(self.shape[-n:], output_size):
        start, end = _adaptive_bounds(size, out)
        starts.append(start)
        lengths.append(end - start)
    best = jnp.full(lead + tuple(output_size), _lowest(self.dtype), self.dtype)
    index = None
    for offset in np.ndindex(*[int(m.max()) if m.size else 0 for m in lengths]):
        # past a window's end, clamp to its last element: a repeat never wins a tie
        pos = [s + np.minimum(o, m - 1) for s, o, m in zip(starts, offset, lengths)]
        flat = jnp.asarray(_flat_index(pos, self.shape[-n:]))
        val = jnp.take(self.reshape(lead + (-1,)), flat.reshape(-1), axis=-1).reshape(best.shape)
        if index is None:
            best, index = val, jnp.broadcast_to(flat, best.shape)
            continue
        better = val > best
        if jnp.issubdtype(self.dtype, jnp.floating):
            better = better | jnp.isnan(val)
        best = jnp.where(better, val, best)
        index = jnp.where(better, flat, index)
    if index is None:
        index = jnp.zeros(best.shape, jnp.int64)
    return best, index


@lowers(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def adaptive_max_pool2d(self, output_size):
    return _adaptive_max_pool(self, tuple(output_size))


@lowers(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(grad_output, self, indices):
    return _max_pool_backward(grad_output, self, 2, indices)


@lowers(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(grad_output, self, indices):
    return _max_pool_backward(grad_output, self, 3, indices)


# --- fractional max pooling --------------------------------------------------------------


def _fractional_starts(sample, in_size: int, out_size: int, pool: int):
    """PyTorch's pooling window starts from one uniform sample per plane, in its dtype."""
    if out_size == 1:
        return jnp.full(sample.shape + (1,), in_size - pool, jnp.int64)
    dtype = sample.dtype
    alpha = jnp.asarray(in_size - pool, dtype) / jnp.asarray(out_size - 1, dtype)
    i = jnp.arange(out_size - 1, dtype=dtype)
    s = sample[..., None]
    seq = jnp.trunc((i + s) * alpha).astype(jnp.int64) - jnp.trunc(s * alpha).astype(jnp.int64)
    last = jnp.full(sample.shape + (1,), in_size - pool, jnp.int64)
    return jnp.concatenate([seq, last], axis=-1)


def _fractional_max_pool(self, kernel_size, output_size, random_samples, dims: int):
    unbatched = self.ndim == dims + 1
    x = self[None] if unbatched else self
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    samples = random_samples.reshape(n, c, dims)
    # the samples run W, H for 2-D pooling and T, H, W for 3-D pooling
    order = (1, 0) if dims == 2 else (0, 1, 2)
    flat = jnp.zeros((n, c) + (1,) * (2 * dims), jnp.int64)
    stride = 1
    for d in reversed(range(dims)):
        starts = _fractional_starts(
            samples[..., order[d]], spatial[d], output_size[d], kernel_size[d]
        )  # (n, c, out_d)
        idx = starts[..., None] + jnp.arange(kernel_size[d])  # (n, c, out_d, k_d)
        shape = [n, c] + [1] * (2 * dims)
        shape[2 + d] = output_size[d]
        shape[2 + dims + d] = kernel_size[d]
        flat = flat + idx.reshape(shape) * stride
        stride *= spatial[d]
    full = (n, c) + tuple(output_size) + tuple(kernel_size)
    flat = jnp.broadcast_to(flat, full)
    window = 1
    for k in kernel_size:
        window *= k
    flat = flat.reshape((n, c) + tuple(output_size) + (window,))
    count = window
    for o in output_size:
        count *= o
    vals = jnp.take_along_axis(x.reshape(n, c, stride), flat.reshape(n, c, count), 2)
    vals = vals.reshape(flat.shape)
    nan = jnp.isnan(vals)
    last_nan = window - 1 - jnp.argmax(nan[..., ::-1], axis=-1)
    first_max = jnp.argmax(jnp.where(nan, -jnp.inf, vals), axis=-1)
    pick = jnp.where(jnp.any(nan, axis=-1), last_nan, first_max)[..., None]
    out = jnp.take_along_axis(vals, pick, -1)[..., 0]
    indices = jnp.take_along_axis(flat, pick, -1)[..., 0]
    if unbatched:
        out, indices = out[0], indices[0]
    return out.astype(self.dtype), indices.astype(jnp.int64)


@lowers(aten.fractional_max_pool2d.default)
def fractional_max_pool2d(self, kernel_size, output_size, random_samples):
    return _fractional_max_pool(self, kernel_size, output_size, random_samples, 2)


@lowers(aten.fractional_max_pool3d.default)
def fractional_max_pool3d(self, kernel_size, output_size, random_samples):
    return _fractional_max_pool(self, kernel_size, output_size, random_samples, 3)


def _fractional_max_pool_backward(grad_output, self, indices, dims: int):
    unbatched = self.ndim == dims + 1
    x = self[None] if unbatched else self
    g = grad_output[None] if unbatched else grad_output
    idx = indices[None] if unbatched else indices
    n, c = x.shape[:2]
    size = 1
    for d in x.shape[2:]:
        size *= d
    count = 1
    for d in g.shape[2:]:
        count *= d
    rows = jnp.arange(n)[:, None, None]
    planes = jnp.arange(c)[None, :, None]
    grad = jnp.zeros((n, c, size), g.dtype)
    grad = grad.at[rows, planes, idx.reshape(n, c, count)].add(g.reshape(n, c, count))
    grad = grad.reshape(x.shape)
    return (grad[0] if unbatched else grad).astype(self.dtype)


@lowers(aten.fractional_max_pool2d_backward.default)
def fractional_max_pool2d_backward(grad_output, self, kernel_size, output_size, indices):
    return _fractional_max_pool_backward(grad_output, self, indices, 2)


@lowers(aten.fractional_max_pool3d_backward.default)
def fractional_max_pool3d_backward(grad_output, self, kernel_size, output_size, indices):
    return _fractional_max_pool_backward(grad_output, self, indices, 3)
