"""Arithmetic lowerings: the binary and ternary elementwise ops of numbers (add, div, pow,
maximum, lerp, addcmul...), ``fill`` and ``zero``."""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
import jax.scipy.special as jsp
import torch
from jax import lax

from torch_pjrt.ops._helpers import check, divisible, is_bool, is_float, scalar, unsupported
from torch_pjrt.ops._promote import (
    KIND,
    cast,
    is_low_float,
    promote,
    result_type,
    rounded_to_common,
)
from torch_pjrt.ops.registry import dtype_of, lowers, number_result_type, refusal
from torch_pjrt.ops.scalar_fits import check_fits
from torch_pjrt.runtime import asserts

aten = torch.ops.aten


# --- arithmetic ---------------------------------------------------------------------


@lowers(aten.add.Tensor, aten.add.Scalar)
def add(self, other, alpha=1):
    return _add(self=self, other=other, alpha=_alpha(alpha, self, other))


def _alpha(alpha, self, other):
    # ATen converts alpha to the operands' common dtype: a half type rounds it
    if isinstance(alpha, (int, float)) and alpha == 1:
        return alpha
    return rounded_to_common(alpha, self, other)


@promote(n=2)
def _add(self, other, alpha=1):
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        other = other * jnp.asarray(alpha, other.dtype)
    return self + other


def _bool_operand(x) -> bool:
    return isinstance(x, bool) or (hasattr(x, "dtype") and is_bool(x))


@lowers(aten.sub.Tensor, aten.sub.Scalar)
def sub(self, other, alpha=1):
    # ATen's sub_check, on the operands as given (a Python True is a bool tensor too)
    if _bool_operand(self) and _bool_operand(other):
        raise refusal(
            RuntimeError(
                "Subtraction, the `-` operator, with two bool tensors is not supported. "
                "Use the `^` or `logical_xor()` operator instead."
            )
        )
    if _bool_operand(self) or _bool_operand(other):
        raise refusal(
            RuntimeError(
                "Subtraction, the `-` operator, with a bool tensor is not supported. If you "
                "are trying to invert a mask, use the `~` or `logical_not()` operator instead."
            )
        )
    return _sub(self=self, other=other, alpha=_alpha(alpha, self, other))


@promote(n=2)
def _sub(self, other, alpha=1):
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        other = other * jnp.asarray(alpha, other.dtype)
    return self - other


@lowers(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(self, other, alpha=1):
    return sub(self=other, other=self, alpha=alpha)


@lowers(aten.mul.Tensor, aten.mul.Scalar)
@promote(opmath_scalars=True)
def mul(self, other):
    if is_bool(self):
        return self & other
    return self * other


@lowers(aten.fill.Scalar, fits=("value",))
def fill(self, value):
    if jnp.iscomplexobj(value) and not jnp.iscomplexobj(self):
        value = jnp.real(value)  # (its imaginary part is zero: checked on the host)
    return jnp.full(self.shape, value, self.dtype)


@lowers(aten.fill.Tensor)
def fill_tensor(self, value):
    return jnp.broadcast_to(value.astype(self.dtype), self.shape)


@lowers(aten.zero.default)
def zero(self):
    return jnp.zeros(self.shape, self.dtype)


def _floor_divide(a, b):
    a, b = divisible(a, b)
    if is_float(a):
        # ATen's div_floor_floating, so that results agree with the CPU bit for bit
        mod = jnp.fmod(a, b)
        div = (a - mod) / b
        div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
        floor = jnp.floor(div)
        floor = jnp.where(div - floor > 0.5, floor + 1, floor)
        floor = jnp.where(div == 0, jnp.copysign(jnp.zeros_like(div), a / b), floor)
        return jnp.where(b == 0, a / b, floor)
    _check_divisor(b)
    q = lax.div(a, b)
    r = lax.rem(a, b)
    return jnp.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)


def _trunc_divide(a, b):
    a, b = divisible(a, b)
    if is_float(a):
        return jnp.trunc(a / b)
    _check_divisor(b)
    return lax.div(a, b)


