"""Linear cross-entropy: the loss of ``hidden @ weight.T`` without its [N, V] logits.

A language model's head and loss, ``F.cross_entropy(F.linear(hidden, weight), target)``,
make N x V logits, and their gradient as many again: 4 GiB in float32 at 8192 rows and a
128K vocabulary. These ops work a chunk of rows at a time (``lax.scan``): the forward
keeps each row's log-sum-exp minus its target logit; the backward recomputes each
chunk's logits, forms their softmax, and from it the chunk's rows of ``d_hidden`` and its
share of ``d_weight`` (and ``d_bias``), summed over chunks. Temporary and saved memory is
O(chunk * V + V * D), never O(N * V); the backward kernel gets the inputs alone (no
residuals), so nothing of the forward is kept.

Paths: one, plain JAX, on every platform (TPU, GPU, CPU). Each chunk is one
[chunk, D] x [D, V] matmul forward and three matmuls backward, the shapes XLA's own dot
emitters tile well on each chip; the chunking is what saves the memory, and a Pallas
kernel would re-implement those matmuls without fusing anything XLA does not already
fuse (the softmax and one-hot around them).

Ops (``torch.ops.pjrt``):
    ``linear_cross_entropy(hidden, weight, target, *, ignore_index=-100,
    reduction="mean", chunk_size=None)`` and ``linear_cross_entropy_bias(hidden, weight,
    target, bias, ...)``: the same with a bias [V]. Two ops rather than one with
    ``Tensor? bias``: ``torch_pjrt.kernel`` has no gradient for an Optional tensor input.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch.nn.functional as F
from jax import lax

from torch_pjrt.kernels.decorator import kernel as pjrt_kernel
from torch_pjrt.runtime import asserts

__all__ = [
    "chunked_linear_cross_entropy",
    "chunked_linear_cross_entropy_grads",
    "linear_cross_entropy",
    "linear_cross_entropy_bias",
    "linear_cross_entropy_reference",
]

_LOGITS_BUDGET = 1 << 22  # elements of one chunk's logits: 16 MiB in float32
_REDUCTIONS = ("mean", "sum", "none")
_CONTRACT_D = (((1,), (1,)), ((), ()))  # [c, D] x [V, D] -> [c, V]


def _rows_per_chunk(n: int, v: int, chunk_size: int | None) -> int:
    """Rows per chunk: ``chunk_size``, or as many as keep a chunk's logits in budget."""
    if chunk_size is None:
        chunk_size = max(8, _LOGITS_BUDGET // max(v, 1) // 8 * 8)
    elif chunk_size < 1:
        raise ValueError(
            f"linear_cross_entropy: chunk_size is a number of rows and must be positive, "
            f"got {chunk_size}"
        )
    return max(1, min(chunk_size, n))


def _check_inputs(hidden, weight, target, bias, reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{reduction} is not a valid value for reduction")
    if hidden.ndim != 2 or weight.ndim != 2:
        raise ValueError(
            f"linear_cross_entropy: expected hidden of shape [N, D] and weight of shape "
            f"[V, D] (as nn.Linear stores it), got hidden {list(hidden.shape)} and weight "
            f"{list(weight.shape)}"
        )
    if hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"linear_cross_entropy: hidden {list(hidden.shape)} and weight "
            f"{list(weight.shape)} have different sizes D ({hidden.shape[1]} and "
            f"{weight.shape[1]}); weight is [V, D], as nn.Linear stores it: pass weight, "
            "not weight.T"
        )
    if target.ndim != 1 or target.shape[0] != hidden.shape[0]:
        raise ValueError(
            f"Expected input batch_size ({hidden.shape[0]}) to match target batch_size "
            f"({target.shape[0] if target.ndim else 0}): target is [N] class indices"
        )
    if not jnp.issubdtype(target.dtype, jnp.integer):
        raise TypeError(
            f"linear_cross_entropy: target must hold integer class indices, got {target.dtype}"
        )
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(
            f"linear_cross_entropy: bias must have shape [V] = [{weight.shape[0]}], "
            f"got {list(bias.shape)}"
        )
    dtypes = {hidden.dtype, weight.dtype} | ({bias.dtype} if bias is not None else set())
    if len(dtypes) != 1:
        raise TypeError(
            f"linear_cross_entropy: hidden, weight and bias must have the same dtype, got "
            f"{', '.join(sorted(str(d) for d in dtypes))}; cast them to one"
        )


def _chunked(x, rows: int, fill):
    """x [N, ...] padded with ``fill`` to whole chunks: [N / rows, rows, ...]."""
    pad = -x.shape[0] % rows
    x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1), constant_values=fill)
    return x.reshape(-1, rows, *x.shape[1:])


