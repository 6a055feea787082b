"""Lowerings of sampling, histogram and distance ops: grid sampling, bicubic and
anti-aliased interpolation, histograms, bin counts, pairwise distances, embedding bags."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_pjrt.diagnostics import metrics
from torch_pjrt.ops._promote import is_low_float, opmath
from torch_pjrt.ops.creation import _spaced
from torch_pjrt.ops.indexing import _run
from torch_pjrt.ops.nn import _upsample_backward, _vjp
from torch_pjrt.ops.registry import Kernel, Lowering, implements, lowers, resize_output

aten = torch.ops.aten

# grid_sampler's integer enums
_BILINEAR, _NEAREST, _BICUBIC = range(3)
_ZEROS, _BORDER, _REFLECTION = range(3)

# the cubic convolution constant of CPU's bicubic kernels (OpenCV's)
_CUBIC_A = -0.75


def _cubic_near(x, a=_CUBIC_A):
    """The cubic convolution kernel at distance ``x`` <= 1."""
    return ((a + 2) * x - (a + 3)) * x * x + 1


def _cubic_far(x, a=_CUBIC_A):
    """The cubic convolution kernel at distance 1 < ``x`` < 2."""
    return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a


# --- grid sampling -------------------------------------------------------------------


def _unnormalize(coord, size: int, align_corners: bool):
    """Grid coordinates in [-1, 1] to pixel coordinates along an axis of ``size``."""
    if align_corners:
        return (coord + 1) * ((size - 1) / 2)
    return (coord + 1) * (size / 2) - 0.5


def _clip(x, size: int):
    # NaN goes to 0, as CPU's vectorized clamp does
    return jnp.minimum(jnp.where(x > 0, x, 0), size - 1)


def _reflect(x, size: int, align_corners: bool):
    """Reflect ``x`` about the image borders until it lands inside them."""
    if align_corners:
        if size <= 1:
            return jnp.zeros_like(x)
        low, twice_span = 0.0, 2.0 * (size - 1)
    else:
        low, twice_span = -0.5, 2.0 * size
    dist = jnp.abs(x - low)
    extra = dist - jnp.trunc(dist / twice_span) * twice_span
    return jnp.minimum(extra, twice_span - extra) + low


def _pad_coordinate(x, size: int, padding: int, align_corners: bool):
    """Where a pixel coordinate reads under ``padding`` (zeros: unchanged, masked later)."""
    if padding == _REFLECTION:
        x = _reflect(x, size, align_corners)
    if padding != _ZEROS:
        x = _clip(x, size)
    return x


def _gather(input, points):
    """``input[n, :, *point]`` for integer-valued float points, 0 outside the image.

    ``points`` holds one array of shape (N, *out) per spatial dim of ``input``.
    """
    n, c, *spatial = input.shape
    out_shape = points[0].shape
    inside = jnp.ones(out_shape, bool)
    flat_index = jnp.zeros(out_shape, jnp.int32)
    for p, size in zip(points, spatial):
        inside &= (p >= 0) & (p <= size - 1)
        i = jnp.clip(jnp.where(jnp.isnan(p), 0, p), 0, size - 1).astype(jnp.int32)
        flat_index = flat_index * size + i
    flat_index = flat_index.reshape(n, 1, -1)
    values = jnp.take_along_axis(
        input.reshape(n, c, -1), jnp.broadcast_to(flat_index, (n, c, flat_index.shape[-1])), axis=2
    ).reshape(n, c, *out_shape[1:])
    return jnp.where(inside[:, None], values, 0)


def _grid_coordinates(grid, spatial):
    """Per spatial dim (in input order), the grid's coordinates: x is the last dim."""
    k = len(spatial)
    return [grid[..., k - 1 - d] for d in range(k)]


def _sample_linear(input, coords):
    floors = [jnp.floor(x) for x in coords]
    fractions = [x - f for x, f in zip(coords, floors)]
    out = 0
    for corner in itertools.product((0, 1), repeat=len(coords)):
        weight = 1
        for t, side in zip(fractions, corner):
            weight = weight * (t if side else 1 - t)
        values = _gather(input, [f + side for f, side in zip(floors, corner)])
        out = out + values * weight[:, None]
    return out


