"""Histogram lowerings: ``histc``, ``histogram``, ``histogramdd`` and ``bincount`` (whose
length depends on the values, read on the host)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_pjrt.ops._helpers import (
    check,
    is_bool,
    is_float,
    run_jitted,
    spaced,
    unsupported,
)
from torch_pjrt.ops._promote import is_low_float
from torch_pjrt.ops.registry import Kernel, Lowering, implements, lowers
from torch_pjrt.ops.variants import resize_output
from torch_pjrt.runtime import events as metrics

aten = torch.ops.aten


# --- histograms ----------------------------------------------------------------------

# how a value finds its bin: CPU's algorithms for evenly spaced edges (linear, and
# linear corrected by a search among the neighbouring edges) and for given edges
_LINEAR, _LOCAL_SEARCH, _BINARY_SEARCH = range(3)


def _rounded(x):
    """``x`` rounded to its (half) dtype: XLA may keep half-type steps in float32."""
    if not is_low_float(x.dtype):
        return x
    info = jnp.finfo(x.dtype)
    return jax.lax.reduce_precision(x, exponent_bits=info.nexp, mantissa_bits=info.nmant)


def _bin_position(values, edges, search: int):
    """The bin of each value (for values inside the edges); n bins: n+1 edges."""
    n = edges.shape[0] - 1
    if search == _BINARY_SEARCH:
        return jnp.searchsorted(edges, values, side="right") - 1
    # XLA turns a division by a broadcast scalar into a multiplication by its inexact
    # reciprocal: divide by a full array behind a barrier
    width = _rounded(edges[-1] - edges[0])
    width = jax.lax.optimization_barrier(jnp.broadcast_to(width, values.shape))
    shifted = _rounded(values - edges[0])
    pos = jnp.trunc(_rounded(_rounded(shifted * n) / width))
    pos = jnp.clip(jnp.where(jnp.isnan(pos), 0, pos), 0, n).astype(jnp.int32)
    if search == _LINEAR:
        return pos
    lo = jnp.maximum(pos - 1, 0)
    hi = jnp.minimum(pos + 2, n + 1)
    count = 0
    for k in range(3):
        i = lo + k
        count = count + ((i < hi) & (edges[jnp.minimum(i, n)] <= values))
    return lo + count - 1


def _histogramdd(x, edges, weight, density: bool, search: int):
    """Counts (or weights) of the rows of ``x`` (M, D) in the D-dim bins of ``edges``."""
    shape = tuple(e.shape[0] - 1 for e in edges)
    index = jnp.zeros(x.shape[0], jnp.int32)
    inside = jnp.ones(x.shape[0], bool)
    for d, (e, n) in enumerate(zip(edges, shape)):
        v = x[:, d]
        inside &= (v >= e[0]) & (v <= e[-1])
        # the last bin holds its right edge too
        index = index * n + jnp.minimum(_bin_position(v, e, search), n - 1)
    size = int(np.prod(shape))
    amounts = jnp.ones(x.shape[0], x.dtype) if weight is None else weight.reshape(-1)
    hist = jnp.zeros(size, x.dtype).at[jnp.where(inside, index, size)].add(amounts, mode="drop")
    hist = hist.reshape(shape)
    if density:
        hist = hist / jnp.sum(hist)
        for d, e in enumerate(edges):
            lengths = jnp.diff(e).reshape((1,) * d + (-1,) + (1,) * (len(edges) - d - 1))
            hist = hist / lengths
    return hist


def _outer_edges(x, range_):
    """Per column of ``x`` (M, D): the outer edges (float64), from ``range`` or the data
    ([0, 1] without data), an empty range widened by 0.5 each way."""
    d = x.shape[1]
    if range_ is not None:
        lo = jnp.asarray(range_[0::2], jnp.float64)
        hi = jnp.asarray(range_[1::2], jnp.float64)
    elif x.shape[0] > 0:
        lo, hi = jnp.min(x, axis=0).astype(jnp.float64), jnp.max(x, axis=0).astype(jnp.float64)
    else:
        lo, hi = jnp.zeros(d, jnp.float64), jnp.ones(d, jnp.float64)
    empty = lo == hi
    return jnp.where(empty, lo - 0.5, lo), jnp.where(empty, hi + 0.5, hi)


def _even_edges(lo, hi, bins, dtype):
    return [spaced(lo[d], hi[d], n + 1, dtype) for d, n in enumerate(bins)]


def _as_rows(self, columns: int):
    return self.reshape(-1, columns)


@lowers(aten.histc.default)
def histc(self, bins=100, min=0, max=0):
    if not is_float(self):  # (the CPU's kernels: its bins' linspace, then the histogram)
        raise unsupported("linspace" if is_bool(self) else "histogram", self)
    lo, hi = jnp.asarray(min, jnp.float64), jnp.asarray(max, jnp.float64)
    if self.size:
        data_lo, data_hi = jnp.min(self).astype(jnp.float64), jnp.max(self).astype(jnp.float64)
        lo, hi = jnp.where(lo == hi, data_lo, lo), jnp.where(lo == hi, data_hi, hi)
    empty = lo == hi
    lo, hi = jnp.where(empty, lo - 1, lo), jnp.where(empty, hi + 1, hi)
    edges = spaced(lo, hi, bins + 1, self.dtype)
    return _histogramdd(_as_rows(self, 1), [edges], None, False, _LINEAR)


@lowers(aten.histogram.bin_ct)
def histogram_bin_ct(self, bins=100, range=None, weight=None, density=False):
    x = _as_rows(self, 1)
    lo, hi = _outer_edges(x, range)
    edges = _even_edges(lo, hi, [bins], self.dtype)
    return _histogramdd(x, edges, weight, density, _LOCAL_SEARCH), edges[0]


@lowers(aten.histogram.bins_tensor)
def histogram_bins_tensor(self, bins, weight=None, density=False):
    hist = _histogramdd(_as_rows(self, 1), [bins], weight, density, _BINARY_SEARCH)
    return hist, bins


def _check_histogramdd(self, bins, range_, counts: bool) -> None:
    """ATen's checks of ``histogramdd``'s shapes, bin counts and range, in its words."""
    check(self.ndim >= 2, "torch.histogramdd: input tensor should have at least 2 dimensions")
    n = self.shape[-1]
    check(
        len(bins) == n,
        "histogramdd: The size of bins must be equal to the innermost dimension of the input.",
    )
    if counts:
        for dim, count in enumerate(bins):
            check(
                count > 0,
                lambda: f"torch.histogram(): bins must be > 0, but got {count} for dimension {dim}",
            )
    if range_ is None:
        return
    check(
        len(range_) == 2 * n,
        lambda: (
            f"torch.histogramdd: for a {n}-dimensional histogram range should have {2 * n} "
            f"elements, but got {len(range_)}"
        ),
    )
    for dim, (lo, hi) in enumerate(zip(range_[0::2], range_[1::2])):
        check(
            lo <= hi,
            lambda: (
                f"torch.histogramdd: min should not exceed max, but got min {lo:g} max "
                f"{hi:g} for dimension {dim}"
            ),
        )


@lowers(aten._histogramdd_bin_edges.default)
def _histogramdd_bin_edges(self, bins, range=None, weight=None, density=False):
    _check_histogramdd(self, bins, range, counts=False)
    lo, hi = _outer_edges(_as_rows(self, self.shape[-1]), range)
    return _even_edges(lo, hi, bins, self.dtype)


@lowers(aten._histogramdd_from_bin_cts.default)
def _histogramdd_from_bin_cts(self, bins, range=None, weight=None, density=False):
    _check_histogramdd(self, bins, range, counts=True)
    x = _as_rows(self, self.shape[-1])
    lo, hi = _outer_edges(x, range)
    return _histogramdd(x, _even_edges(lo, hi, bins, self.dtype), weight, density, _LOCAL_SEARCH)


@lowers(aten._histogramdd_from_bin_tensors.default)
def _histogramdd_from_bin_tensors(self, bins, weight=None, density=False):
    x = _as_rows(self, self.shape[-1])
    return _histogramdd(x, list(bins), weight, density, _BINARY_SEARCH)


# --- bincount: the length depends on the values ---------------------------------------


def _bincount_lowering(self, weights=None, minlength=0):
    # called with minlength = the full output length, read on the host
    if weights is None:
        amounts, dtype = jnp.ones(self.shape, jnp.int64), jnp.int64
    else:
        dtype = jnp.float32 if weights.dtype == jnp.float32 else jnp.float64
        amounts = weights.astype(dtype)
    return jnp.zeros(minlength, dtype).at[self].add(amounts, mode="drop")


def _extremes(x):
    return jnp.stack([jnp.min(x), jnp.max(x)]).astype(jnp.int64)


_BINCOUNT = Kernel(aten.bincount.default, Lowering(_bincount_lowering))


@implements(aten.bincount.default)
def bincount(self, weights=None, minlength=0):
    if self.is_floating_point() or self.is_complex():
        raise unsupported("bincount", self)
    if self.dim() != 1:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is not None and (weights.dim() != 1 or weights.shape[0] != self.shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    length = minlength
    if self.numel():
        metrics.host_sync()
        low, high = (int(v) for v in jax.device_get(run_jitted(_extremes, self)))
        if low < 0:
            raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
        length = max(length, high + 1)
    return _BINCOUNT(self, weights, minlength=length)


@implements(aten.bincount.out)
def bincount_out(self, weights=None, minlength=0, *, out):
    result = bincount(self, weights, minlength)
    resize_output(out, result.shape)
    return out.copy_(result)
