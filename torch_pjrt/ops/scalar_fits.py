"""Whether a Python number fits a dtype, as ATen converts a Scalar argument to the
tensor's element type (``Scalar::to<T>``, c10's ``overflows``): a fill value, a clamp
bound or a ``value=`` that the dtype cannot hold is refused with CPU PyTorch's error,
"value cannot be converted to type int8_t without overflow", before anything runs.

The rules, c10's: a floating-point or complex target takes infinities and NaN and
refuses finite values past its range (a complex target, each part in its real type's);
a complex value for a real target must have a zero imaginary part; an integer target
refuses NaN, infinities and values past its range (floats compared unrounded:
``127.9`` does not fit ``int8``), except that an unsigned target takes a negative
integer down to minus its maximum (two's complement wrap: ``-1`` fills ``uint8`` with
255); ``bool`` takes anything. (CPU PyTorch's ``fill_`` of a one-element tensor takes
a shortcut that skips the check; pjrt checks always, as CUDA does.)

Ops opt in with ``lowers(..., fits=(names))`` (``registry.py``); the check is host
work on the call's Python numbers, no device value is read. A value given as a 0-dim
tensor (``masked_fill.Tensor``) is checked on the device instead: :func:`value_fits`
inside the program, reported as the value checks are (``runtime/asserts.py``).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch

__all__ = ["c10_name", "check_fits", "fits", "value_fits"]

# c10's names of the element types, as its overflow error prints them
_NAMES = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16",
    torch.float8_e4m3fn: "c10::Float8_e4m3fn",
    torch.float8_e5m2: "c10::Float8_e5m2",
    torch.complex64: "c10::complex<float>",
    torch.complex128: "c10::complex<double>",
    torch.int64: "int64_t",
    torch.int32: "int",
    torch.int16: "int16_t",
    torch.int8: "int8_t",
    torch.uint8: "uint8_t",
    torch.uint16: "uint16_t",
    torch.uint32: "uint32_t",
    torch.uint64: "uint64_t",
}
_PART = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def _float_fits(value, dtype: torch.dtype) -> bool:
    value = float(value)
    if math.isinf(value) or math.isnan(value):
        return True
    info = torch.finfo(dtype)
    return info.min <= value <= info.max


def _int_fits(value, dtype: torch.dtype) -> bool:
    info = torch.iinfo(dtype)
    if isinstance(value, float):
        return not (math.isinf(value) or math.isnan(value)) and info.min <= value <= info.max
    if info.min == 0 and value < 0:  # unsigned: negative integers wrap
        return -value <= info.max
    return info.min <= value <= info.max


def fits(value, dtype: torch.dtype) -> bool:
    """Whether the Python number ``value`` converts to ``dtype`` without overflow."""
    if dtype is torch.bool or isinstance(value, bool) or dtype not in _NAMES:
        return True
    if dtype.is_complex:
        part = _PART[dtype]
        value = complex(value)
        return _float_fits(value.real, part) and _float_fits(value.imag, part)
    if isinstance(value, complex):
        if value.imag != 0:
            return False
        value = value.real
    if dtype.is_floating_point:
        return _float_fits(value, dtype)
    return _int_fits(value, dtype)


def check_fits(value, dtype: torch.dtype) -> None:
    """Raise CPU PyTorch's error unless the Python number ``value`` fits ``dtype``."""
    if not fits(value, dtype):
        raise RuntimeError(f"value cannot be converted to type {_NAMES[dtype]} without overflow")


def c10_name(dtype: torch.dtype) -> str | None:
    """c10's name of ``dtype`` as the overflow error prints it (None for bool)."""
    return _NAMES.get(dtype)


def value_fits(value, dtype) -> jnp.ndarray:
    """:func:`fits` for a JAX value (a 0-dim tensor's) and a JAX ``dtype``, on the
    device: a boolean array."""
    dtype = jnp.dtype(dtype)
    if dtype == jnp.bool_ or value.dtype == jnp.bool_:
        return jnp.ones((), jnp.bool_)
    ok = jnp.ones((), jnp.bool_)
    if jnp.iscomplexobj(value) and not jnp.issubdtype(dtype, jnp.complexfloating):
        ok, value = jnp.imag(value) == 0, jnp.real(value)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        part = jnp.finfo(dtype).dtype
        parts = (jnp.real(value), jnp.imag(value)) if jnp.iscomplexobj(value) else (value,)
        return ok & jnp.all(jnp.stack([_float_ok(p, part) for p in parts]))
    if jnp.issubdtype(dtype, jnp.floating):
        return ok & _float_ok(value, dtype)
    info = jnp.iinfo(dtype)
    if jnp.issubdtype(value.dtype, jnp.floating):
        v = value.astype(jnp.float64)
        return ok & jnp.isfinite(v) & (v >= info.min) & (v <= info.max)
    v = value.astype(jnp.int64) if info.max <= 2**63 - 1 else value
    if info.min == 0:  # unsigned: negative integers wrap
        return ok & ((v >= 0) & (v <= info.max) | (v < 0) & (-v <= info.max))
    return ok & (v >= info.min) & (v <= info.max)


def _float_ok(value, dtype):
    info = jnp.finfo(dtype)
    v = value.astype(jnp.float64)
    return ~jnp.isfinite(v) | ((v >= float(info.min)) & (v <= float(info.max)))
