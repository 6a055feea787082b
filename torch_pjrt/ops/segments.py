"""Segment reductions: ``segment_reduce`` (sum, mean, prod, max or min over runs of one
dimension, the runs given by lengths or offsets) and its backward."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from torch_pjrt.ops.registry import lowers

aten = torch.ops.aten


# --- segment_reduce -----------------------------------------------------------------


def _identity(reduce: str, dtype):
    if reduce in ("sum", "mean"):
        return jnp.asarray(0, dtype)
    if reduce == "prod":
        return jnp.asarray(1, dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.asarray(-jnp.inf if reduce == "max" else jnp.inf, dtype)
    info = jnp.iinfo(dtype)
    return jnp.asarray(info.min if reduce == "max" else info.max, dtype)


def _segment_bounds(lengths, offsets):
    if lengths is not None:
        lengths = lengths.astype(jnp.int64)
        ends = jnp.cumsum(lengths, axis=-1)
        return ends - lengths, ends
    offsets = offsets.astype(jnp.int64)
    return offsets[..., :-1], offsets[..., 1:]


@lowers(aten.segment_reduce.default)
def segment_reduce(
    data,
    reduce,
    *,
    lengths=None,
    indices=None,
    offsets=None,
    axis=0,
    unsafe=False,
    initial=None,
):
    axis = axis % data.ndim
    starts, ends = _segment_bounds(lengths, offsets)
    n = data.shape[axis]
    rest = data.shape[axis + 1 :]
    pos = jnp.arange(n)
    # mask: lead + (segments, n)
    mask = (pos >= starts[..., None]) & (pos < ends[..., None])
    mask = mask.reshape(mask.shape + (1,) * len(rest))
    values = jnp.expand_dims(data, axis)  # lead + (1, n) + rest
    ident = _identity(reduce, data.dtype)
    masked = jnp.where(mask, values, ident)
    red_axis = axis + 1
    if reduce in ("sum", "mean"):
        out = jnp.sum(masked, axis=red_axis)
    elif reduce == "prod":
        out = jnp.prod(masked, axis=red_axis)
    elif reduce == "max":
        out = jnp.max(masked, axis=red_axis)
    elif reduce == "min":
        out = jnp.min(masked, axis=red_axis)
    else:
        raise RuntimeError(f"segment_reduce: unknown reduction {reduce!r}")
    count = (ends - starts).reshape((ends - starts).shape + (1,) * len(rest))
    if initial is not None:
        init = jnp.asarray(initial).astype(data.dtype)
        if reduce in ("sum", "mean"):
            out = out + init
        elif reduce == "prod":
            out = out * init
        elif reduce == "max":
            out = jnp.where(jnp.isnan(out), out, jnp.maximum(out, init))
        else:
            out = jnp.where(jnp.isnan(out), out, jnp.minimum(out, init))
    if reduce == "mean":
        if initial is not None:
            out = jnp.where(count == 0, out, out / count.astype(data.dtype))
        else:
            out = out / count.astype(data.dtype)
    return out.astype(data.dtype)


@lowers(aten._segment_reduce_backward.default)
def _segment_reduce_backward(
    grad, output, data, reduce, *, lengths=None, offsets=None, axis=0, initial=None
):
    axis = axis % data.ndim
    starts, ends = _segment_bounds(lengths, offsets)
    segments = starts.shape[-1]
    if segments == 0:
        return jnp.zeros(data.shape, data.dtype)
    n = data.shape[axis]
    rest = data.shape[axis + 1 :]
    pos = jnp.arange(n)
    # the segment of each position along the axis: lead + (n,)
    seg = jnp.sum(ends[..., None, :] <= pos[:, None], axis=-1)
    seg = jnp.clip(seg, 0, max(segments - 1, 0))
    inside = (pos >= jnp.take_along_axis(starts, seg, -1)) & (
        pos < jnp.take_along_axis(ends, seg, -1)
    )
    tail = (1,) * len(rest)
    seg_b = jnp.broadcast_to(seg.reshape(seg.shape + tail), data.shape)
    inside_b = inside.reshape(inside.shape + tail)
    count = (ends - starts).reshape((ends - starts).shape + tail)

    def spread(v):  # per segment -> per position
        return jnp.take_along_axis(v, seg_b, axis)

    g = spread(grad)
    if reduce == "sum":
        out = g
    elif reduce == "mean":
        out = g / spread(jnp.maximum(count, 1).astype(grad.dtype))
    elif reduce in ("max", "min"):
        hit = (data == spread(output)) | jnp.isnan(data)
        hit = hit & inside_b
        mask = jnp.moveaxis(hit, axis, -1)
        onehot = jnp.moveaxis(seg_b, axis, -1)[..., None] == jnp.arange(segments)
        hits = jnp.sum(jnp.where(mask[..., None], onehot, False), axis=-2).astype(grad.dtype)
        hits = jnp.moveaxis(hits, -1, axis)
        out = jnp.where(hit, g / spread(jnp.maximum(hits, 1)), 0)
    elif reduce == "prod":
        zero = (data == 0) & inside_b
        safe = jnp.where(zero, jnp.ones_like(data), data)
        mask = jnp.moveaxis(inside_b & ~zero, axis, -1)
        onehot = jnp.moveaxis(seg_b, axis, -1)[..., None] == jnp.arange(segments)
        vals = jnp.moveaxis(safe, axis, -1)[..., None]
        nonzero_prod = jnp.prod(jnp.where(mask[..., None] & onehot, vals, 1), axis=-2)
        zeros = jnp.sum(jnp.moveaxis(zero, axis, -1)[..., None] & onehot, axis=-2)
        nonzero_prod = jnp.moveaxis(nonzero_prod, -1, axis)
        zeros = jnp.moveaxis(zeros, -1, axis)
        if initial is not None:
            nonzero_prod = nonzero_prod * jnp.asarray(initial).astype(data.dtype)
        z = spread(zeros)
        p = spread(nonzero_prod)
        out = jnp.where(z == 0, g * p / safe, jnp.where((z == 1) & zero, g * p, 0))
    else:
        raise RuntimeError(f"segment_reduce: unknown reduction {reduce!r}")
    out = jnp.where(inside_b, out, 0)
    return out.astype(data.dtype)