def _logits(h, weight, bias):
    out = lax.dot_general(h, weight, _CONTRACT_D, preferred_element_type=jnp.float32)
    return out if bias is None else out + bias.astype(jnp.float32)


def chunked_linear_cross_entropy(
    hidden,
    weight,
    target,
    bias=None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    chunk_size: int | None = None,
):
    """``cross_entropy(hidden @ weight.T + bias, target)`` in JAX, a chunk of rows at a
    time; never holds more than one chunk's logits.

    Args:
        hidden: [N, D] floating.
        weight: [V, D], as ``nn.Linear`` stores it.
        target: [N] integer class indices in [0, V), or ``ignore_index``.
        bias: [V] or None.
        ignore_index: target rows that add no loss (and count not to the mean).
        reduction: "mean" (over rows not ignored), "sum" or "none" ([N]).
        chunk_size: rows per chunk; default: as many as keep a chunk's logits under
            4M elements (at least 8).

    Returns:
        The loss, in hidden's dtype (float32 accumulation).
    """
    _check_inputs(hidden, weight, target, bias, reduction)
    n = hidden.shape[0]
    rows = _rows_per_chunk(n, weight.shape[0], chunk_size)

    def step(_, chunk):
        h, t = chunk
        logits = _logits(h, weight, bias)
        valid = t != ignore_index
        picked = jnp.take_along_axis(logits, jnp.where(valid, t, 0)[:, None], 1)[:, 0]
        return None, jnp.where(valid, jax.nn.logsumexp(logits, -1) - picked, 0.0)

    chunks = (_chunked(hidden, rows, 0), _chunked(target, rows, ignore_index))
    _, losses = lax.scan(step, None, chunks)
    losses = losses.reshape(-1)[:n]
    if reduction == "none":
        return losses.astype(hidden.dtype)
    total = jnp.sum(losses)
    if reduction == "mean":
        total = total / jnp.sum(target != ignore_index)  # (0/0: nan, as PyTorch)
    return total.astype(hidden.dtype)


def chunked_linear_cross_entropy_grads(
    hidden,
    weight,
    target,
    bias,
    grad,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    chunk_size: int | None = None,
):
    """The gradients of :func:`chunked_linear_cross_entropy` for the cotangent ``grad``
    (a scalar, or [N] for reduction "none"), recomputing each chunk's logits.

    Returns:
        ``(d_hidden, d_weight, d_bias)``; ``d_bias`` is None when ``bias`` is.
    """
    _check_inputs(hidden, weight, target, bias, reduction)
    n, v = hidden.shape[0], weight.shape[0]
    rows = _rows_per_chunk(n, v, chunk_size)
    valid = target != ignore_index
    g = grad.astype(jnp.float32)
    if reduction == "mean":
        g = g / jnp.sum(valid)
    row_grad = jnp.where(valid, jnp.broadcast_to(g, (n,)), 0.0)  # (ignored rows: none)

    def step(acc, chunk):
        d_weight, d_bias = acc
        h, t, r = chunk
        logits = _logits(h, weight, bias)
        # (ignored and padding rows have r == 0, whatever their one-hot)
        d_logits = (jax.nn.softmax(logits, -1) - jax.nn.one_hot(t, v)) * r[:, None]
        low = d_logits.astype(hidden.dtype)  # (matmul inputs in the inputs' dtype)
        d_h = jnp.dot(low, weight, preferred_element_type=jnp.float32)
        d_weight = d_weight + jnp.dot(low.T, h, preferred_element_type=jnp.float32)
        if d_bias is not None:
            d_bias = d_bias + d_logits.sum(0)
        return (d_weight, d_bias), d_h.astype(hidden.dtype)

    acc = (jnp.zeros(weight.shape, jnp.float32), None if bias is None else jnp.zeros(v))
    chunks = (
        _chunked(hidden, rows, 0),
        _chunked(target, rows, ignore_index),
        _chunked(row_grad, rows, 0.0),
    )
    (d_weight, d_bias), d_hidden = lax.scan(step, acc, chunks)
    d_hidden = d_hidden.reshape(-1, hidden.shape[1])[:n]
    d_bias = None if d_bias is None else d_bias.astype(bias.dtype)
    return d_hidden, d_weight.astype(weight.dtype), d_bias