def _check_divisor(b) -> None:
    """Integer division by zero raises on the CPU (XLA would give -1): checked on the
    device (``runtime.asserts``)."""
    asserts.check(b != 0, RuntimeError, "ZeroDivisionError")


@lowers(aten.div.Tensor, aten.div.Scalar)
@promote(KIND.INT_TO_FLOAT, opmath_scalars=True)
def div(self, other):
    self, other = divisible(self, other)
    return self / other


@lowers(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(self, other, rounding_mode=None):
    if rounding_mode is None:
        return div(self=self, other=other)
    compute, result = result_type(self, other)
    if rounding_mode == "trunc":
        compute = result  # ATen rounds the quotient to the result type before truncating
    a, b = cast(self, compute), cast(other, compute)
    if is_bool(a):
        raise unsupported(f"div_{rounding_mode}", a)
    out = _floor_divide(a, b) if rounding_mode == "floor" else _trunc_divide(a, b)
    return out.astype(result)


@lowers(aten.floor_divide.default, aten.floor_divide.Scalar)
@promote(opmath_scalars=True)
def floor_divide(self, other):
    if is_bool(self):
        raise unsupported("div_floor", self)
    return _floor_divide(self, other)


@lowers(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
@promote()
def remainder(self, other):
    if is_bool(self):
        raise unsupported("remainder", self)
    self, other = jnp.broadcast_arrays(self, other)
    if not is_float(self):
        _check_divisor(other)
    mod = jnp.fmod(self, other) if is_float(self) else lax.rem(self, other)
    return jnp.where((mod != 0) & ((other < 0) != (mod < 0)), mod + other, mod)


@lowers(aten.fmod.Tensor, aten.fmod.Scalar)
@promote()
def fmod(self, other):
    if is_bool(self):
        raise unsupported("fmod", self)
    self, other = jnp.broadcast_arrays(self, other)
    if not is_float(self):
        _check_divisor(other)
    return jnp.fmod(self, other) if is_float(self) else lax.rem(self, other)


def _int_pow(base, exp):
    # binary exponentiation over every bit of the exponent, wrapping as ATen's powi does
    # (jnp.power's looks at 6 bits: 0 ** 64 gave 1)
    exp = exp.astype(base.dtype)
    out = jnp.ones_like(base)
    square, rest = base, jnp.where(exp < 0, 0, exp)
    for _ in range(jnp.iinfo(exp.dtype).bits):
        out = jnp.where(rest & 1, out * square, out)
        square, rest = square * square, rest >> 1
    if jnp.issubdtype(exp.dtype, jnp.unsignedinteger):
        return out
    # negative exponents give 1 for base 1, +-1 for base -1 and 0 otherwise
    neg = jnp.where(base == 1, 1, jnp.where(base == -1, jnp.where(exp % 2 == 0, 1, -1), 0))
    return jnp.where(exp < 0, neg.astype(out.dtype), out)


def _pow_exponent_checks(self, exponent):
    # ATen's pow of a tensor to a Scalar: no negative integer power of an integer tensor
    # (one given as a tensor computes); the exponent converts to an integer or half
    # result type (float and double take any number)
    if not isinstance(exponent, (bool, int, float)):
        return
    dtype = dtype_of(self)
    inexact = dtype.is_floating_point or dtype.is_complex
    if isinstance(exponent, int) and exponent < 0 and not inexact:
        raise refusal(RuntimeError("Integers to negative integer powers are not allowed."))
    result = number_result_type(dtype, exponent.__class__)
    if not (result.is_floating_point or result.is_complex) or result.itemsize < 4:
        check_fits(exponent, result)


def _no_bool_pow(self, exponent):
    # CPU has no bool pow kernel; a bool tensor to a bool Scalar is a copy or ones
    if is_bool(self) and is_bool(exponent):
        raise refusal(NotImplementedError("\"pow\" not implemented for 'Bool'"))


@promote(KIND.BOOL_TO_LONG)
def _pow(self, exponent):
    if is_float(self):
        return jnp.power(self, exponent)
    return _int_pow(self, exponent)


@lowers(aten.pow.Tensor_Tensor)
def pow(self, exponent):
    _no_bool_pow(self, exponent)
    return _pow(self, exponent)


_CLOSED_FORM_POWERS = (jnp.float32, jnp.float64, jnp.bfloat16, jnp.complex64, jnp.complex128)


@lowers(aten.pow.Tensor_Scalar, host=_pow_exponent_checks)
def pow_tensor_scalar(self, exponent):
    if is_bool(self) and is_bool(exponent):  # ATen: x ** True is x, x ** False is ones
        return jnp.where(exponent, self, True)
    # (as measured against CPU PyTorch: float16 takes the general power, bfloat16 the
    # closed forms rounded at each step, complex numbers the closed forms: (1e20+1j) ** 2
    # is x * x = inf+2e20j, not a power's inf+infj)
    closed = self.dtype if self.dtype in _CLOSED_FORM_POWERS else None
    return _pow_number(self, exponent, closed)


@promote(KIND.BOOL_TO_LONG, n=2)
def _pow_number(self, exponent, closed):
    if closed is None:
        return _pow(self, exponent)
    # ATen's float kernels compute these exponents in closed form (x ** 2 is x * x,
    # x ** -0.5 one over a square root; bfloat16 rounds each step to it), where a
    # general power is one ulp off in up to a quarter of the elements; the exponent is a
    # run-time value, so the forms are selected by it. 1 / sqrt goes through a barrier:
    # XLA would make it an rsqrt, which is not rounded once.
    if is_low_float(closed):
        info = jnp.finfo(closed)
        step = functools.partial(
            lax.reduce_precision, exponent_bits=info.nexp, mantissa_bits=info.nmant
        )
    else:
        step = lambda v: v  # noqa: E731
    square = step(self * self)
    forms = (
        (0, jnp.ones_like(self)),
        (1, self),
        (2, square),
        (3, square * self),
        (-1, 1 / self),
        (-2, 1 / square),
        (0.5, jnp.sqrt(self)),
        (-0.5, 1 / lax.optimization_barrier(jnp.sqrt(self))),
    )
    out = jnp.power(self, exponent)
    for value, form in forms:
        out = jnp.where(exponent == value, form, out)
    return out


@lowers(aten.pow.Scalar)
def pow_scalar(self, exponent):
    _no_bool_pow(self, exponent)
    return _pow(self, exponent)


@lowers(aten.atan2.default)
@promote(KIND.INT_TO_FLOAT)
def atan2(self, other):
    return jnp.arctan2(self, other)


def _floats_only(name):
    """ATen's CPU kernel of ``name`` exists for floating types only: an integer or bool
    common dtype is refused in its words."""

    def wrap(fn):
        @functools.wraps(fn)
        def lowered(self, other):
            if not is_float(self):
                raise unsupported(name, self)
            return fn(self, other)

        return promote()(lowered)

    return wrap


@lowers(aten.hypot.default)
@_floats_only("hypot")
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


def complex_logaddexp(x, y):
    """log(exp(x) + exp(y)) of complex numbers as ATen's kernel computes it: the one of
    larger real part plus log1p(exp(the other minus it)) (``y`` the larger on a tie);
    NaN where either holds a NaN; two infinite real parts of one sign give the second
    number (both -inf) or log(exp(x) + exp(y)) (both +inf)."""
    x_lower = x.real < y.real
    lo, hi = jnp.where(x_lower, x, y), jnp.where(x_lower, y, x)
    out = hi + jnp.log1p(jnp.exp(lo - hi))
    infinite = jnp.isinf(lo.real) & (lo.real == hi.real)
    out = jnp.where(infinite, jnp.where(lo.real < 0, lo, jnp.log(jnp.exp(lo) + jnp.exp(hi))), out)
    return jnp.where(jnp.isnan(x) | jnp.isnan(y), jnp.asarray(complex("nan+nanj"), x.dtype), out)


@lowers(aten.logaddexp.default)
@_floats_only("logaddexp")
def logaddexp(self, other):
    if jnp.iscomplexobj(self):
        return complex_logaddexp(self, other)
    m = jnp.maximum(self, other)
    out = m + jnp.log1p(jnp.exp(-jnp.abs(self - other)))
    return jnp.where(jnp.isinf(self) & (self == other), self, out)


@lowers(aten.logaddexp2.default)
@_floats_only("logaddexp2")
def logaddexp2(self, other):
    m = jnp.maximum(self, other)
    out = m + jnp.log1p(jnp.exp2(-jnp.abs(self - other))) / math.log(2)
    return jnp.where(jnp.isinf(self) & (self == other), self, out)


def _in_result_type(fn):
    """ATen's kernels of these ops compute in the result type: for a half type each step
    rounds to it (the log, then the product)."""

    @functools.wraps(fn)
    def lowered(self, other):
        result = result_type(self, other, kind=KIND.INT_TO_FLOAT)[1]
        return fn(cast(self, result), cast(other, result))

    return lowered


@lowers(aten.xlogy.Tensor, aten.xlogy.Scalar_Self, aten.xlogy.Scalar_Other)
@_in_result_type
def xlogy(self, other):
    out = jnp.where(self == 0, jnp.zeros_like(self * other), self * jnp.log(other))
    return jnp.where(jnp.isnan(other), other, out)


@lowers(
    aten.special_xlog1py.default,
    aten.special_xlog1py.self_scalar,
    aten.special_xlog1py.other_scalar,
)
@_in_result_type
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
    if is_bool(self) or is_float(self):  # (integers only)
        raise unsupported("gcd", self)
    return jnp.gcd(self, other)


@lowers(aten.lcm.default)
@promote()
def lcm(self, other):
    if is_bool(self) or is_float(self):
        raise unsupported("lcm", self)
    return jnp.lcm(self, other)


@lowers(aten.maximum.default)
@promote()
def maximum(self, other):
    return self | other if is_bool(self) else jnp.maximum(self, other)


@lowers(aten.minimum.default)
@promote()
def minimum(self, other):
    return self & other if is_bool(self) else jnp.minimum(self, other)


@lowers(aten.fmax.default)
@promote()
def fmax(self, other):
    return jnp.fmax(self, other) if is_float(self) else maximum(self=self, other=other)


@lowers(aten.fmin.default)
@promote()
def fmin(self, other):
    return jnp.fmin(self, other) if is_float(self) else minimum(self=self, other=other)


@lowers(aten.heaviside.default)
def heaviside(self, values):
    check(
        self.dtype == values.dtype,
        "heaviside is not yet implemented for tensors with different dtypes.",
    )
    return jnp.where(self == 0, values, (self > 0).astype(self.dtype))


@lowers(aten.lerp.Scalar, aten.lerp.Tensor, fits=("weight",), fits_result=True)
@promote(opmath_scalars=True)
def lerp(self, end, weight):
    diff = end - self
    return jnp.where(jnp.abs(weight) < 0.5, self + weight * diff, end - diff * (1 - weight))


@lowers(aten.addcmul.default)
@promote(n=3)
def addcmul(self, tensor1, tensor2, value=1):
    if is_bool(self):
        return self | (tensor1 & tensor2 & cast(value, jnp.bool_))
    return self + scalar(value, self.dtype) * tensor1 * tensor2


@lowers(aten.addcdiv.default)
@promote(n=3)
def addcdiv(self, tensor1, tensor2, value=1):
    if not is_float(self):
        raise RuntimeError(
            "Integer division with addcdiv is no longer supported, and in a future release "
            "addcdiv will perform a true division of tensor1 and tensor2. The historic "
            "addcdiv behavior can be implemented as (input + value * torch.trunc(tensor1 / "
            "tensor2)).to(input.dtype) for integer inputs and as (input + value * tensor1 / "
            "tensor2) for float inputs. The future addcdiv behavior is just the latter "
            "implementation: (input + value * tensor1 / tensor2), for all dtypes."
        )
    tensor1, tensor2 = divisible(tensor1, tensor2)
    return self + scalar(value, self.dtype) * (tensor1 / tensor2)
