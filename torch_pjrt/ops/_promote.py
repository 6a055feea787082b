"""Type promotion for lowerings, declared once and computed by PyTorch's own rules.

Runs at trace time only: a lowering's dtypes are fixed in its compiled program.
Python ``Scalar`` arguments arrive as weakly typed JAX scalars and count as PyTorch's
wrapped numbers.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as KIND
from torch._prims_common import elementwise_dtypes

from torch_pjrt.ops.registry import refusal
from torch_pjrt.runtime.transfer import jax_dtype, torch_dtype

__all__ = [
    "KIND",
    "in_opmath",
    "is_low_float",
    "is_weak",
    "opmath",
    "promote",
    "result_type",
    "rounded_to_common",
    "stand_in",
    "upcast",
]


def is_low_float(dtype) -> bool:
    """bfloat16, float16 and the float8 types."""
    return jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32


def opmath(dtype):
    """The dtype ATen's CPU kernels compute and accumulate in: float32 for half types."""
    return jnp.float32 if is_low_float(dtype) else dtype


def upcast(x):
    """``x`` in its :func:`opmath` dtype."""
    return x.astype(opmath(x.dtype))


def is_weak(x) -> bool:
    aval = getattr(x, "aval", None)
    return bool(getattr(aval, "weak_type", False))


def stand_in(x):
    """A meta tensor or Python number that PyTorch's promotion rules treat like ``x``."""
    if x is None or isinstance(x, (bool, int, float, complex)):
        return x
    if is_weak(x):
        kind = np.dtype(x.dtype).kind
        return {"b": True, "i": 1, "u": 1, "f": 1.0, "c": 1j}[kind]
    shape = () if x.ndim == 0 else (1,) * x.ndim
    return torch.empty(shape, dtype=torch_dtype(x.dtype), device="meta")


def result_type(*args, kind=KIND.DEFAULT):
    """(computation dtype, result dtype) as JAX dtypes, by PyTorch's rules."""
    compute, result = elementwise_dtypes(
        *(stand_in(a) for a in args if a is not None), type_promotion_kind=kind
    )
    return jax_dtype(compute), jax_dtype(result)


def cast(x, dtype):
    if isinstance(x, (bool, int, float, complex)):
        return jnp.asarray(x, dtype)
    return x if x.dtype == dtype else x.astype(dtype)


def promote(kind=KIND.DEFAULT, n=None, opmath_scalars=False):
    """Decorator: cast the first ``n`` (all, if None) arguments to the computation dtype
    and the result to the result dtype, following ``kind``.

    Where the operands' common dtype is a half type (computed in float32), each operand
    is first rounded to it, as ATen's TensorIterator converts its inputs to the common
    dtype: ``x_half + 0.1`` adds half(0.1). ``opmath_scalars``: the op's CPU kernel
    reads a number (or a 0-dim tensor) at its original value in float32 instead (ATen's
    ``original_scalar_value``: ``mul``, ``div``, ``lerp``'s weight).

    Example:
        >>> @lowers(aten.sin)
        ... @promote(KIND.INT_TO_FLOAT)
        ... def sin(self):
        ...     return jnp.sin(self)
    """

    def wrap(fn):
        import inspect

        names = list(inspect.signature(fn).parameters)
        promoted = names if n is None else names[:n]

        @functools.wraps(fn)
        def lowered(*args, **kwargs):
            bound = dict(zip(names, args))
            bound.update(kwargs)
            values = [bound.get(name) for name in promoted]
            arrays = [v for v in values if v is not None and not isinstance(v, str)]
            _check_broadcast([v.shape for v in arrays if hasattr(v, "shape")])
            compute, result = result_type(*arrays, kind=kind)
            store = _common_half(arrays, kind, compute, result)
            for name in promoted:
                v = bound.get(name)
                if v is not None and not isinstance(v, str):
                    if store is not None and not (opmath_scalars and _is_scalar(v)):
                        v = cast(v, store)
                    bound[name] = cast(v, compute)
            out = fn(**bound)
            return out.astype(result) if out.dtype != result else out

        return lowered

    return wrap


def _common_half(arrays, kind, compute, result):
    """The half type the operands are rounded to before a float32 computation, or None."""
    if compute != jnp.float32:
        return None
    if kind == KIND.ALWAYS_BOOL:  # (a comparison: the operands' common dtype)
        result = result_type(*arrays, kind=KIND.NO_OPMATH)[1]
    return result if is_low_float(result) else None


def rounded_to_common(value, *operands):
    """``value`` rounded to the operands' common dtype where that is a half type (which
    ATen converts a Scalar argument such as ``alpha`` to), else as it is."""
    arrays = [a for a in operands if a is not None]
    compute, result = result_type(*arrays)
    store = _common_half(arrays, KIND.DEFAULT, compute, result)
    return value if store is None else cast(value, store)


def _is_scalar(x) -> bool:
    """A number, or a 0-dim tensor (a CPU kernel reads both as a scalar)."""
    return isinstance(x, (bool, int, float, complex)) or x.ndim == 0


def _check_broadcast(shapes) -> None:
    """TensorIterator's broadcast of an elementwise op's operands, in its words (the Meta
    kernels of these ops word a mismatch otherwise)."""
    if len(shapes) < 2:
        return
    out = tuple(shapes[0])
    for shape in shapes[1:]:
        n = max(len(out), len(shape))
        a, b = (1,) * (n - len(out)) + out, (1,) * (n - len(shape)) + tuple(shape)
        for i in reversed(range(n)):
            if a[i] != b[i] and a[i] != 1 and b[i] != 1:
                raise refusal(
                    RuntimeError(
                        f"The size of tensor a ({a[i]}) must match the size of tensor b "
                        f"({b[i]}) at non-singleton dimension {i}"
                    )
                )
        out = tuple(y if x == 1 else x for x, y in zip(a, b))


_LOW = (jnp.float16, jnp.bfloat16)


def in_opmath(fn):
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
    return isinstance(v, jax.Array) and not is_weak(v) and v.dtype in _LOW