def _grid_cubic_weights(t):
    return _cubic_far(t + 1), _cubic_near(t), _cubic_near(1 - t), _cubic_far(2 - t)


def _sample_cubic(input, coords, padding, align_corners):
    (y, x), (h, w) = coords, input.shape[2:]
    fy, fx = jnp.floor(y), jnp.floor(x)
    wy, wx = _grid_cubic_weights(y - fy), _grid_cubic_weights(x - fx)
    out = 0
    for i in range(4):
        py = _pad_coordinate(fy + (i - 1), h, padding, align_corners)
        row = 0
        for j in range(4):
            px = _pad_coordinate(fx + (j - 1), w, padding, align_corners)
            row = row + _gather(input, [py, px]) * wx[j][:, None]
        out = out + row * wy[i][:, None]
    return out


def _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners):
    # NOTE: in the input's dtype: CPU rounds half types after each step too
    spatial = input.shape[2:]
    coords = [
        _unnormalize(c, size, align_corners)
        for c, size in zip(_grid_coordinates(grid, spatial), spatial)
    ]
    if interpolation_mode == _BICUBIC:
        return _sample_cubic(input, coords, padding_mode, align_corners)
    coords = [
        _pad_coordinate(c, size, padding_mode, align_corners) for c, size in zip(coords, spatial)
    ]
    if interpolation_mode == _NEAREST:
        return _gather(input, [jnp.round(c) for c in coords])
    return _sample_linear(input, coords)


@lowers(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)
def grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners)


@lowers(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default)
def grid_sampler_backward(
    grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask
):
    def forward(input, grid):
        return _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners)

    grad_input, grad_grid = _vjp(forward, (input, grid), grad_output, (output_mask[0], True))
    return grad_input, grad_grid


# --- bicubic and anti-aliased upsampling ---------------------------------------------


def _ftype(dtype):
    # CPU computes source coordinates and weights in float, or in double for doubles
    return np.float64 if dtype == jnp.float64 else np.float32


def _source_scale(in_size: int, out_size: int, align_corners: bool, scale, ftype):
    """Input pixels per output pixel, as CPU's upsampling kernels compute it."""
    if align_corners:
        return ftype(in_size - 1) / ftype(out_size - 1) if out_size > 1 else ftype(0)
    if scale is not None and scale > 0:
        return ftype(1.0 / scale)
    return ftype(in_size) / ftype(out_size)


def _cubic_taps(in_size, out_size, align_corners, scale, ftype):
    """(indices, weights), each (4, out_size): bicubic's taps along one axis."""
    s = _source_scale(in_size, out_size, align_corners, scale, ftype)
    dst = np.arange(out_size, dtype=ftype)
    real = s * dst if align_corners else s * (dst + ftype(0.5)) - ftype(0.5)
    base = np.minimum(np.floor(real).astype(np.int64), in_size - 1)
    t = np.clip(real - base.astype(ftype), ftype(0), ftype(1))
    one = ftype(1)
    weights = [_cubic_far(t + one), _cubic_near(t), _cubic_near(one - t), _cubic_far(one - t + one)]
    indices = np.clip(base + np.arange(-1, 3)[:, None], 0, in_size - 1)
    return indices, np.stack(weights).astype(ftype)


def _aa_linear(x):
    x = np.abs(x)
    return np.where(x < 1, 1 - x, 0).astype(x.dtype)


def _aa_cubic(x):
    # Keys' a = -0.5 with antialiasing, as Pillow
    x = np.abs(x)
    inner, outer = _cubic_near(x, -0.5), _cubic_far(x, -0.5)
    return np.where(x < 1, inner, np.where(x < 2, outer, 0)).astype(x.dtype)


