"""Activation lowerings and their backward ops: ReLU and its relatives, GELU, SiLU, the
hard and soft variants, softmax, GLU."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from torch_pjrt.ops._helpers import check, is_bool, is_float, scalar, unsupported
from torch_pjrt.ops._promote import in_opmath, promote, upcast
from torch_pjrt.ops.registry import lowers
from torch_pjrt.runtime.transfer import jax_dtype as _jax_dtype

aten = torch.ops.aten


# --- activations and their backward ops ----------------------------------------------


@lowers(aten.relu.default)
def relu(self):
    check(not is_bool(self), "Boolean inputs not supported for relu")
    return jnp.maximum(self, jnp.zeros((), self.dtype))


@lowers(aten.threshold.default, fits=("threshold", "value"))
def threshold(self, threshold, value):
    return jnp.where(self <= scalar(threshold, self.dtype), scalar(value, self.dtype), self)


@lowers(aten.threshold_backward.default)
@promote(n=2)
def threshold_backward(grad_output, self, threshold):
    return jnp.where(self <= scalar(threshold, self.dtype), 0, grad_output)


@lowers(aten.sigmoid_backward.default)
@promote(n=2)
def sigmoid_backward(grad_output, output):
    return grad_output * (1 - output) * output


@lowers(aten.tanh_backward.default)
@promote(n=2)
def tanh_backward(grad_output, output):
    return grad_output * (1 - output * output)


_SQRT1_2 = 1 / math.sqrt(2)
_GELU_BETA = math.sqrt(2) * 2 / math.sqrt(math.pi) * 0.5
_GELU_KAPPA = 0.044715


@lowers(aten.gelu.default)
@promote()
def gelu(self, approximate="none"):
    if approximate == "tanh":
        inner = _GELU_BETA * (self + _GELU_KAPPA * self * self * self)
        return 0.5 * self * (1 + jnp.tanh(inner))
    return self * 0.5 * (1 + lax.erf(self * _SQRT1_2))


@lowers(aten.gelu_backward.default)
@promote(n=2)
def gelu_backward(grad_output, self, approximate="none"):
    x = self
    if approximate == "tanh":
        x_sq = x * x
        tanh_inner = jnp.tanh(_GELU_BETA * (x + _GELU_KAPPA * x_sq * x))
        left_derivative = 0.5 * (1 + tanh_inner)
        right_derivative = 1 - tanh_inner * tanh_inner
        inner_derivative = _GELU_BETA * (1 + 3 * _GELU_KAPPA * x_sq)
        return grad_output * (left_derivative + 0.5 * x * right_derivative * inner_derivative)
    cdf = 0.5 * (1 + lax.erf(x * _SQRT1_2))
    pdf = jnp.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return grad_output * (cdf + x * pdf)


@lowers(aten.silu.default)
@promote()
def silu(self):
    return self * jax.nn.sigmoid(self)


@lowers(aten.silu_backward.default)
@promote(n=2)
def silu_backward(grad_output, self):
    s = jax.nn.sigmoid(self)
    return grad_output * s * (1 + self * (1 - s))


@lowers(aten.mish.default)
@promote()
def mish(self):
    return self * jnp.tanh(jax.nn.softplus(self))


@lowers(aten.mish_backward.default)
@promote(n=2)
def mish_backward(grad_output, self):
    s = jax.nn.sigmoid(self)
    t = jnp.tanh(jax.nn.softplus(self))
    return grad_output * (t + self * s * (1 - t * t))


@lowers(aten.elu.default)
@promote(n=1)
def elu(self, alpha=1, scale=1, input_scale=1):
    t = self.dtype
    negative = jnp.expm1(self * scalar(input_scale, t)) * scalar(alpha, t) * scalar(scale, t)
    return jnp.where(self <= 0, negative, self * scalar(scale, t))


@lowers(aten.elu_backward.default)
@promote(n=1)
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    t = grad_output.dtype
    x = self_or_result.astype(t)
    negcoef, poscoef, negiptcoef = (
        scalar(alpha, t) * scalar(scale, t),
        scalar(scale, t),
        scalar(input_scale, t),
    )
    if is_result:
        negative = grad_output * negiptcoef * (x + negcoef)
    else:
        negative = grad_output * negiptcoef * negcoef * jnp.exp(x * negiptcoef)
    return jnp.where(x <= 0, negative, grad_output * poscoef)


@lowers(aten.celu.default)
@promote(n=1)
def celu(self, alpha=1):
    # ATen: elu(self, alpha, scale=1, input_scale=1/alpha), 1/alpha taken in double
    t = self.dtype
    negative = jnp.expm1(self * scalar(1 / alpha, t)) * scalar(alpha, t)
    return jnp.where(self <= 0, negative, self)


@lowers(aten.leaky_relu.default)
@promote(n=1)
def leaky_relu(self, negative_slope=0.01):
    return jnp.where(self > 0, self, self * scalar(negative_slope, self.dtype))


@lowers(aten.leaky_relu_backward.default)
@promote(n=2)
def leaky_relu_backward(grad_output, self, negative_slope, self_is_result):
    return jnp.where(self > 0, grad_output, grad_output * scalar(negative_slope, self.dtype))


@lowers(aten.hardtanh.default)
def hardtanh(self, min_val=-1, max_val=1):
    if is_bool(self):
        raise unsupported("hardtanh", self)
    return jnp.minimum(jnp.maximum(self, scalar(min_val, self.dtype)), scalar(max_val, self.dtype))


@lowers(aten.hardtanh_backward.default)
@promote(n=2)
def hardtanh_backward(grad_output, self, min_val, max_val):
    t = self.dtype
    outside = (self <= scalar(min_val, t)) | (self >= scalar(max_val, t))
    return jnp.where(outside, 0, grad_output)


@lowers(aten.softplus.default)
@promote(n=1)
def softplus(self, beta=1, threshold=20):
    scaled = self * scalar(beta, self.dtype)
    soft = jnp.log1p(jnp.exp(scaled)) / scalar(beta, self.dtype)
    return jnp.where(scaled > scalar(threshold, self.dtype), self, soft)


@lowers(aten.softplus_backward.default)
@promote(n=2)
def softplus_backward(grad_output, self, beta, threshold):
    scaled = self * scalar(beta, self.dtype)
    z = jnp.exp(scaled)
    return jnp.where(scaled > scalar(threshold, self.dtype), grad_output, grad_output * z / (z + 1))


@lowers(aten.hardsigmoid.default)
@promote()
def hardsigmoid(self):
    return jnp.clip(self + 3, 0, 6) / 6


@lowers(aten.hardsigmoid_backward.default)
@promote(n=2)
def hardsigmoid_backward(grad_output, self):
    return jnp.where((self > -3) & (self < 3), grad_output / 6, 0)


@lowers(aten.hardswish.default)
@promote()
def hardswish(self):
    return self * jnp.clip(self + 3, 0, 6) / 6


@lowers(aten.hardswish_backward.default)
@promote(n=2)
def hardswish_backward(grad_output, self):
    inside = grad_output * (self / 3 + 0.5)
    return jnp.where(self < -3, 0, jnp.where(self <= 3, inside, grad_output))


# (ATen compares in self's type: a half self's lambd is rounded to it)
@lowers(aten.hardshrink.default)
def hardshrink(self, lambd=0.5):
    lambd = scalar(lambd, self.dtype)
    return jnp.where((self >= -lambd) & (self <= lambd), jnp.zeros((), self.dtype), self)


@lowers(aten.hardshrink_backward.default)
@promote(n=2)
def hardshrink_backward(grad_out, self, lambd):
    lambd = scalar(lambd, self.dtype)
    return jnp.where((self >= -lambd) & (self <= lambd), 0, grad_out)


# NOTE: lambd is static (one program per value) because PyTorch checks its value, and
# the Meta kernel that checks it runs once per program (registry.Kernel._check_arguments)
@lowers(aten.softshrink.default, static=("lambd",))
@promote(n=1)
def softshrink(self, lambd=0.5):
    lambd = scalar(lambd, self.dtype)
    return jnp.where(self > lambd, self - lambd, jnp.where(self < -lambd, self + lambd, 0))


@lowers(aten.softshrink_backward.default)
@promote(n=2)
def softshrink_backward(grad_output, self, lambd):
    lambd = scalar(lambd, self.dtype)
    return jnp.where((self >= -lambd) & (self <= lambd), 0, grad_output)


@lowers(aten.log_sigmoid_forward.default)
@in_opmath
def log_sigmoid_forward(self):
    """The buffer is empty, as on CUDA: ``log_sigmoid_backward`` below does not need it."""
    out = jnp.minimum(self, 0) - jnp.log1p(jnp.exp(-jnp.abs(self)))
    return out, jnp.zeros((0,), self.dtype)


@lowers(aten.log_sigmoid_backward.default)
@in_opmath
def log_sigmoid_backward(grad_output, self, buffer):
    return grad_output * jax.nn.sigmoid(-self)


# --- softmax -------------------------------------------------------------------------


def _dim(dim: int, ndim: int) -> int:
    return dim % max(ndim, 1)


def _softmax_like(fn, self, dim, half_to_float):
    out_dtype = jnp.float32 if half_to_float else self.dtype
    if self.ndim == 0:
        return fn(upcast(self)[None], axis=0)[0].astype(out_dtype)
    return fn(upcast(self), axis=_dim(dim, self.ndim)).astype(out_dtype)


def _softmax_kernel(name, self, dim):
    # ATen's CPU softmax kernels are for floating types (a dtype= argument converts first)
    if not is_float(self):
        last = self.ndim <= 1 or _dim(dim, self.ndim) == self.ndim - 1
        raise unsupported(
            f"{name}_lastdim_kernel_impl" if last else f"{name}_kernel_impl", self, cpu=False
        )


@lowers(aten._softmax.default)
def _softmax(self, dim, half_to_float):
    _softmax_kernel("softmax", self, dim)
    return _softmax_like(jax.nn.softmax, self, dim, half_to_float)


@lowers(aten._safe_softmax.default)
def _safe_softmax(self, dim, dtype=None):
    """Softmax whose rows of nothing but ``-inf`` give zeros (attention's math path).

    ATen's composite finds those rows with a second reduction (``all(x == -inf)``); the
    row's maximum, which softmax takes anyway, says the same (it is ``-inf`` exactly
    then; a NaN makes both false): one reduction fewer, two XLA kernels fewer a call."""
    x = self if dtype is None else self.astype(_jax_dtype(dtype))
    out_dtype = x.dtype
    x = upcast(x)
    if x.ndim == 0:
        x = x[None]
    axis = _dim(dim, x.ndim)
    top = jnp.max(x, axis=axis, keepdims=True)
    e = jnp.exp(x - top)  # (NaN in the rows of -inf alone, replaced)
    out = jnp.where(top == -jnp.inf, 0, e / jnp.sum(e, axis=axis, keepdims=True))
    return (out if self.ndim else out[0]).astype(out_dtype)


@lowers(aten._log_softmax.default)
def _log_softmax(self, dim, half_to_float):
    _softmax_kernel("log_softmax", self, dim)
    return _softmax_like(jax.nn.log_softmax, self, dim, half_to_float)


@lowers(aten._softmax_backward_data.default)
def _softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = upcast(grad_output), upcast(output)
    axis = _dim(dim, g.ndim) if g.ndim else None
    out = y * (g - jnp.sum(g * y, axis=axis, keepdims=True))
    return out.astype(_jax_dtype(input_dtype))


@lowers(aten._log_softmax_backward_data.default)
def _log_softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = upcast(grad_output), upcast(output)
    axis = _dim(dim, g.ndim) if g.ndim else None
    out = g - jnp.exp(y) * jnp.sum(g, axis=axis, keepdims=True)
    return out.astype(_jax_dtype(input_dtype))


@lowers(aten.glu.default)
def glu(self, dim=-1):
    a, b = jnp.split(self, 2, axis=_dim(dim, self.ndim))
    return a * jax.nn.sigmoid(b)
