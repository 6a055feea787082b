"""Creation lowerings: ranges, identity matrices, triangle indices.

``full``, ``zeros``, ``ones``, ``scalar_tensor`` and the ``*_like`` ops are
CompositeExplicitAutograd in ATen (``empty`` then ``fill_``) and need nothing here.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_pjrt import random as pjrt_random
from torch_pjrt import runtime
from torch_pjrt.modes import fused
from torch_pjrt.ops.registry import implements, lowers
from torch_pjrt.runtime.transfer import jax_dtype
from torch_pjrt.tensor import wrap

aten = torch.ops.aten


def _dtype(dtype):
    return jax_dtype(dtype if dtype is not None else torch.get_default_dtype())


def _acc_dtype(dtype: torch.dtype):
    """PyTorch's CPU accumulation type, in which ranges are computed."""
    if dtype in (torch.float16, torch.bfloat16):
        return jnp.float32
    if dtype.is_floating_point:
        return jnp.float64
    return jnp.int64


# --- arange: its length depends on the values of its Scalar arguments ------------------


def _arange_length(start, end, step, dtype: torch.dtype) -> int:
    if dtype == torch.int64:
        start, end, step = int(start), int(end), int(step)
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if not (math.isfinite(start) and math.isfinite(end)):
        raise RuntimeError(f"unsupported range: {start} -> {end}")
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise RuntimeError("upper bound and larger bound inconsistent with step sign")
    if dtype == torch.int64:
        # ATen's integer formula: (end - start + step - sign(step)) / step, truncated
        sign = (step > 0) - (step < 0)
        return abs(end - start + step - sign) // abs(step)
    return max(math.ceil((float(end) - float(start)) / float(step)), 0)


@functools.cache
def _arange_program(length: int, dtype: torch.dtype):
    acc = _acc_dtype(dtype)

    def program(start, step):
        return (start.astype(acc) + step.astype(acc) * jnp.arange(length, dtype=acc)).astype(
            jax_dtype(dtype)
        )

    return jax.jit(program)


def _resized(out: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    # ATen's range kernels resize their output without the resize warning
    if out.shape != result.shape:
        out.resize_(result.shape)
    return out


def _device_index(device) -> int:
    if device is None:
        return pjrt_random.current_device()
    device = torch.device(device)
    return device.index if device.index is not None else pjrt_random.current_device()


def _arange(start, end, step, dtype: torch.dtype, index: int) -> torch.Tensor:
    length = _arange_length(start, end, step, dtype)
    # Python numbers go in as weakly typed arguments (cast to the accumulation dtype
    # inside the program): nothing to transfer, and fused mode records them as inputs
    to_python = int if jnp.issubdtype(_acc_dtype(dtype), jnp.integer) else float
    program = _arange_program(length, dtype)
    out = fused.apply(program, (to_python(start), to_python(step)), index, "arange")
    if out.__class__ is not fused.Pending and index != 0:
        out = jax.device_put(out, runtime.device(index))
    return wrap(out, index)


@implements(aten.arange.start_step)
def arange(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    if dtype is None:
        integral = all(isinstance(x, (bool, int)) for x in (start, end, step))
        dtype = torch.int64 if integral else torch.get_default_dtype()
    return _arange(start, end, step, dtype, _device_index(device))


@implements(aten.arange.start_out)
def arange_start_out(start, end, step=1, *, out):
    result = _arange(start, end, step, out.dtype, out.device.index or 0)
    return _resized(out, result).copy_(result)


@implements(aten.arange.out)
def arange_out(end, *, out):
    return arange_start_out(0, end, 1, out=out)


# --- linspace and logspace: static length ---------------------------------------------


def _spaced(start, end, steps: int, dtype):
    """PyTorch's CPU linspace: from both ends towards the middle, step in ``dtype``."""
    integral = not jnp.issubdtype(dtype, jnp.inexact)
    step_dtype = jnp.float64 if integral else dtype
    start, end = jnp.asarray(start).astype(dtype), jnp.asarray(end).astype(dtype)
    if steps == 1:
        return jnp.reshape(start, (1,)).astype(step_dtype)
    # XLA turns a division by a constant into a multiplication by its inexact reciprocal
    divisor = jax.lax.optimization_barrier(jnp.asarray(steps - 1, step_dtype))
    step = (end.astype(step_dtype) - start.astype(step_dtype)) / divisor
    i = jnp.arange(steps)
    from_start = start + step * i.astype(step_dtype)
    from_end = end - step * (steps - i - 1).astype(step_dtype)
    return jnp.where(i < steps // 2, from_start, from_end)


@lowers(aten.linspace.default)
def linspace(start, end, steps, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = _dtype(dtype)
    return _spaced(start, end, steps, dtype).astype(dtype)


@lowers(aten.logspace.default)
def logspace(start, end, steps, base=10.0, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = _dtype(dtype)
    if steps == 1:
        exponent = jnp.reshape(jnp.asarray(start).astype(jnp.float64), (1,))
        return jnp.power(jnp.float64(base), exponent).astype(dtype)
    if not jnp.issubdtype(dtype, jnp.inexact):
        exponent = _spaced(start, end, steps, dtype)
        return jnp.power(jnp.float64(base), exponent).astype(dtype)
    # reduced floats: the ends are rounded to dtype, the exponents computed in float32
    compute = jnp.float32 if jnp.finfo(dtype).bits < 32 else dtype
    start, end = (jnp.asarray(x).astype(dtype).astype(compute) for x in (start, end))
    exponent = _spaced(start, end, steps, compute)
    return jnp.power(jnp.asarray(base, compute), exponent).astype(dtype)


def _space_out(functional):
    def kernel(start, end, steps, *args, out):
        result = functional(start, end, steps, *args, dtype=out.dtype, device=out.device)
        return _resized(out, result).copy_(result)

    return kernel


implements(aten.linspace.out)(_space_out(aten.linspace.default))
implements(aten.logspace.out)(_space_out(aten.logspace.default))


# --- eye and triangle indices --------------------------------------------------------


@lowers(aten._efficientzerotensor.default)
def efficient_zero_tensor(size, dtype=None, layout=None, device=None, pin_memory=None):
    # PyTorch's backward formulas make these for gradients known to be zero (sgn of a
    # real input); pjrt has no ZeroTensor dispatch key, so the zeros are real
    return jnp.zeros(tuple(size), _dtype(dtype))


@lowers(aten.eye.default, aten.eye.m)
def eye(n, m=None, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, n if m is None else m, dtype=_dtype(dtype))


def _triangle_indices(row: int, col: int, offset: int, lower: bool, dtype):
    dtype = torch.int64 if dtype is None else dtype
    if lower:
        mask = np.tri(row, col, offset, dtype=bool)
    else:
        mask = ~np.tri(row, col, offset - 1, dtype=bool)
    return jnp.asarray(np.stack(np.nonzero(mask)).reshape(2, -1), jax_dtype(dtype))


@lowers(aten.tril_indices.default)
def tril_indices(row, col, offset=0, dtype=None, layout=None, device=None, pin_memory=None):
    return _triangle_indices(row, col, offset, True, dtype)


@lowers(aten.triu_indices.default)
def triu_indices(row, col, offset=0, dtype=None, layout=None, device=None, pin_memory=None):
    return _triangle_indices(row, col, offset, False, dtype)
