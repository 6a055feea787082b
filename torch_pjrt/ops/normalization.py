"""Normalization lowerings: batch norm (every ATen flavour), layer norm and group norm,
with their backward ops."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from torch_pjrt.ops._helpers import vjp
from torch_pjrt.ops._promote import is_low_float as _is_low_float
from torch_pjrt.ops._promote import upcast
from torch_pjrt.ops.registry import lowers

aten = torch.ops.aten


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
        x = x * upcast(weight).reshape(shape)
    if bias is not None:
        x = x + upcast(bias).reshape(shape)
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
    x = upcast(input)
    if not training:
        invstd = jax.lax.rsqrt(upcast(running_var) + eps)
        out = _bn_normalize(x, weight, bias, upcast(running_mean), invstd)
        empty = jnp.zeros((0,), stat)
        return out.astype(input.dtype), empty, empty, None, None
    mean, var = _bn_batch_stats(x)
    invstd = jax.lax.rsqrt(var + eps)
    out = _bn_normalize(x, weight, bias, mean, invstd)
    new_mean = new_var = None
    if running_mean is not None:
        new_mean = (1 - momentum) * upcast(running_mean) + momentum * mean
    if running_var is not None:
        n = input.size // input.shape[1]
        unbiased = var * (n / (n - 1)) if n > 1 else var * jnp.inf
        new_var = (1 - momentum) * upcast(running_var) + momentum * unbiased
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
            mean, invstd = upcast(running_mean), jax.lax.rsqrt(upcast(running_var) + eps)
        return _bn_normalize(x, w, b, mean, invstd)

    c = input.shape[1]
    w = jnp.ones((c,), jnp.float32) if weight is None else upcast(weight)
    b = jnp.zeros_like(w)
    mask = (mask[0], mask[1] and weight is not None, mask[2])
    gi, gw, gb = vjp(forward, (upcast(input), w, b), upcast(grad_out), mask)
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
    out, mean, rstd = _layer_norm(upcast(input), weight, bias, len(normalized_shape), eps)
    return out.astype(input.dtype), mean.astype(stat), rstd.astype(stat)


def _param_grads(forward, grad_out, input, params, output_mask):
    """vjp of ``forward(x, *params)``; missing parameters count as absent grads."""
    primals = [upcast(input)] + [
        jnp.zeros((0,), jnp.float32) if p is None else upcast(p) for p in params
    ]
    mask = [output_mask[0]] + [m and p is not None for m, p in zip(output_mask[1:], params)]
    grads = vjp(forward, tuple(primals), upcast(grad_out), mask)
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
        eps = jax.lax.stop_gradient(1 / jnp.square(upcast(rstd)) - var)
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
    out, mean, rstd = _group_norm(upcast(input), weight, bias, N, C, group, eps)
    return out.astype(input.dtype), mean.astype(stat), rstd.astype(stat)


@lowers(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    def forward(x, w):
        xg = x.reshape(N, group, (C // group) * HxW)
        m = jnp.mean(xg, -1, keepdims=True)
        var = jnp.mean(jnp.square(xg - m), -1, keepdims=True)
        eps = jax.lax.stop_gradient(1 / jnp.square(upcast(rstd))[..., None] - var)
        y = ((xg - m) * jax.lax.rsqrt(var + eps)).reshape(x.shape)
        return _affine(y, _none_if_empty(w), None, (1, C) + (1,) * (x.ndim - 2))

    gi, gw = _param_grads(forward, grad_out, input, (weight,), output_mask[:2])
    gb = None
    if output_mask[2]:
        dims = (0,) + tuple(range(2, grad_out.ndim))
        gb = jnp.sum(upcast(grad_out), dims).astype(input.dtype if weight is None else weight.dtype)
    return gi, gw, gb