def _aa_taps(in_size, out_size, align_corners, scale, ftype, kernel, interp_size):
    """(indices, weights), each (taps, out_size): an anti-aliasing filter's taps, the
    filter stretched by the downscaling factor and normalized to sum 1 (zero-padded)."""
    s = _source_scale(in_size, out_size, align_corners, scale, ftype)
    stretch = float(s) >= 1.0
    support = ftype(interp_size * 0.5 * float(s) if stretch else interp_size * 0.5)
    invscale = ftype(1.0 / float(s) if stretch else 1.0)
    taps = int(np.ceil(support)) * 2 + 1
    indices = np.zeros((taps, out_size), np.int64)
    weights = np.zeros((taps, out_size), ftype)
    for i in range(out_size):
        center = ftype(float(s) * (i + 0.5))
        lo = max(int(float(center - support) + 0.5), 0)
        n = min(max(min(int(float(center + support) + 0.5), in_size) - lo, 0), taps)
        src = np.arange(lo, lo + n)
        offset = (src.astype(ftype) - center).astype(np.float64)
        w = kernel(((offset + 0.5) * float(invscale)).astype(ftype))
        total = ftype(0)
        for v in w:  # CPU's sequential sum
            total = ftype(total + v)
        if total != 0:
            w = w / total
        indices[:n, i] = src
        weights[:n, i] = w
    return indices, weights


def _resample_axis(x, axis: int, indices, weights):
    """sum over taps j of ``x.take(indices[j], axis) * weights[j]``, in tap order."""
    shape = [1] * x.ndim
    shape[axis] = -1
    out = None
    for index, weight in zip(indices, weights):
        term = jnp.take(x, jnp.asarray(index), axis=axis) * jnp.asarray(
            weight.reshape(shape), x.dtype
        )
        out = term if out is None else out + term
    return out


def _cubic_taps_bounded(in_size, out_size, align_corners, scale):
    """Bicubic taps for uint8 images, in double: out-of-image taps fold onto the edge
    pixels. Also the running maximum weight CPU sizes its fixed point by."""
    s = _source_scale(in_size, out_size, align_corners, scale, np.float64)
    indices = np.zeros((4, out_size), np.int64)
    weights = np.zeros((4, out_size), np.float64)
    wt_max = 0.0
    for i in range(out_size):
        real = float(s) * i if align_corners else float(s) * (i + 0.5) - 0.5
        base = min(int(np.floor(np.float32(real))), in_size - 1)
        t = min(max(real - base, 0.0), 1.0)
        lo = max(base - 1, 0)
        n = min(max(min(base + 3, in_size) - lo, 0), 4)
        slot = 0
        for j in range(4):
            x = abs(j - 1 - t)
            w = float(_cubic_near(x)) if x < 1 else float(_cubic_far(x)) if x < 2 else 0.0
            if base - 1 + j <= 0:
                slot = 0
            elif base - 1 + j >= in_size - 1:
                slot = n - 1
            weights[slot, i] += w
            wt_max = max(wt_max, weights[slot, i])
            slot += 1
        indices[:n, i] = np.arange(lo, lo + n)
    return indices, weights, wt_max


def _fixed_point(weights, wt_max):
    """CPU's int16 weights for uint8 images: (weights, fraction bits)."""
    bits = 0
    while bits < 22 and int(0.5 + wt_max * (1 << (bits + 1))) < (1 << 15):
        bits += 1
    scaled = weights * (1 << bits)
    return np.trunc(np.where(scaled < 0, scaled - 0.5, scaled + 0.5)).astype(np.int32), bits


def _resample_axis_fixed(x, axis: int, indices, weights, wt_max):
    """One uint8 pass in CPU's fixed point: integer sums, rounded, saturated."""
    weights, bits = _fixed_point(weights, wt_max)
    total = _resample_axis(x.astype(jnp.int32), axis, indices, weights) + (1 << (bits - 1))
    return jnp.clip(jnp.right_shift(total, bits), 0, 255).astype(x.dtype)


def _separable(self, output_size, taps, skip_unchanged: bool):
    """Resample the last two dims one at a time, the last first, with ``taps(axis)``:
    (indices, weights) for floats; (indices, double weights, max weight) for uint8."""
    out = self if self.dtype == jnp.uint8 else self.astype(opmath(self.dtype))
    for axis in (3, 2):
        unchanged = self.shape[axis] == output_size[axis - 2]
        if unchanged and (skip_unchanged or self.dtype == jnp.uint8):
            continue
        if self.dtype == jnp.uint8:
            out = _resample_axis_fixed(out, axis, *taps(axis))
        else:
            out = _resample_axis(out, axis, *taps(axis))
    return out.astype(self.dtype)