def linear_cross_entropy_reference(
    hidden, weight, target, bias=None, *, ignore_index: int = -100, reduction: str = "mean"
):
    """The plain JAX reference: all [N, V] logits at once."""
    _check_inputs(hidden, weight, target, bias, reduction)
    logits = _logits(hidden, weight, bias)
    valid = target != ignore_index
    picked = jnp.take_along_axis(logits, jnp.where(valid, target, 0)[:, None], 1)[:, 0]
    losses = jnp.where(valid, jax.nn.logsumexp(logits, -1) - picked, 0.0)
    if reduction == "none":
        return losses.astype(hidden.dtype)
    total = jnp.sum(losses)
    if reduction == "mean":
        total = total / jnp.sum(valid)
    return total.astype(hidden.dtype)


def _check_targets(target, v: int, ignore_index: int) -> None:
    """PyTorch's error for a target outside the classes, read at the next host sync."""
    ok = (target == ignore_index) | ((target >= 0) & (target < v))
    asserts.check(ok, IndexError, "Target {} is out of bounds.", asserts.first_bad(target, ok))


# --- the ops ---------------------------------------------------------------------------


def _torch_reference(hidden, weight, target, bias, *, ignore_index: int, reduction: str):
    return F.cross_entropy(
        F.linear(hidden, weight, bias), target, ignore_index=ignore_index, reduction=reduction
    )


def _backward(hidden, weight, target, grad, **statics):
    d_hidden, d_weight, _ = chunked_linear_cross_entropy_grads(
        hidden, weight, target, None, grad, **statics
    )
    return d_hidden, d_weight, None


def _reference(
    hidden,
    weight,
    target,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    chunk_size: int | None = None,
):
    return _torch_reference(
        hidden, weight, target, None, ignore_index=ignore_index, reduction=reduction
    )


@pjrt_kernel("pjrt::linear_cross_entropy", backward=_backward, reference=_reference)
def linear_cross_entropy(
    hidden,
    weight,
    target,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    chunk_size: int | None = None,
):
    """``F.cross_entropy(hidden @ weight.T, target)`` without the [N, V] logits (see the
    module docstring); arguments as :func:`chunked_linear_cross_entropy`.

    Example:
        >>> h = torch.randn(6, 16, device="pjrt", requires_grad=True)
        >>> w = torch.randn(100, 16, device="pjrt", requires_grad=True)
        >>> t = torch.randint(0, 100, (6,), device="pjrt")
        >>> torch.ops.pjrt.linear_cross_entropy(h, w, t, chunk_size=4).backward()
    """
    loss = chunked_linear_cross_entropy(
        hidden,
        weight,
        target,
        ignore_index=ignore_index,
        reduction=reduction,
        chunk_size=chunk_size,
    )
    _check_targets(target, weight.shape[0], ignore_index)
    return loss


def _backward_bias(hidden, weight, target, bias, grad, **statics):
    d_hidden, d_weight, d_bias = chunked_linear_cross_entropy_grads(
        hidden, weight, target, bias, grad, **statics
    )
    return d_hidden, d_weight, None, d_bias


def _reference_bias(
    hidden,
    weight,
    target,
    bias,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    chunk_size: int | None = None,
):
    return _torch_reference(
        hidden, weight, target, bias, ignore_index=ignore_index, reduction=reduction
    )


@pjrt_kernel("pjrt::linear_cross_entropy_bias", backward=_backward_bias, reference=_reference_bias)
def linear_cross_entropy_bias(
    hidden,
    weight,
    target,
    bias,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    chunk_size: int | None = None,
):
    """:func:`linear_cross_entropy` of ``hidden @ weight.T + bias`` (bias [V])."""
    loss = chunked_linear_cross_entropy(
        hidden,
        weight,
        target,
        bias,
        ignore_index=ignore_index,
        reduction=reduction,
        chunk_size=chunk_size,
    )
    _check_targets(target, weight.shape[0], ignore_index)
    return loss
