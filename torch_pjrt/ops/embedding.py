"""Embedding lowerings: the backward of ``embedding``, ``embedding_renorm``, embedding
bags (segment sums, means and maxima of rows) with their backward ops, and ``one_hot``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from torch_pjrt.ops._helpers import host_int, run_jitted
from torch_pjrt.ops._promote import opmath
from torch_pjrt.ops.registry import Kernel, Lowering, implements, lowers
from torch_pjrt.runtime import asserts

aten = torch.ops.aten


# --- embeddings ------------------------------------------------------------------


@lowers(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    index = indices.reshape(-1)
    grad = grad_output.reshape(index.size, -1)
    if padding_idx >= 0:
        grad = jnp.where((index == padding_idx)[:, None], jnp.zeros((), grad.dtype), grad)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), grad.dtype).at[index].add(1)
        grad = grad / counts[index][:, None]
    out = jnp.zeros((num_weights, grad.shape[1]), grad.dtype)
    return out.at[index].add(grad)


@lowers(aten.embedding_renorm.default)
def embedding_renorm(self, indices, max_norm, norm_type):
    used = jnp.zeros((self.shape[0],), bool).at[indices.reshape(-1)].set(True)
    norm = jnp.linalg.norm(self.astype(jnp.float32), ord=norm_type, axis=1)
    scale = jnp.where(used & (norm > max_norm), max_norm / (norm + 1e-7), 1.0)
    return (self * scale[:, None].astype(self.dtype)).astype(self.dtype)


# --- embedding bags ------------------------------------------------------------------

_SUM, _MEAN, _MAX = range(3)


def _offset2bag(offsets, n: int, dtype):
    """The bag of each of ``n`` indices: how many offsets are at or before it, less one."""
    return (jnp.searchsorted(offsets, jnp.arange(n), side="right") - 1).astype(dtype)


def _bag_reductions(weight, indices, bag, bags: int, mode: int, per_sample_weights, padding_idx):
    """(output, bag_size, max_indices) of the bags; max_indices only for ``max``."""
    n = indices.shape[0]
    valid = indices != padding_idx if padding_idx >= 0 else jnp.ones(n, bool)
    count = jax.ops.segment_sum(valid.astype(indices.dtype), bag, bags)
    rows = jnp.take(weight.astype(opmath(weight.dtype)), indices, axis=0, mode="clip")
    if mode == _MAX:
        masked = jnp.where(valid[:, None], rows, -jnp.inf)
        best = jax.ops.segment_max(masked, bag, bags)
        # CPU keeps the first index that reaches the maximum
        hit = valid[:, None] & (rows == best[bag])
        where = jnp.where(hit, jnp.arange(n)[:, None], n)
        first = jax.ops.segment_min(where, bag, bags)
        max_indices = jnp.where(first < n, indices[jnp.minimum(first, n - 1)], 0)
        out = jnp.where(count[:, None] > 0, best, 0)
        return out.astype(weight.dtype), count, max_indices.astype(indices.dtype)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.astype(rows.dtype)[:, None]
    out = jax.ops.segment_sum(jnp.where(valid[:, None], rows, 0), bag, bags)
    if mode == _MEAN:
        out = jnp.where(count[:, None] > 0, out / jnp.maximum(count, 1)[:, None], 0)
    return out.astype(weight.dtype), count, None


def _embedding_bag(
    weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx,
    forward_only,
):  # fmt: skip
    n, itype = indices.shape[0], indices.dtype
    rows = weight.shape[0]
    ok = (indices >= 0) & (indices < rows)
    asserts.check(
        ok,
        RuntimeError,
        "Index {} of input takes value {} which is not in the valid range [0, " + f"{rows})",
        jnp.argmin(ok) if n else 0,
        asserts.first_bad(indices, ok),
    )
    bags = offsets.shape[0] - int(include_last_offset)
    # each bag ends where the next begins, the last at the end of indices
    bag = _offset2bag(offsets[:bags], n, itype)
    out, count, max_indices = _bag_reductions(
        weight, indices, jnp.clip(bag, 0, max(bags - 1, 0)), bags, mode,
        per_sample_weights, padding_idx,
    )  # fmt: skip
    if mode == _SUM:
        # CPU leaves bag sizes zero for sums (one per offset in the forward-only op), and
        # skips offset2bag on its fast path (the backward recomputes it)
        count = jnp.zeros(offsets.shape[0] if forward_only else bags, itype)
        fast = padding_idx < 0 and weight.dtype != jnp.float64
        bag = jnp.zeros(0, itype) if fast else bag
    return out, bag, count, count if max_indices is None else max_indices


def _embedding_bag_op(name: str, forward_only: bool):
    """The lowering of one of the two embedding_bag forwards (they differ only in the
    bag sizes a sum reports)."""

    def lowered(
        weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
        per_sample_weights=None, include_last_offset=False, padding_idx=-1,
    ):  # fmt: skip
        return _embedding_bag(
            weight, indices, offsets, mode, per_sample_weights, include_last_offset,
            padding_idx, forward_only=forward_only,
        )  # fmt: skip

    lowered.__name__ = name
    return lowered


lowers(aten._embedding_bag_forward_only.default)(
    _embedding_bag_op("_embedding_bag_forward_only", forward_only=True)
)
lowers(aten._embedding_bag.default)(_embedding_bag_op("_embedding_bag", forward_only=False))


def _cpu_frequency(indices, num_weights: int):
    """The count CPU's dense backward divides each index's gradient by.

    NOTE: CPU (at least through PyTorch 2.x) looks the count up for the k-th smallest
    index rather than for the index itself, where k is the index's rank among the
    distinct indices; mirrored here so gradients match the CPU's.
    """
    counts = jnp.zeros(num_weights, jnp.int64).at[indices].add(1, mode="drop")
    order = jnp.argsort(indices, stable=True)
    ordered = indices[order]
    starts = jnp.concatenate([jnp.ones(1, bool), ordered[1:] != ordered[:-1]])
    rank = jnp.zeros_like(order).at[order].set(jnp.cumsum(starts) - 1)
    return counts[ordered[rank]]


@lowers(aten._embedding_bag_dense_backward.default)
def _embedding_bag_dense_backward(
    grad, indices, offset2bag, bag_size, maximum_indices, num_weights, scale_grad_by_freq,
    mode, per_sample_weights, padding_idx=-1,
):  # fmt: skip
    d = grad.shape[-1]
    out = jnp.zeros((num_weights, d), grad.dtype)
    if mode == _MAX:
        nonempty = (bag_size > 0)[:, None]
        rows = jnp.where(nonempty, maximum_indices, num_weights)
        return out.at[rows, jnp.arange(d)].add(grad, mode="drop")
    scale = jnp.ones(indices.shape, grad.dtype)
    if scale_grad_by_freq:
        scale = scale / _cpu_frequency(indices, num_weights).astype(grad.dtype)
    if mode == _MEAN:
        size = bag_size[offset2bag]
        scale = jnp.where(size > 0, scale / jnp.maximum(size, 1), scale)
    if per_sample_weights is not None:
        scale = scale * per_sample_weights.astype(grad.dtype)
    rows = indices if padding_idx < 0 else jnp.where(indices == padding_idx, num_weights, indices)
    return out.at[rows].add(grad[offset2bag] * scale[:, None], mode="drop")


@lowers(aten._embedding_bag_backward.default)
def _embedding_bag_backward(
    grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
    scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx=-1,
):  # fmt: skip
    # NOTE: a dense gradient also for sparse=True (JAX has no sparse COO result)
    return _embedding_bag_dense_backward(
        grad, indices, _full_offset2bag(offset2bag, offsets, indices), bag_size,
        maximum_indices, num_weights, scale_grad_by_freq, mode, per_sample_weights, padding_idx,
    )  # fmt: skip


def _full_offset2bag(offset2bag, offsets, indices):
    """The forward's offset2bag, or (when its fast path left it out) one from offsets."""
    n = indices.shape[0]
    return offset2bag if offset2bag.shape[0] == n else _offset2bag(offsets, n, indices.dtype)