def _upsample_bicubic(self, output_size, align_corners, scales):
    dtype, ftype = self.dtype, _ftype(self.dtype)

    def taps(axis):
        args = (self.shape[axis], output_size[axis - 2], align_corners, scales[axis - 2])
        if dtype == jnp.uint8:
            return _cubic_taps_bounded(*args)
        indices, weights = _cubic_taps(*args, ftype)
        return indices, weights.astype(dtype)  # weights are stored in the input's dtype

    # the height taps outermost, as in CPU's nested sums
    return _separable(self, output_size, taps, skip_unchanged=False)


def _upsample_aa(self, output_size, align_corners, scales, kernel, interp_size):
    ftype = np.float64 if self.dtype == jnp.uint8 else _ftype(self.dtype)

    def taps(axis):
        in_size, out_size = self.shape[axis], output_size[axis - 2]
        indices, weights = _aa_taps(
            in_size, out_size, align_corners, scales[axis - 2], ftype, kernel, interp_size
        )
        if self.dtype == jnp.uint8:
            return indices, weights, max(float(weights.max(initial=0)), 0.0)
        return indices, weights

    return _separable(self, output_size, taps, skip_unchanged=True)


def _upsample_forward(mode: str):
    if mode == "bicubic":
        return _upsample_bicubic
    kernel, interp_size = {"bilinear_aa": (_aa_linear, 2), "bicubic_aa": (_aa_cubic, 4)}[mode]

    def forward(self, output_size, align_corners, scales):
        return _upsample_aa(self, output_size, align_corners, scales, kernel, interp_size)

    return forward


def _upsample_lowerings(mode: str):
    forward = _upsample_forward(mode)

    def upsample(self, output_size, align_corners, scales_h=None, scales_w=None):
        return forward(self, tuple(output_size), align_corners, (scales_h, scales_w))

    def backward(grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
        def fn(x):
            return forward(x, tuple(output_size), align_corners, (scales_h, scales_w))

        return _upsample_backward(fn, grad_output, input_size)

    return upsample, backward


for _mode, _name in (
    ("bicubic", "upsample_bicubic2d"),
    ("bilinear_aa", "_upsample_bilinear2d_aa"),
    ("bicubic_aa", "_upsample_bicubic2d_aa"),
):
    _forward, _backward = _upsample_lowerings(_mode)
    lowers(getattr(aten, _name).default)(_forward)
    lowers(getattr(aten, _name + "_backward").default)(_backward)


# --- pairwise distances --------------------------------------------------------------


def _p_norm(diff, p: float):
    """The p-norm over the last axis as cdist defines it (p=0 counts nonzeros)."""
    a = jnp.abs(diff)
    if diff.shape[-1] == 0:
        return jnp.zeros(diff.shape[:-1], diff.dtype)
    if p == 0:
        return jnp.sum((a != 0).astype(a.dtype), axis=-1)
    if p == 1:
        return jnp.sum(a, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=-1))
    if p == float("inf"):
        return jnp.max(a, axis=-1)
    return jnp.sum(a**p, axis=-1) ** (1 / p)


def _p_norm_grad(diff, dist, p: float):
    """d dist / d diff, with CPU's zeros where the norm is not differentiable."""
    a, sign = jnp.abs(diff), jnp.sign(diff)
    zero = jnp.zeros_like(diff)
    if p == 0 or diff.size == 0:
        return zero
    if p == 1:
        return sign
    if p == float("inf"):
        return sign * (a == dist)
    safe_dist = jnp.where(dist == 0, 1, dist)
    if p == 2:
        return jnp.where(dist == 0, zero, diff / safe_dist)
    if p < 2:
        undefined = (dist == 0) | ((diff == 0) & (p < 1))
        return jnp.where(undefined, zero, sign * a ** (p - 1) / safe_dist ** (p - 1))
    return jnp.where(dist == 0, zero, diff * a ** (p - 2) / safe_dist ** (p - 1))


def _broadcast_batches(x1, x2):
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    return (
        jnp.broadcast_to(x1, batch + x1.shape[-2:]),
        jnp.broadcast_to(x2, batch + x2.shape[-2:]),
    )


