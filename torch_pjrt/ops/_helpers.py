"""Small helpers shared by the lowering files: dtype tests and names, dimensions,
gradients by ``jax.vjp``, running a function on a tensor's array.

Type promotion has its own module, ``_promote.py``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax import lax

from torch_pjrt.device.tensor import read
from torch_pjrt.ops._promote import cast
from torch_pjrt.ops.registry import dtype_of, refusal
from torch_pjrt.runtime import asserts, executor
from torch_pjrt.runtime import events as metrics
from torch_pjrt.runtime.transfer import jax_dtype

# --- dtypes -----------------------------------------------------------------------------


def is_float(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def is_bool(x) -> bool:
    return x.dtype == jnp.bool_


def is_int(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.integer)


def dtype_name(dtype: torch.dtype) -> str:
    """PyTorch's name of ``dtype`` in error messages: Float, Long, ComplexDouble..."""
    return str(torch.empty((), dtype=dtype, device="meta").type()).split(".")[-1][:-6]


def unsupported(op: str, x, cpu: bool = True) -> NotImplementedError:
    """CPU PyTorch's refusal of a dtype its kernel ``op`` (``"{op}_cpu"`` where ``cpu``)
    has no instance for; ``x`` a JAX array or a torch tensor."""
    name = dtype_name(dtype_of(x))
    kernel = f"{op}_cpu" if cpu else op
    return refusal(NotImplementedError(f"\"{kernel}\" not implemented for '{name}'"))


def check(ok: bool, message, error: type = RuntimeError) -> None:
    """``torch._check`` for a lowering: raise ``error(message)`` (``message`` a string or
    a function making one) as a :func:`refusal` unless ``ok``; for PyTorch's argument
    checks that its Meta kernel does not make, or words otherwise than the CPU."""
    if not ok:
        raise refusal(error(message() if callable(message) else message))


def scalar(value, dtype):
    """A Scalar argument in ``dtype`` (weak JAX scalars would otherwise promote ints)."""
    return cast(value, dtype)


# --- dimensions -------------------------------------------------------------------------


def wrap_dim(dim: int, ndim: int) -> int:
    """A negative ``dim`` counted from the end (a 0-d tensor has one dim to wrap)."""
    return dim % max(ndim, 1) if dim < 0 else dim


def slice_bounds(size: int, start, end, step: int) -> tuple[int, int, int]:
    """A slice's (start, end, step) clamped to a dim of ``size``, as ATen's slice does."""
    start = 0 if start is None else start
    end = size if end is None else end
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end, step


def maybe_wrap_dim(d: int, ndim: int) -> int:
    """``wrap_dim`` that raises PyTorch's IndexError for a dim out of range."""
    n = ndim if ndim > 0 else 1
    if not -n <= d < n:
        raise refusal(
            IndexError(
                f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {d})"
            )
        )
    return d % n


def to_last(x, dim):
    """``x`` with ``dim`` moved last (0-d tensors become 1-element vectors)."""
    if x.ndim == 0:
        return x.reshape(1)
    return jnp.moveaxis(x, maybe_wrap_dim(dim, x.ndim), -1)


def from_last(y, like, dim, keepdim):
    """Undo :func:`to_last` for a result that reduced the last axis to one element."""
    if like.ndim == 0:
        return y.reshape(())
    y = jnp.moveaxis(y, -1, maybe_wrap_dim(dim, like.ndim))
    return y if keepdim else jnp.squeeze(y, maybe_wrap_dim(dim, like.ndim))


# --- gradients and argument lists -----------------------------------------------------


def ntuple(values, n: int) -> tuple:
    """An int or a one-element list repeated ``n`` times; a longer list as it is."""
    values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
    return values * n if len(values) == 1 else values


def vjp(fn, primals, cotangent, mask):
    """Gradients of ``fn`` at ``primals``, None where ``mask`` is False."""
    if not any(mask):
        return (None,) * len(primals)
    _, pullback = jax.vjp(fn, *primals)
    grads = pullback(cotangent.astype(_result_dtype(fn, primals)))
    return tuple(g if m else None for g, m in zip(grads, mask))


def _result_dtype(fn, primals):
    return jax.eval_shape(fn, *primals).dtype


# --- factories --------------------------------------------------------------------------


def default_dtype(dtype, like=None):
    """A factory's JAX dtype: ``dtype``, else ``like``'s, else the default dtype."""
    if dtype is not None:
        return jax_dtype(dtype)
    return like.dtype if like is not None else jax_dtype(torch.get_default_dtype())


def spaced(start, end, steps: int, dtype):
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


# --- running a function on a tensor's array (ops whose output shape depends on values) --


_jitted = executor.helper("run_jitted", lambda fn, statics: functools.partial(fn, **dict(statics)))


def host_int(array) -> int:
    """A device scalar read on the host: the one sync of a data-dependent shape (a value
    of a failed check refused, as every read of the device is)."""
    metrics.host_sync()
    asserts.refuse_read(array)
    return int(jax.device_get(array))


def run_jitted(fn, t: torch.Tensor, **statics):
    """``fn`` on t's array, jitted once per static arguments; JAX arrays out."""
    with jax.enable_x64(True):
        return _jitted(fn, tuple(sorted(statics.items())))(read(t))


# --- indices checked on the device (indexing, scatter) --------------------------------


def add_at(self, where, values):
    """``self.at[where].add(values)``; for bool, PyTorch's add is a logical or."""
    if self.dtype != jnp.bool_:
        return self.at[where].add(values)
    return self.astype(jnp.int32).at[where].add(values.astype(jnp.int32)) != 0


def check_index(index, size: int, message: str, error=IndexError, negative=True) -> None:
    """Check on the device that ``index`` is in ``[-size, size)`` (``negative``) or
    ``[0, size)``; else ``error(message)`` at the next host sync, ``{}`` in ``message``
    being the first bad index."""
    ok = (index < size) & (index >= (-size if negative else 0))
    asserts.check(ok, error, message, asserts.first_bad(index, ok))


def out_of_bounds(dim: int, size: int) -> str:
    """CPU PyTorch's message for an index out of a dim's bounds (``{}``: the index)."""
    return f"index {{}} is out of bounds for dimension {dim} with size {size}"


def divisible(a, b):
    """``a`` and ``b`` broadcast to one shape, for ``a / b`` rounded once as ATen divides.
    XLA's simplifier turns a division by a broadcast value (a number, a row) into a
    multiplication by its reciprocal: two roundings, one ulp off in about a quarter of
    the elements. A broadcast float divisor goes through an optimization barrier, which
    hides the broadcast from the simplifier and is dropped after it (the division still
    fuses with the broadcast; nothing is materialised)."""
    shape = jnp.broadcast_shapes(jnp.shape(a), jnp.shape(b))
    if jnp.shape(b) != shape and jnp.issubdtype(jnp.result_type(b), jnp.inexact):
        return jnp.broadcast_to(a, shape), lax.optimization_barrier(jnp.broadcast_to(b, shape))
    return jnp.broadcast_arrays(a, b)
