"""Loss lowerings: NLL, MSE, smooth L1, Huber, binary cross-entropy, the CTC loss and the
multi-class margin losses."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from torch_pjrt.ops._helpers import check, dtype_name, vjp
from torch_pjrt.ops._promote import upcast
from torch_pjrt.ops.registry import lowers
from torch_pjrt.runtime import asserts
from torch_pjrt.runtime.transfer import torch_dtype

aten = torch.ops.aten


# --- reductions of a loss ---------------------------------------------------------------


def _reduce(loss, reduction: int):
    if reduction == 1:
        return jnp.mean(loss)
    if reduction == 2:
        return jnp.sum(loss)
    return loss


def _reduce_backward(grad_output, shape, reduction: int):
    """The per-element cotangent of ``_reduce``."""
    if reduction == 1:
        return jnp.broadcast_to(grad_output / math.prod(shape), shape)
    return jnp.broadcast_to(grad_output, shape)


# --- losses --------------------------------------------------------------------------


def _nll_pick(self, target, weight, ignore_index):
    """(-log-likelihood terms, their weights), with the class dim gathered away."""
    axis = 0 if self.ndim == 1 else 1
    x = jnp.moveaxis(upcast(self), axis, -1)
    valid = target != ignore_index
    safe = jnp.where(valid, target, 0)
    picked = jnp.take_along_axis(x, safe[..., None], -1)[..., 0]
    w = jnp.ones(safe.shape, x.dtype) if weight is None else upcast(weight)[safe]
    w = jnp.where(valid, w, jnp.zeros_like(w))
    # (an ignored row adds nothing, whatever it holds: -inf or nan times 0 is nan)
    return jnp.where(valid, -picked * w, jnp.zeros_like(w)), w


def _nll_forward(self, target, weight, reduction, ignore_index):
    classes = self.shape[0 if self.ndim == 1 else 1]
    ok = (target == ignore_index) | ((target >= 0) & (target < classes))
    asserts.check(ok, IndexError, "Target {} is out of bounds.", asserts.first_bad(target, ok))
    losses, w = _nll_pick(self, target, weight, ignore_index)
    if reduction == 0:
        return losses.astype(self.dtype), jnp.zeros((), self.dtype)
    total = jnp.sum(w)
    out = jnp.sum(losses)
    if reduction == 1:
        out = out / total
    return out.astype(self.dtype), total.astype(self.dtype)


def _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    axis = 0 if self.ndim == 1 else 1
    classes = self.shape[axis]
    _, w = _nll_pick(self, target, weight, ignore_index)
    g = upcast(grad_output)
    if reduction == 1:
        g = g / upcast(total_weight)
    coeff = -w * g
    safe = jnp.where(target != ignore_index, target, 0)
    grad = jax.nn.one_hot(safe, classes, dtype=coeff.dtype) * coeff[..., None]
    return jnp.moveaxis(grad, -1, axis).astype(self.dtype)


@lowers(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    return _nll_forward(self, target, weight, reduction, ignore_index)


@lowers(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    return _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight)


def _loss_dtype(self, target):
    return jnp.promote_types(self.dtype, target.dtype)


@lowers(aten.mse_loss.default)
def mse_loss(self, target, reduction=1):
    dtype = _loss_dtype(self, target)
    return _reduce(jnp.square(upcast(self) - upcast(target)), reduction).astype(dtype)


@lowers(aten.mse_loss_backward.default)
def mse_loss_backward(grad_output, self, target, reduction):
    diff = upcast(self) - upcast(target)
    g = _reduce_backward(upcast(grad_output), diff.shape, reduction)
    return (2 * diff * g).astype(self.dtype)


def _smooth_l1(diff, beta):
    z = jnp.abs(diff)
    if beta == 0:
        return z
    return jnp.where(z < beta, 0.5 * z * z / beta, z - 0.5 * beta)


@lowers(aten.smooth_l1_loss.default)
def smooth_l1_loss(self, target, reduction=1, beta=1.0):
    loss = _smooth_l1(upcast(self) - upcast(target), beta)
    return _reduce(loss, reduction).astype(_loss_dtype(self, target))


@lowers(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(grad_output, self, target, reduction, beta):
    diff = upcast(self) - upcast(target)
    g = _reduce_backward(upcast(grad_output), diff.shape, reduction)
    if beta == 0:
        local = jnp.sign(diff)
    else:
        local = jnp.where(jnp.abs(diff) < beta, diff / beta, jnp.sign(diff))
    return (local * g).astype(self.dtype)


@lowers(aten.huber_loss.default)
def huber_loss(self, target, reduction=1, delta=1.0):
    z = jnp.abs(upcast(self) - upcast(target))
    loss = jnp.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta))
    return _reduce(loss, reduction).astype(_loss_dtype(self, target))


@lowers(aten.huber_loss_backward.default)
def huber_loss_backward(grad_output, self, target, reduction, delta):
    diff = upcast(self) - upcast(target)
    g = _reduce_backward(upcast(grad_output), diff.shape, reduction)
    return (jnp.clip(diff, -delta, delta) * g).astype(self.dtype)


@lowers(aten.binary_cross_entropy.default)
def binary_cross_entropy(self, target, weight=None, reduction=1):
    x, t = upcast(self), upcast(target)
    asserts.check(
        (x >= 0) & (x <= 1), RuntimeError, "all elements of input should be between 0 and 1"
    )
    # CPU clamps each log at -100 so that a saturated input gives a finite loss
    loss = -(t * jnp.maximum(jnp.log(x), -100) + (1 - t) * jnp.maximum(jnp.log1p(-x), -100))
    if weight is not None:
        loss = loss * upcast(weight)
    return _reduce(loss, reduction).astype(self.dtype)


@lowers(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=1):
    x, t = upcast(self), upcast(target)
    g = _reduce_backward(upcast(grad_output), x.shape, reduction)
    grad = g * (x - t) / jnp.maximum((1 - x) * x, 1e-12)
    if weight is not None:
        grad = grad * upcast(weight)
    return grad.astype(self.dtype)


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


# --- multi-class margin losses: the CPU kernels' checks and shapes (PyTorch's decompositions
# word their checks otherwise, check no target values, and give a reduction="none" loss of
# one sample the shape [1])


def _check_scores(x) -> tuple[int, int]:
    """ATen's check of a margin loss's scores, (N, C), (C,) or (); their (N, C)."""
    check(
        (x.ndim == 2 and x.shape[1] != 0) or (x.ndim == 1 and x.shape[0] != 0) or x.ndim == 0,
        lambda: (
            "Expected non-empty vector or matrix with optional 0-dim batch size, but got: "
            f"{list(x.shape)}"
        ),
    )
    return (x.shape[0], x.shape[1]) if x.ndim == 2 else (1, x.shape[0] if x.ndim else 1)


def _check_types(kernel: str, x, *others) -> None:
    """The CPU kernel's dtypes: floating scores (half precision too, as on CUDA), then each
    of ``others``, a (tensor, dtype) pair."""
    name = dtype_name(torch_dtype(x.dtype))
    check(
        jnp.issubdtype(x.dtype, jnp.floating),
        lambda: f"\"{kernel}\" not implemented for '{name}'",
        NotImplementedError,
    )
    for t, dtype in others:
        check(
            t is None or t.dtype == dtype,
            lambda: (
                f"expected scalar type {dtype_name(torch_dtype(dtype))} but found "
                f"{dtype_name(torch_dtype(t.dtype))}"
            ),
        )


def _multi_margin(x, target, p: int, margin, weight, reduction: int):
    """``multi_margin_loss`` of (N, C), (C,) or () scores, as ATen defines it."""
    rows = x.reshape(-1, x.shape[-1] if x.ndim else 1)
    shape, target = target.shape, target.reshape(-1).astype(jnp.int32)
    own = jnp.take_along_axis(rows, target[:, None], axis=1)
    z = margin - own + rows
    terms = z if p == 1 else z * z
    if weight is not None:
        terms = terms * weight[target][:, None]
    other = jnp.arange(rows.shape[1])[None, :] != target[:, None]
    loss = jnp.sum(jnp.where((z > 0) & other, terms, 0), axis=1) / rows.shape[1]
    return _reduce(loss.reshape(shape), reduction)  # (none: [N], or () for a 0-d target)


@lowers(aten.multi_margin_loss.default, static=("p",))
def multi_margin_loss(self, target, p=1, margin=1, weight=None, reduction=1):
    check(int(p) in (1, 2), "only p == 1 and p == 2 supported")
    frames, classes = _check_scores(self)
    check(
        target.ndim <= 1 and target.size == frames,
        lambda: (
            "multi_margin_loss: target tensor should be 1-D with size equal to the number "
            f"of input samples (batch size). Expected target size [{frames}], but got "
            f"{list(target.shape)}. Input has shape {list(self.shape)}."
        ),
    )
    check(
        weight is None or (weight.ndim <= 1 and weight.size == classes),
        lambda: f"inconsistent weight size, expected {classes} but got {list(weight.shape)}",
    )
    if self.size:  # (else the CPU returns before its other checks)
        kernel = "multi_margin_loss_cpu_kernel"
        _check_types(kernel, self, (target, jnp.int64), (weight, self.dtype))
        asserts.check((target >= 0) & (target < classes), RuntimeError, "target out of range")
    return _multi_margin(self, target, int(p), margin, weight, reduction)


@lowers(aten.multi_margin_loss_backward.default, static=("p",))
def multi_margin_loss_backward(grad_output, self, target, p, margin, weight=None, reduction=1):
    def forward(x):
        return _multi_margin(x, target, p, margin, weight, reduction)

    return vjp(forward, (self,), grad_output, (True,))[0]


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


def _is_target(rows, target):
    """Per row, which classes its targets list (up to the first -1)."""
    listed = jnp.cumprod(target >= 0, axis=1).astype(bool)
    classes = jnp.arange(rows.shape[1])
    return jnp.any(listed[:, :, None] & (target[:, :, None] == classes), axis=1)


@lowers(aten.multilabel_margin_loss_forward.default)
def multilabel_margin_loss_forward(self, target, reduction):
    frames, classes = _check_scores(self)
    if self.ndim == 2:
        fits = target.shape == (frames, classes)
    else:
        fits = target.ndim <= 1 and target.size == classes
    check(
        fits,
        lambda: (
            f"inconsistent target size: {list(target.shape)} for input of size: {list(self.shape)}"
        ),
    )
    if self.size:  # (else the CPU returns before its other checks)
        asserts.check(
            (target >= -1) & (target < classes),
            RuntimeError,
            "argument #2 'target' is out of range",
        )
        _check_types("multilabel_margin_loss_forward_out_frame", self, (target, jnp.int64))
    rows = self.reshape(frames, classes)
    is_target = _is_target(rows, target.reshape(frames, classes)).astype(self.dtype)
    is_target = is_target.reshape(target.shape)
    return _multilabel_margin(self, target, is_target, reduction), is_target


@lowers(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target):
    def forward(x):
        return _multilabel_margin(x, target, is_target, reduction)

    return vjp(forward, (self,), grad_output, (True,))[0]