def _euclidean_by_matmul(x1, x2):
    """CPU's matrix-product form: |a|^2 - 2 a.b + |b|^2, clamped at 0."""
    n1 = jnp.sum(x1 * x1, axis=-1, keepdims=True)
    n2 = jnp.sum(x2 * x2, axis=-1, keepdims=True)
    a = jnp.concatenate([-2 * x1, n1, jnp.ones_like(n1)], axis=-1)
    b = jnp.concatenate([x2, jnp.ones_like(n2), n2], axis=-1)
    squared = jnp.matmul(a, jnp.swapaxes(b, -1, -2), precision=jax.lax.Precision.HIGHEST)
    return jnp.sqrt(jnp.maximum(squared, 0))


@lowers(aten._cdist_forward.default)
def _cdist_forward(x1, x2, p, compute_mode):
    x1, x2 = _broadcast_batches(x1, x2)
    r1, r2 = x1.shape[-2], x2.shape[-2]
    mode = compute_mode or 0
    if x1.size and x2.size and p == 2 and (mode == 1 or (mode == 0 and max(r1, r2) > 25)):
        return _euclidean_by_matmul(x1, x2)
    return _p_norm(x1[..., :, None, :] - x2[..., None, :, :], p)


@lowers(aten._cdist_backward.default)
def _cdist_backward(grad, x1, x2, p, cdist):
    x1, x2 = _broadcast_batches(x1, x2)
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    per_pair = _p_norm_grad(diff, cdist[..., None], p) * grad[..., None]
    return jnp.sum(per_pair, axis=-2)


def _pairs(n: int):
    """Row indices (i, j), i < j, in pdist's row-major order."""
    i, j = np.triu_indices(n, k=1)
    return jnp.asarray(i), jnp.asarray(j)


@lowers(aten._pdist_forward.default)
def _pdist_forward(self, p=2.0):
    i, j = _pairs(self.shape[0])
    return _p_norm(self[i] - self[j], p)


@lowers(aten._pdist_backward.default)
def _pdist_backward(grad, self, p, pdist):
    i, j = _pairs(self.shape[0])
    per_pair = _p_norm_grad(self[i] - self[j], pdist[:, None], p) * grad[:, None]
    return jnp.zeros_like(self).at[i].add(per_pair).at[j].add(-per_pair)


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
    return [_spaced(lo[d], hi[d], n + 1, dtype) for d, n in enumerate(bins)]


def _as_rows(self, columns: int):
    return self.reshape(-1, columns)


@lowers(aten.histc.default)
def histc(self, bins=100, min=0, max=0):
    lo, hi = jnp.asarray(min, jnp.float64), jnp.asarray(max, jnp.float64)
    if self.size:
        data_lo, data_hi = jnp.min(self).astype(jnp.float64), jnp.max(self).astype(jnp.float64)
        lo, hi = jnp.where(lo == hi, data_lo, lo), jnp.where(lo == hi, data_hi, hi)
    empty = lo == hi
    lo, hi = jnp.where(empty, lo - 1, lo), jnp.where(empty, hi + 1, hi)
    edges = _spaced(lo, hi, bins + 1, self.dtype)
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


@lowers(aten._histogramdd_bin_edges.default)
def _histogramdd_bin_edges(self, bins, range=None, weight=None, density=False):
    lo, hi = _outer_edges(_as_rows(self, self.shape[-1]), range)
    return _even_edges(lo, hi, bins, self.dtype)


@lowers(aten._histogramdd_from_bin_cts.default)
def _histogramdd_from_bin_cts(self, bins, range=None, weight=None, density=False):
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
    if self.dim() != 1 or self.is_floating_point() or self.is_complex():
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is not None and (weights.dim() != 1 or weights.shape[0] != self.shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    length = minlength
    if self.numel():
        metrics.host_sync()
        low, high = (int(v) for v in jax.device_get(_run(_extremes, self)))
        if low < 0:
            raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
        length = max(length, high + 1)
    return _BINCOUNT(self, weights, minlength=length)


@implements(aten.bincount.out)
def bincount_out(self, weights=None, minlength=0, *, out):
    result = bincount(self, weights, minlength)
    resize_output(out, result.shape)
    return out.copy_(result)


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
