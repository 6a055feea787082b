"""Neural-network lowerings: convolution, normalization, softmax, pooling, losses,
upsampling and attention, with the backward ops their autograd formulas call."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_pjrt.ops._promote import is_low_float as _is_low_float
from torch_pjrt.ops._promote import opmath as _opmath
from torch_pjrt.ops.linalg import matmul_precision
from torch_pjrt.ops.registry import lowers
from torch_pjrt.runtime.transfer import jax_dtype as _jax_dtype

aten = torch.ops.aten

HIGHEST = jax.lax.Precision.HIGHEST


# --- small shared pieces -------------------------------------------------------------


def _up(x):
    return x.astype(_opmath(x.dtype))


def _expand(values, n: int) -> tuple:
    values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
    return values * n if len(values) == 1 else values


def _vjp(fn, primals, cotangent, mask):
    """Gradients of ``fn`` at ``primals``, None where ``mask`` is False."""
    if not any(mask):
        return (None,) * len(primals)
    _, pullback = jax.vjp(fn, *primals)
    grads = pullback(cotangent.astype(_result_dtype(fn, primals)))
    return tuple(g if m else None for g, m in zip(grads, mask))


def _result_dtype(fn, primals):
    return jax.eval_shape(fn, *primals).dtype


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


# --- convolution ---------------------------------------------------------------------


def _conv_numbers(n: int):
    spatial = "DHW"[-n:] if n <= 3 else None
    if spatial is None:
        raise NotImplementedError(f"pjrt: {n}-d convolution is not supported")
    return ("NC" + spatial, "OI" + spatial, "NC" + spatial)


def _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups):
    n = weight.ndim - 2
    stride, padding, dilation = _expand(stride, n), _expand(padding, n), _expand(dilation, n)
    output_padding = _expand(output_padding, n)
    numbers = jax.lax.conv_dimension_numbers(input.shape, weight.shape, _conv_numbers(n))
    common = {
        "dimension_numbers": numbers,
        "feature_group_count": groups,
        "precision": matmul_precision(),
        "preferred_element_type": _opmath(input.dtype),
    }
    if not transposed:
        out = jax.lax.conv_general_dilated(
            input, weight, stride, [(p, p) for p in padding], rhs_dilation=dilation, **common
        )
        return out.astype(input.dtype)
    # A transposed convolution is the gradient of a convolution with respect to its
    # input: a stride-1 convolution of the stride-dilated input with the flipped kernel,
    # in/out channels swapped within each group.
    cin, cout_g, *kernel = weight.shape
    w = weight.reshape(groups, cin // groups, cout_g, *kernel).swapaxes(1, 2)
    w = jnp.flip(w.reshape(groups * cout_g, cin // groups, *kernel), tuple(range(2, 2 + n)))
    pads = [
        (d * (k - 1) - p, d * (k - 1) - p + op)
        for k, p, d, op in zip(kernel, padding, dilation, output_padding)
    ]
    numbers = jax.lax.conv_dimension_numbers(input.shape, w.shape, _conv_numbers(n))
    common["dimension_numbers"] = numbers
    out = jax.lax.conv_general_dilated(
        input, w, (1,) * n, pads, lhs_dilation=stride, rhs_dilation=dilation, **common
    )
    return out.astype(input.dtype)


def _bias_shape(bias, ndim):
    return bias.reshape((1, -1) + (1,) * (ndim - 2))


@lowers(aten.convolution.default, aten.convolution_overrideable.default)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    out = _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = (_up(out) + _bias_shape(bias, out.ndim)).astype(out.dtype)
    return out


@lowers(aten.convolution_backward.default, aten.convolution_backward_overrideable.default)
def convolution_backward(
    grad_output,
    input,
    weight,
    bias_sizes=None,
    stride=(1,),
    padding=(0,),
    dilation=(1,),
    transposed=False,
    output_padding=(0,),
    groups=1,
    output_mask=(True, True, True),
):
    def conv(x, w):
        return _conv(x, w, stride, padding, dilation, transposed, output_padding, groups)

    grad_input, grad_weight = _vjp(conv, (input, weight), grad_output, output_mask[:2])
    grad_bias = None
    if output_mask[2]:
        dims = (0,) + tuple(range(2, grad_output.ndim))
        grad_bias = jnp.sum(_up(grad_output), dims).astype(grad_output.dtype)
    return grad_input, grad_weight, grad_bias


# --- softmax -------------------------------------------------------------------------


def _dim(dim: int, ndim: int) -> int:
    return dim % max(ndim, 1)


def _softmax_like(fn, self, dim, half_to_float):
    out_dtype = jnp.float32 if half_to_float else self.dtype
    if self.ndim == 0:
        return fn(_up(self)[None], axis=0)[0].astype(out_dtype)
    return fn(_up(self), axis=_dim(dim, self.ndim)).astype(out_dtype)


@lowers(aten._softmax.default)
def _softmax(self, dim, half_to_float):
    return _softmax_like(jax.nn.softmax, self, dim, half_to_float)


@lowers(aten._log_softmax.default)
def _log_softmax(self, dim, half_to_float):
    return _softmax_like(jax.nn.log_softmax, self, dim, half_to_float)


@lowers(aten._softmax_backward_data.default)
def _softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = _up(grad_output), _up(output)
    axis = _dim(dim, g.ndim) if g.ndim else None
    out = y * (g - jnp.sum(g * y, axis=axis, keepdims=True))
    return out.astype(_jax_dtype(input_dtype))


@lowers(aten._log_softmax_backward_data.default)
def _log_softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = _up(grad_output), _up(output)
    axis = _dim(dim, g.ndim) if g.ndim else None
    out = g - jnp.exp(y) * jnp.sum(g, axis=axis, keepdims=True)
    return out.astype(_jax_dtype(input_dtype))


# --- normalization -------------------------------------------------------------------


def _stat_dtype(input, *params):
    """The dtype of saved statistics: the parameters' when a reduced-precision input
    meets float32 parameters (CPU's mixed-type kernels), else the input's."""
    for p in params:
        if p is not None:
            return p.dtype if _is_low_float(input.dtype) else input.dtype
    return input.dtype


def _channel(v, ndim):
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def _affine(x, weight, bias, shape):
    if weight is not None:
        x = x * _up(weight).reshape(shape)
    if bias is not None:
        x = x + _up(bias).reshape(shape)
    return x


def _bn_normalize(x, weight, bias, mean, invstd):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return _affine((x - mean.reshape(shape)) * invstd.reshape(shape), weight, bias, shape)


def _bn_batch_stats(x):
    axes = (0,) + tuple(range(2, x.ndim))
    mean = jnp.mean(x, axes)
    var = jnp.mean(jnp.square(x - _channel(mean, x.ndim)), axes)
    return mean, var


def _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """(output, save_mean, save_invstd, new running_mean, new running_var)."""
    stat = _stat_dtype(input, weight, running_mean)
    x = _up(input)
    if not training:
        invstd = jax.lax.rsqrt(_up(running_var) + eps)
        out = _bn_normalize(x, weight, bias, _up(running_mean), invstd)
        empty = jnp.zeros((0,), stat)
        return out.astype(input.dtype), empty, empty, None, None
    mean, var = _bn_batch_stats(x)
    invstd = jax.lax.rsqrt(var + eps)
    out = _bn_normalize(x, weight, bias, mean, invstd)
    new_mean = new_var = None
    if running_mean is not None:
        new_mean = (1 - momentum) * _up(running_mean) + momentum * mean
    if running_var is not None:
        n = input.size // input.shape[1]
        unbiased = var * (n / (n - 1)) if n > 1 else var * jnp.inf
        new_var = (1 - momentum) * _up(running_var) + momentum * unbiased
    return out.astype(input.dtype), mean.astype(stat), invstd.astype(stat), new_mean, new_var


@lowers(
    aten.native_batch_norm.default,
    aten._native_batch_norm_legit.default,
    writes=("running_mean", "running_var"),
)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)


@lowers(aten._native_batch_norm_legit.no_stats)
def _native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    return _batch_norm(input, weight, bias, None, None, True, momentum, eps)[:3]


@lowers(aten._native_batch_norm_legit_no_training.default)
def _native_batch_norm_legit_no_training(
    input, weight, bias, running_mean, running_var, momentum, eps
):
    return _batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


def _fill_none(value, like):
    return like if value is None else value.astype(like.dtype)


@lowers(aten._native_batch_norm_legit_functional.default)
def _native_batch_norm_legit_functional(
    input, weight, bias, running_mean, running_var, training, momentum, eps
):
    out, mean, invstd, new_mean, new_var = _batch_norm(
        input, weight, bias, running_mean, running_var, training, momentum, eps
    )
    return (out, mean, invstd, _fill_none(new_mean, running_mean), _fill_none(new_var, running_var))


def _reserve():
    return jnp.zeros((0,), jnp.uint8)


@lowers(aten._batch_norm_with_update.default, writes=("running_mean", "running_var"))
def _batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps):
    out, mean, invstd, new_mean, new_var = _batch_norm(
        input, weight, bias, running_mean, running_var, True, momentum, eps
    )
    return out, mean, invstd, _reserve(), new_mean, new_var


@lowers(aten._batch_norm_with_update_functional.default)
def _batch_norm_with_update_functional(
    input, weight, bias, running_mean, running_var, momentum, eps
):
    out, mean, invstd, new_mean, new_var = _batch_norm(
        input, weight, bias, running_mean, running_var, True, momentum, eps
    )
    return (
        out,
        mean,
        invstd,
        _reserve(),
        new_mean.astype(running_mean.dtype),
        new_var.astype(running_var.dtype),
    )


@lowers(aten._batch_norm_no_update.default)
def _batch_norm_no_update(input, weight, bias, running_mean, running_var, momentum, eps):
    training = running_mean is None or running_var is None
    out, mean, invstd, _, _ = _batch_norm(
        input, weight, bias, running_mean, running_var, training, momentum, eps
    )
    return out, mean, invstd, _reserve()


def _batch_norm_grads(grad_out, input, weight, running_mean, running_var, train, eps, mask):
    def forward(x, w, b):
        if train:
            mean, var = _bn_batch_stats(x)
            invstd = jax.lax.rsqrt(var + eps)
        else:
            mean, invstd = _up(running_mean), jax.lax.rsqrt(_up(running_var) + eps)
        return _bn_normalize(x, w, b, mean, invstd)

    c = input.shape[1]
    w = jnp.ones((c,), jnp.float32) if weight is None else _up(weight)
    b = jnp.zeros_like(w)
    mask = (mask[0], mask[1] and weight is not None, mask[2])
    gi, gw, gb = _vjp(forward, (_up(input), w, b), _up(grad_out), mask)
    param = weight.dtype if weight is not None else input.dtype
    return (
        None if gi is None else gi.astype(input.dtype),
        None if gw is None else gw.astype(param),
        None if gb is None else gb.astype(param),
    )


@lowers(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(
    grad_out,
    input,
    weight,
    running_mean,
    running_var,
    save_mean,
    save_invstd,
    train,
    eps,
    output_mask,
):
    return _batch_norm_grads(
        grad_out, input, weight, running_mean, running_var, train, eps, output_mask
    )


@lowers(aten.batch_norm_backward.default)
def batch_norm_backward(
    grad_out,
    input,
    weight,
    running_mean,
    running_var,
    save_mean,
    save_var,
    update,
    eps,
    output_mask,
    reserve,
):
    train = update or running_mean is None
    return _batch_norm_grads(
        grad_out, input, weight, running_mean, running_var, train, eps, output_mask
    )


def _layer_norm(x, weight, bias, k, eps):
    """(normalized x, mean, rstd), statistics over the last k dims kept as size 1."""
    axes = tuple(range(x.ndim - k, x.ndim))
    mean = jnp.mean(x, axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axes, keepdims=True)
    rstd = jax.lax.rsqrt(var + eps)
    shape = x.shape[x.ndim - k :]
    return _affine((x - mean) * rstd, weight, bias, shape), mean, rstd


@lowers(aten.native_layer_norm.default)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    stat = _stat_dtype(input, weight)
    out, mean, rstd = _layer_norm(_up(input), weight, bias, len(normalized_shape), eps)
    return out.astype(input.dtype), mean.astype(stat), rstd.astype(stat)


def _param_grads(forward, grad_out, input, params, output_mask):
    """vjp of ``forward(x, *params)``; missing parameters count as absent grads."""
    primals = [_up(input)] + [jnp.zeros((0,), jnp.float32) if p is None else _up(p) for p in params]
    mask = [output_mask[0]] + [m and p is not None for m, p in zip(output_mask[1:], params)]
    grads = _vjp(forward, tuple(primals), _up(grad_out), mask)
    dtypes = [input.dtype] + [None if p is None else p.dtype for p in params]
    return tuple(None if g is None else g.astype(d) for g, d in zip(grads, dtypes))


def _none_if_empty(p):
    return None if p.size == 0 else p


@lowers(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(
    grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask
):
    k = len(normalized_shape)

    # Normalize with the saved rstd (eps is not passed to the backward op): the
    # statistics are recomputed from x so that their gradients flow.
    def forward_saved(x, w, b):
        axes = tuple(range(x.ndim - k, x.ndim))
        m = jnp.mean(x, axes, keepdims=True)
        var = jnp.mean(jnp.square(x - m), axes, keepdims=True)
        eps = jax.lax.stop_gradient(1 / jnp.square(_up(rstd)) - var)
        y = (x - m) * jax.lax.rsqrt(var + eps)
        shape = x.shape[x.ndim - k :]
        return _affine(y, _none_if_empty(w), _none_if_empty(b), shape)

    return _param_grads(forward_saved, grad_out, input, (weight, bias), output_mask)


def _group_norm(x, weight, bias, n, c, group, eps):
    xg = x.reshape(n, group, (c // group) * math.prod(x.shape[2:]))
    mean = jnp.mean(xg, -1)
    var = jnp.mean(jnp.square(xg - mean[..., None]), -1)
    rstd = jax.lax.rsqrt(var + eps)
    y = ((xg - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    return _affine(y, weight, bias, shape), mean, rstd


@lowers(aten.native_group_norm.default)
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    stat = _stat_dtype(input, weight)
    out, mean, rstd = _group_norm(_up(input), weight, bias, N, C, group, eps)
    return out.astype(input.dtype), mean.astype(stat), rstd.astype(stat)


@lowers(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    def forward(x, w):
        xg = x.reshape(N, group, (C // group) * HxW)
        m = jnp.mean(xg, -1, keepdims=True)
        var = jnp.mean(jnp.square(xg - m), -1, keepdims=True)
        eps = jax.lax.stop_gradient(1 / jnp.square(_up(rstd))[..., None] - var)
        y = ((xg - m) * jax.lax.rsqrt(var + eps)).reshape(x.shape)
        return _affine(y, _none_if_empty(w), None, (1, C) + (1,) * (x.ndim - 2))

    gi, gw = _param_grads(forward, grad_out, input, (weight,), output_mask[:2])
    gb = None
    if output_mask[2]:
        dims = (0,) + tuple(range(2, grad_out.ndim))
        gb = jnp.sum(_up(grad_out), dims).astype(input.dtype if weight is None else weight.dtype)
    return gi, gw, gb


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
        self.k = _expand(kernel_size, n)
        self.s = _expand(stride, n) if stride else self.k
        self.p = _expand(padding, n)
        self.d = _expand(dilation, n)
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
    grad = grad.at[flat].add(_up(grad_output).reshape(-1))
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
    xp = w.pad(_up(self), 0)
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

        return _vjp(forward, (self,), grad_output, (True,))[0]

    return backward


lowers(aten.avg_pool2d_backward.default)(_avg_pool_backward(2))
lowers(aten.avg_pool3d_backward.default)(_avg_pool_backward(3))


def _adaptive_bounds(size, out):
    i = np.arange(out)
    return (i * size) // out, -((-(i + 1) * size) // out)


def _adaptive_avg_pool(self, output_size):
    n = len(output_size)
    x = _up(self)
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
    return _vjp(lambda x: _adaptive_avg_pool(x, output_size), (self,), grad_output, (True,))[0]


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


# --- losses --------------------------------------------------------------------------


def _nll_pick(self, target, weight, ignore_index):
    """(-log-likelihood terms, their weights), with the class dim gathered away."""
    axis = 0 if self.ndim == 1 else 1
    x = jnp.moveaxis(_up(self), axis, -1)
    valid = target != ignore_index
    safe = jnp.where(valid, target, 0)
    picked = jnp.take_along_axis(x, safe[..., None], -1)[..., 0]
    w = jnp.ones(safe.shape, x.dtype) if weight is None else _up(weight)[safe]
    w = jnp.where(valid, w, jnp.zeros_like(w))
    return -picked * w, w


def _nll_forward(self, target, weight, reduction, ignore_index):
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
    g = _up(grad_output)
    if reduction == 1:
        g = g / _up(total_weight)
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
    return _reduce(jnp.square(_up(self) - _up(target)), reduction).astype(dtype)


@lowers(aten.mse_loss_backward.default)
def mse_loss_backward(grad_output, self, target, reduction):
    diff = _up(self) - _up(target)
    g = _reduce_backward(_up(grad_output), diff.shape, reduction)
    return (2 * diff * g).astype(self.dtype)


def _smooth_l1(diff, beta):
    z = jnp.abs(diff)
    if beta == 0:
        return z
    return jnp.where(z < beta, 0.5 * z * z / beta, z - 0.5 * beta)


@lowers(aten.smooth_l1_loss.default)
def smooth_l1_loss(self, target, reduction=1, beta=1.0):
    loss = _smooth_l1(_up(self) - _up(target), beta)
    return _reduce(loss, reduction).astype(_loss_dtype(self, target))


@lowers(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(grad_output, self, target, reduction, beta):
    diff = _up(self) - _up(target)
    g = _reduce_backward(_up(grad_output), diff.shape, reduction)
    if beta == 0:
        local = jnp.sign(diff)
    else:
        local = jnp.where(jnp.abs(diff) < beta, diff / beta, jnp.sign(diff))
    return (local * g).astype(self.dtype)


@lowers(aten.huber_loss.default)
def huber_loss(self, target, reduction=1, delta=1.0):
    z = jnp.abs(_up(self) - _up(target))
    loss = jnp.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta))
    return _reduce(loss, reduction).astype(_loss_dtype(self, target))


@lowers(aten.huber_loss_backward.default)
def huber_loss_backward(grad_output, self, target, reduction, delta):
    diff = _up(self) - _up(target)
    g = _reduce_backward(_up(grad_output), diff.shape, reduction)
    return (jnp.clip(diff, -delta, delta) * g).astype(self.dtype)


@lowers(aten.binary_cross_entropy.default)
def binary_cross_entropy(self, target, weight=None, reduction=1):
    x, t = _up(self), _up(target)
    # CPU clamps each log at -100 so that a saturated input gives a finite loss
    loss = -(t * jnp.maximum(jnp.log(x), -100) + (1 - t) * jnp.maximum(jnp.log1p(-x), -100))
    if weight is not None:
        loss = loss * _up(weight)
    return _reduce(loss, reduction).astype(self.dtype)


@lowers(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=1):
    x, t = _up(self), _up(target)
    g = _reduce_backward(_up(grad_output), x.shape, reduction)
    grad = g * (x - t) / jnp.maximum((1 - x) * x, 1e-12)
    if weight is not None:
        grad = grad * _up(weight)
    return grad.astype(self.dtype)


# --- fused recurrent cells (nn.LSTM / nn.GRU use them on non-CPU devices) -------------


def _gates(input_gates, hidden_gates, input_bias, hidden_bias):
    gates = _up(input_gates) + _up(hidden_gates)
    if input_bias is not None:
        gates = gates + _up(input_bias)
    if hidden_bias is not None:
        gates = gates + _up(hidden_bias)
    return gates


@lowers(aten._thnn_fused_lstm_cell.default)
def _thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = _gates(input_gates, hidden_gates, input_bias, hidden_bias)
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    cy = f * _up(cx) + i * g
    hy = o * jnp.tanh(cy)
    # the workspace holds the activated gates, as the CUDA kernel's does
    workspace = jnp.concatenate([i, f, g, o], axis=-1)
    dtype = input_gates.dtype
    return hy.astype(dtype), cy.astype(dtype), workspace.astype(dtype)


def _zeros_if_none(grad, like):
    return jnp.zeros(like.shape, _opmath(like.dtype)) if grad is None else _up(grad)


@lowers(aten._thnn_fused_lstm_cell_backward_impl.default)
def _thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, g, o = jnp.split(_up(workspace), 4, axis=-1)
    grad_hy, grad_cy = _zeros_if_none(grad_hy, cx), _zeros_if_none(grad_cy, cx)
    tanh_cy = jnp.tanh(_up(cy))
    grad_c = grad_cy + grad_hy * o * (1 - tanh_cy * tanh_cy)
    grad_gates = jnp.concatenate(
        [
            grad_c * g * i * (1 - i),
            grad_c * _up(cx) * f * (1 - f),
            grad_c * i * (1 - g * g),
            grad_hy * tanh_cy * o * (1 - o),
        ],
        axis=-1,
    )
    dtype = workspace.dtype
    grad_bias = None
    if has_bias:
        grad_bias = jnp.sum(grad_gates.reshape(-1, grad_gates.shape[-1]), 0).astype(dtype)
    return grad_gates.astype(dtype), (grad_c * f).astype(cx.dtype), grad_bias


@lowers(aten._thnn_fused_gru_cell.default)
def _thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    ig, hg = _up(input_gates), _up(hidden_gates)
    if input_bias is not None:
        ig = ig + _up(input_bias)
    if hidden_bias is not None:
        hg = hg + _up(hidden_bias)
    ir, ii, in_ = jnp.split(ig, 3, axis=-1)
    hr, hi, hn = jnp.split(hg, 3, axis=-1)
    r = jax.nn.sigmoid(ir + hr)
    z = jax.nn.sigmoid(ii + hi)
    n = jnp.tanh(in_ + r * hn)
    h = _up(hx)
    hy = n + z * (h - n)
    workspace = jnp.concatenate([r, z, n, h, hn], axis=-1)
    dtype = input_gates.dtype
    return hy.astype(dtype), workspace.astype(dtype)


@lowers(aten._thnn_fused_gru_cell_backward.default)
def _thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, h, hn = jnp.split(_up(workspace), 5, axis=-1)
    g = _up(grad_hy)
    grad_n = g * (1 - z) * (1 - n * n)
    grad_r = grad_n * hn * r * (1 - r)
    grad_z = g * (h - n) * z * (1 - z)
    grad_input = jnp.concatenate([grad_r, grad_z, grad_n], axis=-1)
    grad_hidden = jnp.concatenate([grad_r, grad_z, grad_n * r], axis=-1)
    dtype = workspace.dtype
    grad_ib = grad_hb = None
    if has_bias:
        grad_ib = jnp.sum(grad_input.reshape(-1, grad_input.shape[-1]), 0).astype(dtype)
        grad_hb = jnp.sum(grad_hidden.reshape(-1, grad_hidden.shape[-1]), 0).astype(dtype)
    return (
        grad_input.astype(dtype),
        grad_hidden.astype(dtype),
        (g * z).astype(dtype),
        grad_ib,
        grad_hb,
    )


# --- upsampling ----------------------------------------------------------------------


def _index_dtype(dtype):
    # CPU computes source coordinates in float, or in double for double tensors
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
    ftype = _index_dtype(self.dtype)
    out = _up(self)
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
    return _vjp(forward, (primal,), grad_output, (True,))[0]


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


_NEAREST = (
    (False, "upsample_nearest{}d"),
    (True, "_upsample_nearest_exact{}d"),
)
for _exact, _name in _NEAREST:
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


@lowers(aten.glu.default)
def glu(self, dim=-1):
    a, b = jnp.split(self, 2, axis=_dim(dim, self.ndim))
    return a * jax.nn.sigmoid(b)
