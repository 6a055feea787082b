"""Less common neural-network lowerings: segment reductions, the CTC loss and
fractional max pooling, with their backward ops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from torch_pjrt.ops.nn import _reduce, _vjp
from torch_pjrt.ops.registry import lowers

aten = torch.ops.aten


# --- segment_reduce --------------------------------------------------------------------


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


# --- ctc_loss ----------------------------------------------------------------------------


def _ctc_padded_targets(targets, target_lengths, batch: int, max_len: int):
    """Targets as (batch, max_len) int array, whichever layout CPU accepts."""
    if targets.ndim == 2:
        padded = targets[:, :max_len]
        if padded.shape[1] < max_len:
            padded = jnp.pad(padded, ((0, 0), (0, max_len - padded.shape[1])))
        return padded.astype(jnp.int64)
    offsets = jnp.cumsum(target_lengths) - target_lengths
    idx = offsets[:, None] + jnp.arange(max_len)[None, :]
    idx = jnp.clip(idx, 0, max(targets.shape[0] - 1, 0))
    if targets.shape[0] == 0:
        return jnp.zeros((batch, max_len), jnp.int64)
    return targets[idx].astype(jnp.int64)


def _ctc_forward(log_probs, targets, input_lengths, target_lengths, blank, max_len):
    steps, batch, _ = log_probs.shape
    input_lengths = jnp.asarray(input_lengths, jnp.int64).reshape(batch)
    target_lengths = jnp.asarray(target_lengths, jnp.int64).reshape(batch)
    padded = _ctc_padded_targets(targets, target_lengths, batch, max_len)
    width = 2 * max_len + 1
    s = jnp.arange(width)
    # extended label sequence: blank, l1, blank, l2, ..., blank
    label_idx = jnp.clip((s - 1) // 2, 0, max(max_len - 1, 0))
    if max_len > 0:
        labels = jnp.where(s % 2 == 1, padded[:, label_idx], blank)
    else:
        labels = jnp.full((batch, width), blank, jnp.int64)
    prev2 = jnp.concatenate([jnp.full((batch, 2), -1, labels.dtype), labels[:, :-2]], axis=1)
    skip = (s % 2 == 1)[None, :] & (labels != prev2) & (s >= 2)[None, :]
    valid = s[None, :] < (2 * target_lengths + 1)[:, None]
    neginf = jnp.asarray(-jnp.inf, log_probs.dtype)
    # lp[t, b, s] = log_probs[t, b, labels[b, s]]
    lp = jnp.take_along_axis(log_probs, jnp.broadcast_to(labels[None], (steps, batch, width)), 2)
    init = jnp.where(
        (s[None, :] == 0) | ((s[None, :] == 1) & (target_lengths[:, None] > 0)), lp[0], neginf
    )
    init = jnp.where(valid, init, neginf)

    def step(alpha, lp_t):
        a1 = jnp.concatenate([jnp.full((batch, 1), neginf), alpha[:, :-1]], axis=1)
        a2 = jnp.concatenate([jnp.full((batch, 2), neginf), alpha[:, :-2]], axis=1)
        a2 = jnp.where(skip, a2, neginf)
        top = jnp.maximum(jnp.maximum(alpha, a1), a2)
        safe = jnp.where(jnp.isinf(top), jnp.zeros_like(top), top)
        total = jnp.exp(alpha - safe) + jnp.exp(a1 - safe) + jnp.exp(a2 - safe)
        total = jnp.where(jnp.isinf(top), jnp.ones_like(total), total)
        new = jnp.where(jnp.isinf(top), neginf, jnp.log(total) + safe) + lp_t
        new = jnp.where(valid, new, neginf)
        return new, new

    if steps > 1:
        _, rest = jax.lax.scan(step, init, lp[1:])
        alphas = jnp.concatenate([init[None], rest], axis=0)
    else:
        alphas = init[None]
    alphas = jnp.where(
        (jnp.arange(steps)[:, None] < input_lengths[None, :])[:, :, None], alphas, neginf
    )
    last = alphas[jnp.clip(input_lengths - 1, 0, steps - 1), jnp.arange(batch)]  # (batch, width)
    end = 2 * target_lengths
    a_end = jnp.take_along_axis(last, end[:, None], 1)[:, 0]
    a_prev = jnp.take_along_axis(last, jnp.clip(end - 1, 0, width - 1)[:, None], 1)[:, 0]
    a_prev = jnp.where(target_lengths > 0, a_prev, neginf)
    top = jnp.maximum(a_end, a_prev)
    safe = jnp.where(jnp.isinf(top), jnp.zeros_like(top), top)
    total = jnp.exp(a_end - safe) + jnp.exp(a_prev - safe)
    total = jnp.where(jnp.isinf(top), jnp.ones_like(total), total)
    ll = jnp.where(jnp.isinf(top), neginf, jnp.log(total) + safe)
    return -ll, jnp.transpose(alphas, (1, 0, 2))


def _ctc_max_len(targets, target_lengths) -> int:
    """The longest target: read from the lengths where they are a list (``.default``
    overloads); bounded by the targets' static shape where they are a tensor value."""
    if isinstance(target_lengths, (list, tuple)):
        return max(target_lengths) if len(target_lengths) else 0
    return targets.shape[1] if targets.ndim == 2 else targets.shape[0]


