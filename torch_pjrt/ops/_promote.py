"""Type promotion for lowerings, declared once and computed by PyTorch's own rules.

Runs at trace time only: a lowering's dtypes are fixed in its compiled program.
Python ``Scalar`` arguments arrive as weakly typed JAX scalars and count as PyTorch's
wrapped numbers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as KIND
from torch._prims_common import elementwise_dtypes

from torch_pjrt.runtime.transfer import jax_dtype, torch_dtype

__all__ = ["KIND", "is_low_float", "is_weak", "opmath", "promote", "result_type", "stand_in"]


def is_low_float(dtype) -> bool:
    """bfloat16, float16 and the float8 types."""
    return jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32


def opmath(dtype):
    """The dtype ATen's CPU kernels compute and accumulate in: float32 for half types."""
    return jnp.float32 if is_low_float(dtype) else dtype


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


def promote(kind=KIND.DEFAULT, n=None):
    """Decorator: cast the first ``n`` (all, if None) arguments to the computation dtype
    and the result to the result dtype, following ``kind``.

    Example:
        >>> @lowers(aten.sin)
        ... @promote(KIND.INT_TO_FLOAT)
        ... def sin(self):
        ...     return jnp.sin(self)
    """

    def wrap(fn):
        import functools
        import inspect

        names = list(inspect.signature(fn).parameters)
        promoted = names if n is None else names[:n]

        @functools.wraps(fn)
        def lowered(*args, **kwargs):
            bound = dict(zip(names, args))
            bound.update(kwargs)
            values = [bound.get(name) for name in promoted]
            arrays = [v for v in values if v is not None and not isinstance(v, str)]
            compute, result = result_type(*arrays, kind=kind)
            for name in promoted:
                v = bound.get(name)
                if v is not None and not isinstance(v, str):
                    bound[name] = cast(v, compute)
            out = fn(**bound)
            return out.astype(result) if out.dtype != result else out

        return lowered

    return wrap


del jax
