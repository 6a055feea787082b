"""Elementwise lowerings: arithmetic, comparison, logic, unary math, activations."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import torch
from jax import lax

from torch_pjrt.ops._promote import KIND, cast, promote, result_type
from torch_pjrt.ops.registry import lowers, refusal

aten = torch.ops.aten


# --- helpers ------------------------------------------------------------------------


def _is_float(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def _is_bool(x) -> bool:
    return x.dtype == jnp.bool_


def _is_int(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.integer)


def _name(dtype) -> str:
    from torch_pjrt.runtime.transfer import torch_dtype

    names = {
        torch.bool: "Bool",
        torch.int64: "Long",
        torch.int32: "Int",
        torch.int16: "Short",
        torch.int8: "Char",
        torch.uint8: "Byte",
        torch.float32: "Float",
        torch.float64: "Double",
        torch.float16: "Half",
        torch.bfloat16: "BFloat16",
    }
    t = torch_dtype(dtype)
    return names.get(t, str(t))


def _unsupported(op: str, x) -> NotImplementedError:
    return refusal(NotImplementedError(f"\"{op}_cpu\" not implemented for '{_name(x.dtype)}'"))


def _s(value, dtype):
    """A Scalar argument in ``dtype`` (weak JAX scalars would otherwise promote ints)."""
    return cast(value, dtype)


_LOW = (jnp.float16, jnp.bfloat16)


def opmath(fn):
    """Compute in float32 for half-precision arrays and round once at the end, as ATen's
    CPU kernels do."""

    @functools.wraps(fn)
    def lowered(**kwargs):
        low = next((v.dtype for v in kwargs.values() if _low(v)), None)
        if low is None:
            return fn(**kwargs)
        kwargs = {k: v.astype(jnp.float32) if _low(v) else v for k, v in kwargs.items()}
        out = fn(**kwargs)
        return jax.tree.map(lambda o: o.astype(low) if o.dtype == jnp.float32 else o, out)

    return lowered


def _low(v) -> bool:
    return isinstance(v, jax.Array) and not _weak(v) and v.dtype in _LOW


def _weak(v) -> bool:
    return bool(getattr(getattr(v, "aval", None), "weak_type", False))


# --- arithmetic ---------------------------------------------------------------------


@lowers(aten.add.Tensor, aten.add.Scalar)
@promote(n=2)
def add(self, other, alpha=1):
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        other = other * jnp.asarray(alpha, other.dtype)
    return self + other


@lowers(aten.sub.Tensor, aten.sub.Scalar)
@promote(n=2)
def sub(self, other, alpha=1):
    if _is_bool(self) and _is_bool(other):
        raise RuntimeError(
            "Subtraction, the `-` operator, with two bool tensors is not supported. "
            "Use the `^` or `logical_xor()` operator instead."
        )
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        other = other * jnp.asarray(alpha, other.dtype)
    return self - other


@lowers(aten.rsub.Tensor, aten.rsub.Scalar)
@promote(n=2)
def rsub(self, other, alpha=1):
    return sub(self=other, other=self, alpha=alpha)


@lowers(aten.mul.Tensor, aten.mul.Scalar)
@promote()
def mul(self, other):
    if _is_bool(self):
        return self & other
    return self * other


@lowers(aten.fill.Scalar)
def fill(self, value):
    return jnp.full(self.shape, value, self.dtype)


@lowers(aten.fill.Tensor)
def fill_tensor(self, value):
    return jnp.broadcast_to(value.astype(self.dtype), self.shape)


@lowers(aten.zero.default)
def zero(self):
    return jnp.zeros(self.shape, self.dtype)


def _floor_divide(a, b):
    a, b = jnp.broadcast_arrays(a, b)
    if _is_float(a):
        # ATen's div_floor_floating, so that results agree with the CPU bit for bit
        mod = jnp.fmod(a, b)
        div = (a - mod) / b
        div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
        floor = jnp.floor(div)
        floor = jnp.where(div - floor > 0.5, floor + 1, floor)
        floor = jnp.where(div == 0, jnp.copysign(jnp.zeros_like(div), a / b), floor)
        return jnp.where(b == 0, a / b, floor)
    # NOTE: integer division by zero raises on the CPU; like CUDA, the device cannot
    # raise from inside a program, and XLA defines the quotient as -1.
    q = lax.div(a, b)
    r = lax.rem(a, b)
    return jnp.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)


def _trunc_divide(a, b):
    a, b = jnp.broadcast_arrays(a, b)
    return jnp.trunc(a / b) if _is_float(a) else lax.div(a, b)


@lowers(aten.div.Tensor, aten.div.Scalar)
@promote(KIND.INT_TO_FLOAT)
def div(self, other):
    return self / other


@lowers(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(self, other, rounding_mode=None):
    if rounding_mode is None:
        return div(self=self, other=other)
    compute, result = result_type(self, other)
    if rounding_mode == "trunc":
        compute = result  # ATen rounds the quotient to the result type before truncating
    a, b = cast(self, compute), cast(other, compute)
    if _is_bool(a):
        raise _unsupported(f"div_{rounding_mode}", a)
    out = _floor_divide(a, b) if rounding_mode == "floor" else _trunc_divide(a, b)
    return out.astype(result)


@lowers(aten.floor_divide.default, aten.floor_divide.Scalar)
@promote()
def floor_divide(self, other):
    if _is_bool(self):
        raise _unsupported("div_floor", self)
    return _floor_divide(self, other)


@lowers(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
@promote()
def remainder(self, other):
    if _is_bool(self):
        raise _unsupported("remainder", self)
    self, other = jnp.broadcast_arrays(self, other)
    mod = jnp.fmod(self, other) if _is_float(self) else lax.rem(self, other)
    return jnp.where((mod != 0) & ((other < 0) != (mod < 0)), mod + other, mod)


@lowers(aten.fmod.Tensor, aten.fmod.Scalar)
@promote()
def fmod(self, other):
    if _is_bool(self):
        raise _unsupported("fmod", self)
    self, other = jnp.broadcast_arrays(self, other)
    return jnp.fmod(self, other) if _is_float(self) else lax.rem(self, other)


def _int_pow(base, exp):
    out = jnp.power(base, jnp.where(exp < 0, 0, exp))
    if jnp.issubdtype(exp.dtype, jnp.unsignedinteger):
        return out
    # ATen's powi: negative exponents give 1 for base 1, +-1 for base -1 and 0 otherwise
    neg = jnp.where(base == 1, 1, jnp.where(base == -1, jnp.where(exp % 2 == 0, 1, -1), 0))
    return jnp.where(exp < 0, neg.astype(out.dtype), out)


@lowers(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar)
@promote(KIND.BOOL_TO_LONG)
def pow(self, exponent):
    if _is_float(self):
        return jnp.power(self, exponent)
    return _int_pow(self, exponent)


@lowers(aten.pow.Scalar)
def pow_scalar(self, exponent):
    return pow(self=self, exponent=exponent)


@lowers(aten.atan2.default)
@promote(KIND.INT_TO_FLOAT)
def atan2(self, other):
    return jnp.arctan2(self, other)


@lowers(aten.hypot.default)
@promote()
def hypot(self, other):
    return jnp.hypot(self, other)


@lowers(aten.copysign.Tensor, aten.copysign.Scalar)
@promote(KIND.INT_TO_FLOAT)
def copysign(self, other):
    return jnp.copysign(self, other)


@lowers(aten.nextafter.default)
def nextafter(self, other):
    return jnp.nextafter(self, other.astype(self.dtype))


@lowers(aten.ldexp.Tensor)
@promote(KIND.INT_TO_FLOAT)
def ldexp(self, other):
    return self * jnp.exp2(other)


@lowers(aten.logaddexp.default)
@promote()
def logaddexp(self, other):
    m = jnp.maximum(self, other)
    out = m + jnp.log1p(jnp.exp(-jnp.abs(self - other)))
    return jnp.where(jnp.isinf(self) & (self == other), self, out)


@lowers(aten.logaddexp2.default)
@promote()
def logaddexp2(self, other):
    m = jnp.maximum(self, other)
    out = m + jnp.log1p(jnp.exp2(-jnp.abs(self - other))) / math.log(2)
    return jnp.where(jnp.isinf(self) & (self == other), self, out)


@lowers(aten.xlogy.Tensor, aten.xlogy.Scalar_Self, aten.xlogy.Scalar_Other)
@promote(KIND.INT_TO_FLOAT)
def xlogy(self, other):
    out = jnp.where(self == 0, jnp.zeros_like(self * other), self * jnp.log(other))
    return jnp.where(jnp.isnan(other), other, out)


@lowers(
    aten.special_xlog1py.default,
    aten.special_xlog1py.self_scalar,
    aten.special_xlog1py.other_scalar,
)
@promote(KIND.INT_TO_FLOAT)
def special_xlog1py(self, other):
    out = jnp.where(self == 0, jnp.zeros_like(self * other), self * jnp.log1p(other))
    return jnp.where(jnp.isnan(other), other, out)


@lowers(aten.special_zeta.default, aten.special_zeta.self_scalar, aten.special_zeta.other_scalar)
@promote(KIND.INT_TO_FLOAT)
def special_zeta(self, other):
    x, q = self, other
    # Cephes' domain rules, which ATen follows and jax does not
    pole = (x == 1) | ((q <= 0) & (q == jnp.floor(q)))
    undefined = (x < 1) | ((q <= 0) & (x != jnp.floor(x)))
    out = jnp.where(pole, jnp.inf, jsp.zeta(x, q))
    return jnp.where(undefined & (x != 1), jnp.nan, out)


@lowers(aten.igamma.default)
@promote(KIND.INT_TO_FLOAT)
def igamma(self, other):
    return jsp.gammainc(self, other)


@lowers(aten.igammac.default)
@promote(KIND.INT_TO_FLOAT)
def igammac(self, other):
    return jsp.gammaincc(self, other)


@lowers(aten.mvlgamma.default)
@promote(KIND.INT_TO_FLOAT, n=1)
def mvlgamma(self, p):
    terms = jsp.gammaln(self[..., None] - jnp.arange(p, dtype=self.dtype) / 2)
    return terms.sum(-1) + p * (p - 1) / 4 * math.log(math.pi)


@lowers(aten.gcd.default)
@promote()
def gcd(self, other):
    return jnp.gcd(self, other)


@lowers(aten.lcm.default)
@promote()
def lcm(self, other):
    return jnp.lcm(self, other)


@lowers(aten.maximum.default)
@promote()
def maximum(self, other):
    return self | other if _is_bool(self) else jnp.maximum(self, other)


@lowers(aten.minimum.default)
@promote()
def minimum(self, other):
    return self & other if _is_bool(self) else jnp.minimum(self, other)


@lowers(aten.fmax.default)
@promote()
def fmax(self, other):
    return jnp.fmax(self, other) if _is_float(self) else maximum(self=self, other=other)


@lowers(aten.fmin.default)
@promote()
def fmin(self, other):
    return jnp.fmin(self, other) if _is_float(self) else minimum(self=self, other=other)


@lowers(aten.heaviside.default)
@promote()
def heaviside(self, values):
    return jnp.where(self == 0, values, (self > 0).astype(self.dtype))


@lowers(aten.lerp.Scalar, aten.lerp.Tensor)
@promote()
def lerp(self, end, weight):
    diff = end - self
    return jnp.where(jnp.abs(weight) < 0.5, self + weight * diff, end - diff * (1 - weight))


@lowers(aten.addcmul.default)
@promote(n=3)
def addcmul(self, tensor1, tensor2, value=1):
    if _is_bool(self):
        return self | (tensor1 & tensor2 & cast(value, jnp.bool_))
    return self + _s(value, self.dtype) * tensor1 * tensor2


@lowers(aten.addcdiv.default)
@promote(n=3)
def addcdiv(self, tensor1, tensor2, value=1):
    if not _is_float(self):
        raise RuntimeError(
            "Integer division with addcdiv is no longer supported, and in a future release "
            "addcdiv will perform a true division of tensor1 and tensor2. The historic "
            "addcdiv behavior can be implemented as (input + value * torch.trunc(tensor1 / "
            "tensor2)).to(input.dtype) for integer inputs and as (input + value * tensor1 / "
            "tensor2) for float inputs. The future addcdiv behavior is just the latter "
            "implementation: (input + value * tensor1 / tensor2), for all dtypes."
        )
    return self + _s(value, self.dtype) * (tensor1 / tensor2)


# --- bitwise and logical ------------------------------------------------------------


def _bitwise(name, fn):
    def lowered(self, other):
        if _is_float(self):
            raise _unsupported(name, self)
        return fn(self, other)

    lowered.__name__ = name
    return promote()(lowered)


for _packet, _fn in (
    (aten.bitwise_and, jnp.bitwise_and),
    (aten.bitwise_or, jnp.bitwise_or),
    (aten.bitwise_xor, jnp.bitwise_xor),
):
    lowers(_packet.Tensor, _packet.Scalar, _packet.Scalar_Tensor)(_bitwise(_packet.__name__, _fn))


def _left_shift(a, b):
    a, b = jnp.broadcast_arrays(a, b)
    bits = jnp.iinfo(a.dtype).bits
    # ATen shifts the unsigned twin and gives 0 for shifts out of [0, bits)
    ok = (b >= 0) & (b < bits)
    unsigned = jnp.dtype(f"uint{bits}")
    out = lax.shift_left(a.astype(unsigned), jnp.where(ok, b, 0).astype(unsigned))
    return jnp.where(ok, out.astype(a.dtype), jnp.zeros_like(a))


def _right_shift(a, b):
    a, b = jnp.broadcast_arrays(a, b)
    bits = jnp.iinfo(a.dtype).bits
    if jnp.issubdtype(a.dtype, jnp.unsignedinteger):
        ok = b < bits
        return jnp.where(ok, lax.shift_right_logical(a, jnp.where(ok, b, 0)), jnp.zeros_like(a))
    amount = jnp.where((b < 0) | (b >= bits), bits - 1, b)
    return lax.shift_right_arithmetic(a, amount.astype(a.dtype))


@lowers(
    aten.bitwise_left_shift.Tensor,
    aten.bitwise_left_shift.Tensor_Scalar,
    aten.bitwise_left_shift.Scalar_Tensor,
    aten.__lshift__.Tensor,
    aten.__lshift__.Scalar,
)
@promote()
def bitwise_left_shift(self, other):
    if not _is_int(self):
        raise _unsupported("lshift", self)
    return _left_shift(self, other)


@lowers(
    aten.bitwise_right_shift.Tensor,
    aten.bitwise_right_shift.Tensor_Scalar,
    aten.bitwise_right_shift.Scalar_Tensor,
    aten.__rshift__.Tensor,
    aten.__rshift__.Scalar,
)
@promote()
def bitwise_right_shift(self, other):
    if not _is_int(self):
        raise _unsupported("rshift", self)
    return _right_shift(self, other)


@lowers(aten.bitwise_not.default)
def bitwise_not(self):
    if _is_float(self):
        raise _unsupported("bitwise_not", self)
    return ~self


def _truth(x):
    return x if _is_bool(x) else x != 0


@lowers(aten.logical_not.default)
def logical_not(self):
    return ~_truth(self)


@lowers(aten.logical_and.default)
def logical_and(self, other):
    return _truth(self) & _truth(other)


@lowers(aten.logical_or.default)
def logical_or(self, other):
    return _truth(self) | _truth(other)


@lowers(aten.logical_xor.default)
def logical_xor(self, other):
    return _truth(self) ^ _truth(other)


# --- comparisons and selection ------------------------------------------------------


def _comparison(name, fn):
    def lowered(self, other):
        return fn(self, other)

    lowered.__name__ = name
    return promote(KIND.ALWAYS_BOOL)(lowered)


for _packet, _fn in (
    (aten.eq, jnp.equal),
    (aten.ne, jnp.not_equal),
    (aten.lt, jnp.less),
    (aten.le, jnp.less_equal),
    (aten.gt, jnp.greater),
    (aten.ge, jnp.greater_equal),
):
    lowers(_packet.Tensor, _packet.Scalar)(_comparison(_packet.__name__, _fn))


@lowers(aten.where.self)
def where(condition, self, other):
    compute, result = result_type(self, other)
    return jnp.where(_truth(condition), cast(self, result), cast(other, result))


@lowers(aten.clamp.default, aten.clamp.Tensor)
@promote()
def clamp(self, min=None, max=None):
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    out = self
    if min is not None:
        out = jnp.maximum(out, min)
    if max is not None:
        out = jnp.minimum(out, max)
    return out


@lowers(aten.clamp_min.default, aten.clamp_min.Tensor)
@promote()
def clamp_min(self, min):
    return jnp.maximum(self, min)


@lowers(aten.clamp_max.default, aten.clamp_max.Tensor)
@promote()
def clamp_max(self, max):
    return jnp.minimum(self, max)


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
    if _is_bool(self):
        raise _unsupported("abs", self)
    return jnp.abs(self)


@lowers(aten.neg.default)
def neg(self):
    if _is_bool(self):
        raise RuntimeError(
            "Negation, the `-` operator, on a bool tensor is not supported. If you are trying "
            "to invert a mask, use the `~` or `logical_not()` operator instead."
        )
    return -self


@lowers(aten.sign.default, aten.sgn.default)
def sign(self):
    if _is_bool(self):
        return self
    # ATen: sign(nan) = 0
    return jnp.where(jnp.isnan(self), 0, jnp.sign(self)).astype(self.dtype)


def _rounding(name, fn):
    def lowered(self):
        return fn(self) if _is_float(self) else self

    lowered.__name__ = name
    return lowered


for _packet, _fn in ((aten.floor, jnp.floor), (aten.ceil, jnp.ceil), (aten.trunc, jnp.trunc)):
    lowers(_packet.default)(_rounding(_packet.__name__, _fn))


@lowers(aten.round.default, aten.round.decimals)
@opmath
def round(self, decimals=0):
    if not _is_float(self):
        if decimals:
            raise _unsupported("round", self)
        return self
    if decimals == 0:
        return jnp.round(self)
    # ATen scales by 10**|decimals| the same way, so that rounding errors agree
    ten_pow = jnp.asarray(10.0 ** (decimals if decimals > 0 else -decimals), self.dtype)
    if decimals > 0:
        return jnp.round(self * ten_pow) / ten_pow
    return jnp.round(self / ten_pow) * ten_pow


@lowers(aten.frac.default)
def frac(self):
    if not _is_float(self):
        raise _unsupported("frac", self)
    return self - jnp.trunc(self)


@lowers(aten.angle.default)
@promote(KIND.INT_TO_FLOAT)
def angle(self):
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
    return jnp.isnan(self) if _is_float(self) else jnp.zeros(self.shape, jnp.bool_)


@lowers(aten.isinf.default)
def isinf(self):
    return jnp.isinf(self) if _is_float(self) else jnp.zeros(self.shape, jnp.bool_)


@lowers(aten.isfinite.default)
def isfinite(self):
    return jnp.isfinite(self) if _is_float(self) else jnp.ones(self.shape, jnp.bool_)


@lowers(aten.isposinf.default)
def isposinf(self):
    return self == jnp.inf if _is_float(self) else jnp.zeros(self.shape, jnp.bool_)


@lowers(aten.isneginf.default)
def isneginf(self):
    return self == -jnp.inf if _is_float(self) else jnp.zeros(self.shape, jnp.bool_)


@lowers(aten.signbit.default)
def signbit(self):
    if _is_float(self):
        return jnp.signbit(self)
    if _is_bool(self) or jnp.issubdtype(self.dtype, jnp.unsignedinteger):
        return jnp.zeros(self.shape, jnp.bool_)
    return self < 0


@lowers(aten.nan_to_num.default)
def nan_to_num(self, nan=None, posinf=None, neginf=None):
    if not _is_float(self):
        return self
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


# --- activations and their backward ops ----------------------------------------------


@lowers(aten.relu.default)
def relu(self):
    if _is_bool(self):
        raise _unsupported("clamp_min_scalar", self)
    return jnp.maximum(self, jnp.zeros((), self.dtype))


@lowers(aten.threshold.default)
def threshold(self, threshold, value):
    return jnp.where(self <= _s(threshold, self.dtype), _s(value, self.dtype), self)


@lowers(aten.threshold_backward.default)
@promote(n=2)
def threshold_backward(grad_output, self, threshold):
    return jnp.where(self <= _s(threshold, self.dtype), 0, grad_output)


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
    negative = jnp.expm1(self * _s(input_scale, t)) * _s(alpha, t) * _s(scale, t)
    return jnp.where(self <= 0, negative, self * _s(scale, t))


@lowers(aten.elu_backward.default)
@promote(n=1)
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    t = grad_output.dtype
    x = self_or_result.astype(t)
    negcoef, poscoef, negiptcoef = _s(alpha, t) * _s(scale, t), _s(scale, t), _s(input_scale, t)
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
    negative = jnp.expm1(self * _s(1 / alpha, t)) * _s(alpha, t)
    return jnp.where(self <= 0, negative, self)


@lowers(aten.leaky_relu.default)
@promote(n=1)
def leaky_relu(self, negative_slope=0.01):
    return jnp.where(self > 0, self, self * _s(negative_slope, self.dtype))


@lowers(aten.leaky_relu_backward.default)
@promote(n=2)
def leaky_relu_backward(grad_output, self, negative_slope, self_is_result):
    return jnp.where(self > 0, grad_output, grad_output * _s(negative_slope, self.dtype))


@lowers(aten.hardtanh.default)
def hardtanh(self, min_val=-1, max_val=1):
    if _is_bool(self):
        raise _unsupported("hardtanh", self)
    return jnp.minimum(jnp.maximum(self, _s(min_val, self.dtype)), _s(max_val, self.dtype))


@lowers(aten.hardtanh_backward.default)
@promote(n=2)
def hardtanh_backward(grad_output, self, min_val, max_val):
    t = self.dtype
    outside = (self <= _s(min_val, t)) | (self >= _s(max_val, t))
    return jnp.where(outside, 0, grad_output)


@lowers(aten.softplus.default)
@promote(n=1)
def softplus(self, beta=1, threshold=20):
    scaled = self * _s(beta, self.dtype)
    soft = jnp.log1p(jnp.exp(scaled)) / _s(beta, self.dtype)
    return jnp.where(scaled > _s(threshold, self.dtype), self, soft)


@lowers(aten.softplus_backward.default)
@promote(n=2)
def softplus_backward(grad_output, self, beta, threshold):
    scaled = self * _s(beta, self.dtype)
    z = jnp.exp(scaled)
    return jnp.where(scaled > _s(threshold, self.dtype), grad_output, grad_output * z / (z + 1))


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


@lowers(aten.hardshrink.default)
@promote(n=1)
def hardshrink(self, lambd=0.5):
    lambd = _s(lambd, self.dtype)
    return jnp.where((self >= -lambd) & (self <= lambd), 0, self)


@lowers(aten.hardshrink_backward.default)
@promote(n=2)
def hardshrink_backward(grad_out, self, lambd):
    lambd = _s(lambd, self.dtype)
    return jnp.where((self >= -lambd) & (self <= lambd), 0, grad_out)


@lowers(aten.softshrink.default)
@promote(n=1)
def softshrink(self, lambd=0.5):
    lambd = _s(lambd, self.dtype)
    return jnp.where(self > lambd, self - lambd, jnp.where(self < -lambd, self + lambd, 0))


@lowers(aten.softshrink_backward.default)
@promote(n=2)
def softshrink_backward(grad_output, self, lambd):
    lambd = _s(lambd, self.dtype)
    return jnp.where((self >= -lambd) & (self <= lambd), 0, grad_output)


@lowers(aten.log_sigmoid_forward.default)
@opmath
def log_sigmoid_forward(self):
    """The buffer is empty, as on CUDA: ``log_sigmoid_backward`` below does not need it."""
    out = jnp.minimum(self, 0) - jnp.log1p(jnp.exp(-jnp.abs(self)))
    return out, jnp.zeros((0,), self.dtype)


@lowers(aten.log_sigmoid_backward.default)
@opmath
def log_sigmoid_backward(grad_output, self, buffer):
    return grad_output * jax.nn.sigmoid(-self)


del _packet, _fn


@lowers(aten.complex.default)
def complex(real, imag):
    return lax.complex(*jnp.broadcast_arrays(real, imag))


@lowers(aten.polar.default)
def polar(abs, angle):
    abs, angle = jnp.broadcast_arrays(abs, angle)
    return lax.complex(abs * jnp.cos(angle), abs * jnp.sin(angle))