@lowers(aten._ctc_loss.default, aten._ctc_loss.Tensor)
def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    max_len = _ctc_max_len(targets, target_lengths)
    # like CPU, the raw op ignores zero_infinity: ctc_loss applies it to the result
    return _ctc_forward(log_probs, targets, input_lengths, target_lengths, blank, max_len)


def _ctc_backward(grad, log_probs, targets, input_lengths, target_lengths, nll, blank, zi, max_len):
    steps, batch, _ = log_probs.shape

    def loss(lp):
        return _ctc_forward(lp, targets, input_lengths, target_lengths, blank, max_len)[0]

    _, pullback = jax.vjp(loss, log_probs)
    gr = grad.astype(log_probs.dtype).reshape(batch)
    (part,) = pullback(gr)
    lengths = jnp.asarray(input_lengths, jnp.int64).reshape(batch)
    live = (jnp.arange(steps)[:, None] < lengths[None, :])[:, :, None]
    out = jnp.where(live, jnp.exp(log_probs) * gr[None, :, None] + part, 0)
    if zi:
        out = jnp.where(jnp.isinf(nll)[None, :, None], 0, out)
    return out.astype(log_probs.dtype)


@lowers(aten._ctc_loss_backward.default, aten._ctc_loss_backward.Tensor)
def _ctc_loss_backward(
    grad,
    log_probs,
    targets,
    input_lengths,
    target_lengths,
    neg_log_likelihood,
    log_alpha,
    blank,
    zero_infinity=False,
):
    max_len = _ctc_max_len(targets, target_lengths)
    return _ctc_backward(
        grad,
        log_probs,
        targets,
        input_lengths,
        target_lengths,
        neg_log_likelihood,
        blank,
        zero_infinity,
        max_len,
    )


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


# --- margin losses: the backward ops (the forwards run as PyTorch's decompositions) ---


def _multi_margin(x, target, p: int, margin, weight, reduction: int):
    """``multi_margin_loss`` of (N, C), (C,) or () scores, as ATen defines it."""
    rows = x.reshape(-1, x.shape[-1] if x.ndim else 1)
    target = target.reshape(-1).astype(jnp.int32)
    own = jnp.take_along_axis(rows, target[:, None], axis=1)
    z = margin - own + rows
    terms = z if p == 1 else z * z
    if weight is not None:
        terms = terms * weight[target][:, None]
    other = jnp.arange(rows.shape[1])[None, :] != target[:, None]
    loss = jnp.sum(jnp.where((z > 0) & other, terms, 0), axis=1) / rows.shape[1]
    return _reduce(loss if x.ndim == 2 else loss.reshape(()), reduction)


@lowers(aten.multi_margin_loss_backward.default, static=("p",))
def multi_margin_loss_backward(grad_output, self, target, p, margin, weight=None, reduction=1):
    def forward(x):
        return _multi_margin(x, target, p, margin, weight, reduction)

    return _vjp(forward, (self,), grad_output, (True,))[0]


def _multilabel_margin(x, target, is_target, reduction: int):
    """``multilabel_margin_loss`` of (N, C), (C,) or () scores: for each listed target (up to
    the first -1) and each class that is not a target, max(0, 1 - (x[target] - x[class]))."""
    rows = x.reshape(-1, x.shape[-1] if x.ndim else 1)
    target = target.reshape(rows.shape).astype(jnp.int32)
    listed = jnp.cumprod(target >= 0, axis=1).astype(bool)  # positions before the first -1
    own = jnp.take_along_axis(rows, jnp.maximum(target, 0), axis=1)  # (N, positions)
    hinge = jnp.maximum(0, 1 - own[:, :, None] + rows[:, None, :])  # (N, positions, C)
    others = (is_target.reshape(rows.shape) == 0)[:, None, :]
    loss = jnp.sum(jnp.where(listed[:, :, None] & others, hinge, 0), axis=(1, 2))
    loss = loss / rows.shape[1]
    return _reduce(loss if x.ndim == 2 else loss.reshape(()), reduction)


@lowers(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target):
    def forward(x):
        return _multilabel_margin(x, target, is_target, reduction)

    return _vjp(forward, (self,), grad_output, (True,))[0]
