"""Interpolation lowerings: upsampling (nearest, linear, bicubic, anti-aliased) and grid
sampling, with their backward ops."""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np
import torch

from torch_pjrt.ops._helpers import vjp
from torch_pjrt.ops._promote import opmath, upcast
from torch_pjrt.ops.registry import lowers

aten = torch.ops.aten


# --- upsampling ----------------------------------------------------------------------


def _ftype(dtype):
    # CPU computes source coordinates and weights in float, or in double for doubles
    return np.float64 if dtype == jnp.float64 else np.float32


def _scale(in_size, out_size, scale, ftype):
    if scale is not None and scale > 0:
        return ftype(1.0 / scale)
    return ftype(in_size) / ftype(out_size)


def _nearest_source(in_size, out_size, scale, exact):
    dst = np.arange(out_size)
    if not exact and out_size == in_size:
        return dst
    if not exact and out_size == 2 * in_size:
        return dst >> 1
    s = _scale(in_size, out_size, scale, np.float32)
    pos = (dst.astype(np.float32) + np.float32(0.5 if exact else 0)) * s
    return np.minimum(np.floor(pos).astype(np.int64), in_size - 1)


def _upsample_nearest(self, output_size, scales, exact):
    n = len(output_size)
    out = self
    for dim in reversed(range(n)):
        axis = self.ndim - n + dim
        src = _nearest_source(self.shape[axis], output_size[dim], scales[dim], exact)
        out = jnp.take(out, jnp.asarray(src), axis=axis)
    return out


def _linear_source(in_size, out_size, align_corners, scale, ftype):
    dst = np.arange(out_size).astype(ftype)
    if align_corners:
        s = ftype(in_size - 1) / ftype(out_size - 1) if out_size > 1 else ftype(0)
        real = s * dst
    else:
        real = np.maximum(
            _scale(in_size, out_size, scale, ftype) * (dst + ftype(0.5)) - ftype(0.5), ftype(0)
        )
    i0 = np.minimum(real.astype(np.int64), in_size - 1)
    i1 = i0 + (i0 < in_size - 1)
    lam1 = np.clip(real - i0.astype(ftype), 0, 1).astype(ftype)
    return i0, i1, ftype(1) - lam1, lam1


def _upsample_linear(self, output_size, align_corners, scales):
    n = len(output_size)
    if self.dtype == jnp.uint8 and n == 2:
        return _bilinear_uint8(self, output_size, align_corners, scales)
    ftype = _ftype(self.dtype)
    out = upcast(self)
    # last dim first, so the sums nest in the order of CPU's bilinear formula
    for dim in reversed(range(n)):
        axis = self.ndim - n + dim
        i0, i1, lam0, lam1 = _linear_source(
            self.shape[axis], output_size[dim], align_corners, scales[dim], ftype
        )
        shape = [1] * out.ndim
        shape[axis] = -1
        w0 = jnp.asarray(lam0.reshape(shape), out.dtype)
        w1 = jnp.asarray(lam1.reshape(shape), out.dtype)
        out = jnp.take(out, jnp.asarray(i0), axis=axis) * w0 + (
            jnp.take(out, jnp.asarray(i1), axis=axis) * w1
        )
    return out.astype(self.dtype)


def _upsample_backward(forward, grad_output, input_size):
    primal = jnp.zeros(tuple(input_size), grad_output.dtype)
    return vjp(forward, (primal,), grad_output, (True,))[0]


def _scales(output_size, scales, scales_d, scales_h, scales_w) -> tuple:
    """The per-dim scale factors of an upsample schema (1d: scales; 2d: h, w; 3d: d, h, w)."""
    return {1: (scales,), 2: (scales_h, scales_w), 3: (scales_d, scales_h, scales_w)}[
        len(output_size)
    ]


def _nearest(exact: bool):
    def upsample(self, output_size, scales=None, scales_d=None, scales_h=None, scales_w=None):
        scale = _scales(output_size, scales, scales_d, scales_h, scales_w)
        return _upsample_nearest(self, tuple(output_size), scale, exact)

    def backward(
        grad_output, output_size, input_size, scales=None, scales_d=None, scales_h=None,
        scales_w=None,
    ):  # fmt: skip
        scale = _scales(output_size, scales, scales_d, scales_h, scales_w)

        def forward(x):
            return _upsample_nearest(x, tuple(output_size), scale, exact)

        return _upsample_backward(forward, grad_output, input_size)

    return upsample, backward


_NEAREST_OPS = (
    (False, "upsample_nearest{}d"),
    (True, "_upsample_nearest_exact{}d"),
)
for _exact, _name in _NEAREST_OPS:
    _forward, _backward = _nearest(_exact)
    lowers(*(getattr(aten, _name.format(n)).default for n in (1, 2, 3)))(_forward)
    lowers(*(getattr(aten, _name.format(n) + "_backward").default for n in (1, 2, 3)))(_backward)


@lowers(
    aten.upsample_linear1d.default,
    aten.upsample_bilinear2d.default,
    aten.upsample_trilinear3d.default,
)
def upsample_linear(
    self, output_size, align_corners, scales=None, scales_d=None, scales_h=None, scales_w=None
):
    scale = _scales(output_size, scales, scales_d, scales_h, scales_w)
    return _upsample_linear(self, tuple(output_size), align_corners, scale)


@lowers(
    aten.upsample_linear1d_backward.default,
    aten.upsample_bilinear2d_backward.default,
    aten.upsample_trilinear3d_backward.default,
)
def upsample_linear_backward(
    grad_output, output_size, input_size, align_corners, scales=None, scales_d=None,
    scales_h=None, scales_w=None,
):  # fmt: skip
    scale = _scales(output_size, scales, scales_d, scales_h, scales_w)

    def forward(x):
        return _upsample_linear(x, tuple(output_size), align_corners, scale)

    return _upsample_backward(forward, grad_output, input_size)


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

    grad_input, grad_grid = vjp(forward, (input, grid), grad_output, (output_mask[0], True))
    return grad_input, grad_grid


# --- bicubic and anti-aliased upsampling ---------------------------------------------


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


def _bilinear_uint8(self, output_size, align_corners, scales):
    """uint8 images as CPU PyTorch resizes them: each axis in its fixed point, the taps'
    weights in double (measured bit for bit; a float computation rounded differs in
    up to 16% of the pixels)."""

    def taps(axis):
        args = (self.shape[axis], output_size[axis - 2], align_corners, scales[axis - 2])
        i0, i1, lam0, lam1 = _linear_source(*args, np.float64)
        weights = np.stack([lam0, lam1])
        return np.stack([i0, i1]), weights, float(weights.max(initial=0))

    return _separable(self, output_size, taps, skip_unchanged=True)


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
