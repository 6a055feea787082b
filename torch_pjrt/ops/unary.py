"""Unary math lowerings: exponentials and logarithms, trigonometry, special functions of
one argument, rounding, sign and float classification, complex numbers."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import torch
from jax import lax

from torch_pjrt.ops._helpers import check, divisible, dtype_name, is_bool, is_float, unsupported
from torch_pjrt.ops._promote import KIND, in_opmath, promote
from torch_pjrt.ops.registry import lowers, refusal
from torch_pjrt.runtime.transfer import torch_dtype, unsupported_dtype

aten = torch.ops.aten


# --- unary math ---------------------------------------------------------------------


def _unary(name, fn, kind):
    def lowered(self):
        return fn(self)

    lowered.__name__ = name
    return promote(kind)(lowered)


def _erf_inv(x):
    # NOTE: XLA's float32 erf_inv is a few ulps off near +-1, where the derivative
    # sqrt(pi)/2 * exp(erfinv(x)**2) magnifies it (1e-5 relative in the gradient at
    # x = -0.9987); evaluated in float64 and rounded once, it matches ATen's kernel
    if x.dtype == jnp.float32:
        return lax.erf_inv(x.astype(jnp.float64)).astype(jnp.float32)
    return lax.erf_inv(x)


_FLOAT_UNARY = {
    aten.exp: jnp.exp,
    aten.exp2: jnp.exp2,
    aten.expm1: jnp.expm1,
    aten.log: jnp.log,
    aten.log1p: jnp.log1p,
    aten.log2: jnp.log2,
    aten.log10: jnp.log10,
    aten.sqrt: jnp.sqrt,
    aten.rsqrt: lax.rsqrt,
    aten.sin: jnp.sin,
    aten.cos: jnp.cos,
    aten.tan: jnp.tan,
    aten.asin: jnp.arcsin,
    aten.acos: jnp.arccos,
    aten.atan: jnp.arctan,
    aten.sinh: jnp.sinh,
    aten.cosh: jnp.cosh,
    aten.tanh: jnp.tanh,
    aten.asinh: jnp.arcsinh,
    aten.acosh: jnp.arccosh,
    aten.atanh: jnp.arctanh,
    aten.sigmoid: jax.nn.sigmoid,
    aten.erf: lax.erf,
    aten.erfc: lax.erfc,
    aten.erfinv: _erf_inv,
    aten.lgamma: lax.lgamma,
    aten.reciprocal: lambda x: 1 / x,
    aten.sinc: jnp.sinc,
    aten.i0: jsp.i0,
    aten.special_i0e: jsp.i0e,
    aten.special_i1: jsp.i1,
    aten.special_i1e: jsp.i1e,
    aten.special_ndtri: jsp.ndtri,
    aten.special_log_ndtr: jsp.log_ndtr,
    aten.special_erfcx: jsp.erfcx,
    aten.special_entr: jsp.entr,
}

for _packet, _fn in _FLOAT_UNARY.items():
    lowers(_packet.default)(_unary(_packet.__name__, _fn, KIND.INT_TO_FLOAT))


@lowers(aten.digamma.default)
@promote(KIND.INT_TO_FLOAT)
def digamma(self):
    # ATen: digamma(+-0) = -+inf (jax gives nan)
    zero = jnp.copysign(jnp.full_like(self, jnp.inf), -self)
    return jnp.where(self == 0, zero, jsp.digamma(self))


@lowers(aten.abs.default)
def abs(self):
    if is_bool(self):
        raise unsupported("abs", self)
    return jnp.abs(self)


@lowers(aten.neg.default)
def neg(self):
    if is_bool(self):
        raise RuntimeError(
            "Negation, the `-` operator, on a bool tensor is not supported. If you are trying "
            "to invert a mask, use the `~` or `logical_not()` operator instead."
        )
    return -self


@lowers(aten.sign.default, aten.sgn.default)
def sign(self):
    if is_bool(self):
        return self
    if jnp.iscomplexobj(self):  # (sgn: x / |x|, NaN where a part is NaN, as ATen)
        return jnp.sign(self)
    # ATen: sign(nan) = 0
    return jnp.where(jnp.isnan(self), 0, jnp.sign(self)).astype(self.dtype)


def _rounding(name, fn):
    def lowered(self):
        if is_bool(self):  # (integers are returned as they are)
            raise unsupported(f"{name}_vml", self)
        return fn(self) if is_float(self) else self

    lowered.__name__ = name
    return lowered


for _packet, _fn in ((aten.floor, jnp.floor), (aten.ceil, jnp.ceil), (aten.trunc, jnp.trunc)):
    lowers(_packet.default)(_rounding(_packet.__name__, _fn))


@lowers(aten.round.default, aten.round.decimals)
@in_opmath
def round(self, decimals=0):
    if not is_float(self):
        if decimals or is_bool(self):
            raise unsupported("round" if decimals else "round_vml", self)
        return self
    if decimals == 0:
        return jnp.round(self)
    # ATen scales by 10**|decimals| the same way, so that rounding errors agree
    ten_pow = jnp.asarray(10.0 ** (decimals if decimals > 0 else -decimals), self.dtype)
    if decimals > 0:
        return jnp.divide(*divisible(jnp.round(self * ten_pow), ten_pow))
    return jnp.round(jnp.divide(*divisible(self, ten_pow))) * ten_pow


@lowers(aten.frac.default)
def frac(self):
    if not is_float(self):
        raise unsupported("frac", self)
    return self - jnp.trunc(self)


@lowers(aten.angle.default)
def angle(self):
    if jnp.iscomplexobj(self):
        return jnp.angle(self)  # (of the real dtype: atan2 of the parts)
    return _real_angle(self)


@promote(KIND.INT_TO_FLOAT)
def _real_angle(self):
    return jnp.where(self < 0, jnp.pi, jnp.where(jnp.isnan(self), self, 0)).astype(self.dtype)


def _angle_scale(name, factor):
    def lowered(self):
        if jnp.issubdtype(self.dtype, jnp.complexfloating):
            raise RuntimeError(f"{name} is not supported for complex tensors.")
        return self * factor

    lowered.__name__ = name
    return promote(KIND.INT_TO_FLOAT)(lowered)


lowers(aten.rad2deg.default)(_angle_scale("rad2deg", 180 / math.pi))
lowers(aten.deg2rad.default)(_angle_scale("deg2rad", math.pi / 180))


@lowers(aten.conj_physical.default)
def conj_physical(self):
    return jnp.conj(self)


@lowers(aten.isnan.default)
def isnan(self):
    return jnp.isnan(self) if is_float(self) else jnp.zeros(self.shape, jnp.bool_)


@lowers(aten.isinf.default)
def isinf(self):
    return jnp.isinf(self) if is_float(self) else jnp.zeros(self.shape, jnp.bool_)


@lowers(aten.isfinite.default)
def isfinite(self):
    return jnp.isfinite(self) if is_float(self) else jnp.ones(self.shape, jnp.bool_)


@lowers(aten.isposinf.default)
def isposinf(self):
    return self == jnp.inf if is_float(self) else jnp.zeros(self.shape, jnp.bool_)


@lowers(aten.isneginf.default)
def isneginf(self):
    return self == -jnp.inf if is_float(self) else jnp.zeros(self.shape, jnp.bool_)


@lowers(aten.signbit.default)
def signbit(self):
    if is_float(self):
        return jnp.signbit(self)
    if is_bool(self) or jnp.issubdtype(self.dtype, jnp.unsignedinteger):
        return jnp.zeros(self.shape, jnp.bool_)
    return self < 0


@lowers(aten.nan_to_num.default)
def nan_to_num(self, nan=None, posinf=None, neginf=None):
    if not is_float(self):
        return self
    if jnp.iscomplexobj(self):  # (each part replaced, as ATen)
        parts = (nan_to_num(p, nan, posinf, neginf) for p in (self.real, self.imag))
        return lax.complex(*parts)
    info = jnp.finfo(self.dtype)
    out = jnp.where(jnp.isnan(self), jnp.asarray(0.0 if nan is None else nan, self.dtype), self)
    out = jnp.where(
        self == jnp.inf, jnp.asarray(info.max if posinf is None else posinf, self.dtype), out
    )
    return jnp.where(
        self == -jnp.inf, jnp.asarray(info.min if neginf is None else neginf, self.dtype), out
    )


@lowers(aten.frexp.Tensor)
def frexp(self):
    mantissa, exponent = jnp.frexp(self)
    return mantissa, exponent.astype(jnp.int32)


@lowers(aten.logit.default)
@promote(KIND.INT_TO_FLOAT)
def logit(self, eps=None):
    x = self if eps is None else jnp.clip(self, eps, 1 - eps)
    return jnp.log(x / (1 - x))


@lowers(aten.logit_backward.default)
@promote(KIND.INT_TO_FLOAT, n=2)
def logit_backward(grad_output, self, eps=None):
    grad = grad_output / (self * (1 - self))
    if eps is None:
        return jnp.where((self < 0) | (self > 1), jnp.nan, grad)
    return jnp.where((self < eps) | (self > 1 - eps), 0, grad)


del _packet, _fn


@lowers(aten.complex.default)
def complex(real, imag):
    # ATen's checks, in its words (its Meta kernel's differ)
    real_name, imag_name = (dtype_name(torch_dtype(x.dtype)) for x in (real, imag))
    check(
        all(x.dtype in (jnp.float16, jnp.float32, jnp.float64) for x in (real, imag)),
        lambda: (
            "Expected both inputs to be Half, Float or Double tensors but got "
            f"{real_name} and {imag_name}"
        ),
    )
    check(
        real.dtype == imag.dtype,
        lambda: (
            f"Expected object of scalar type {real_name} but got scalar type {imag_name} "
            "for second argument"
        ),
    )
    if real.dtype == jnp.float16:  # (the result would be complex32)
        raise refusal(unsupported_dtype(torch.complex32))
    return lax.complex(*jnp.broadcast_arrays(real, imag))


@lowers(aten.polar.default)
def polar(abs, angle):
    abs, angle = jnp.broadcast_arrays(abs, angle)
    return lax.complex(abs * jnp.cos(angle), abs * jnp.sin(angle))
