"""Comparison, logical and bitwise lowerings, and selection (``where``, ``clamp``)."""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from torch_pjrt.ops._helpers import is_bool, is_float, is_int, unsupported
from torch_pjrt.ops._promote import KIND, cast, promote, result_type
from torch_pjrt.ops.registry import lowers

aten = torch.ops.aten


# --- bitwise and logical ------------------------------------------------------------


def _bitwise(name, fn):
    def lowered(self, other):
        if is_float(self):
            raise unsupported(name, self)
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
    if not is_int(self):
        raise unsupported("lshift", self)
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
    if not is_int(self):
        raise unsupported("rshift", self)
    return _right_shift(self, other)


@lowers(aten.bitwise_not.default)
def bitwise_not(self):
    if is_float(self):
        raise unsupported("bitwise_not", self)
    return ~self


def _truth(x):
    return x if is_bool(x) else x != 0


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


@lowers(aten.clamp.Tensor)
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


@lowers(aten.clamp_min.Tensor)
@promote()
def clamp_min(self, min):
    return jnp.maximum(self, min)


@lowers(aten.clamp_max.Tensor)
@promote()
def clamp_max(self, max):
    return jnp.minimum(self, max)


def _scalar_bounds(fn):
    """A clamp overload with Scalar bounds: CPU has no bool kernel for it (the Tensor
    overloads have one)."""

    def lowered(self, **bounds):
        given = [b for b in bounds.values() if b is not None]
        if is_bool(self) and given and all(is_bool(b) for b in given):
            kind = "" if len(given) > 1 else "_min" if bounds.get("min") is not None else "_max"
            raise unsupported(f"clamp{kind}_scalar", self)
        return fn(self, **bounds)

    return lowered


for _op, _fn, _bounds in (
    (aten.clamp.default, clamp, ("min", "max")),
    (aten.clamp_min.default, clamp_min, ("min",)),
    (aten.clamp_max.default, clamp_max, ("max",)),
):
    lowers(_op, fits=_bounds, fits_result=True)(_scalar_bounds(_fn))


del _packet, _fn, _op, _bounds