@lowers(aten._embedding_bag_per_sample_weights_backward.default)
def _embedding_bag_per_sample_weights_backward(
    grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1
):
    offset2bag = _full_offset2bag(offset2bag, offsets, indices)
    rows = jnp.take(weight, indices, axis=0, mode="clip")
    dots = jnp.sum(grad[offset2bag] * rows, axis=-1)
    if padding_idx >= 0:
        dots = jnp.where(indices == padding_idx, 0, dots)
    return dots.astype(grad.dtype)


# --- one_hot: a raw kernel, for the CPU's checks (ATen's leaves them to scatter's) ----


def _one_hot(self, num_classes):
    """``one_hot`` of int64 class values, checked on the device in the CPU's words (on
    PrivateUse1, ATen's one_hot is a scatter, and its index check speaks of indices)."""
    asserts.check(self >= 0, RuntimeError, "Class values must be non-negative.")
    asserts.check(
        self < num_classes, RuntimeError, "Class values must be smaller than num_classes."
    )
    classes = jnp.arange(num_classes, dtype=self.dtype)
    return (self[..., None] == classes).astype(jnp.int64)


_ONE_HOT = Kernel(aten.one_hot.default, Lowering(_one_hot))


@implements(aten.one_hot.default)
def one_hot(self, num_classes=-1):
    if self.dtype != torch.int64:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    if self.numel() == 0 and num_classes <= 0:
        raise RuntimeError("Can not infer total number of classes from empty tensor.")
    if num_classes == -1:  # as ATen does: the classes are read on the host
        num_classes = host_int(run_jitted(jnp.max, self)) + 1
    # (fewer than 0 classes: every value is refused, as with 0)
    return _ONE_HOT(self, max(num_classes, 0))
