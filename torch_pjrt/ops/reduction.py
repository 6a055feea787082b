"""Reduction lowerings: sums and means, extrema with indices, statistics and norms, scans."""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from torch_pjrt.ops._helpers import (
    check,
    dtype_name,
    from_last,
    is_bool,
    is_float,
    maybe_wrap_dim,
    to_last,
    unsupported,
)
from torch_pjrt.ops._promote import KIND, result_type
from torch_pjrt.ops.arithmetic import complex_logaddexp
from torch_pjrt.ops.registry import lowers
from torch_pjrt.runtime.transfer import jax_dtype, torch_dtype

aten = torch.ops.aten

_LOW = (jnp.float16, jnp.bfloat16)


# --- helpers ------------------------------------------------------------------------


def _dims(dim) -> tuple:
    """The dims as given: None or an empty list (all of them) are ()."""
    if dim is None:
        return ()
    return (dim,) if isinstance(dim, int) else tuple(dim)


def _axes(dim, ndim: int) -> tuple:
    """Reduced axes; None or an empty list mean all of them, as in ATen, whose checks of
    a list of dims (``dim_list_to_bitset``) it makes."""
    dims = _dims(dim)
    if not dims:
        return tuple(range(ndim))
    check(ndim <= 64, "only tensors with up to 64 dims are supported")
    axes = [maybe_wrap_dim(d, ndim) for d in dims]
    for i, a in enumerate(axes):
        check(a not in axes[:i], lambda: f"dim {a} appears multiple times in the list of dims")
    return tuple(a for a in sorted(axes) if a < ndim)  # dim 0 of a 0-d tensor reduces nothing


def _acc(dtype):
    """Accumulation dtype: ATen's CPU reductions sum half types in float32."""
    return jnp.float32 if dtype in _LOW else dtype


def _int_to_long(x, dtype):
    """The dtype of sum/prod/cumsum: ``dtype`` if given, int64 for integers and bool."""
    if dtype is not None:
        return jax_dtype(dtype)
    return x.dtype if is_float(x) else jnp.int64


def _count(shape, axes) -> int:
    n = 1
    for a in axes:
        n *= shape[a]
    return n


# --- sums, products, means ----------------------------------------------------------


@lowers(aten.sum.default, aten.sum.dim_IntList)
def sum(self, dim=None, keepdim=False, dtype=None):
    out = _int_to_long(self, dtype)
    x = self.astype(out)
    return jnp.sum(x, _axes(dim, self.ndim), dtype=_acc(out), keepdims=keepdim).astype(out)


@lowers(aten.nansum.default)
def nansum(self, dim=None, keepdim=False, dtype=None):
    x = jnp.where(jnp.isnan(self), 0, self) if is_float(self) else self
    return sum(self=x, dim=dim, keepdim=keepdim, dtype=dtype)


@lowers(aten.prod.default, aten.prod.dim_int)
def prod(self, dim=None, keepdim=False, dtype=None):
    out = _int_to_long(self, dtype)
    x = self.astype(out)
    return jnp.prod(x, _axes(dim, self.ndim), dtype=_acc(out), keepdims=keepdim).astype(out)


@lowers(aten.mean.default, aten.mean.dim)
def mean(self, dim=None, keepdim=False, dtype=None):
    out = jax_dtype(dtype) if dtype is not None else self.dtype
    check(
        jnp.issubdtype(out, jnp.inexact),
        lambda: (
            "mean(): could not infer output dtype. "
            f"{'Input' if dtype is None else 'Optional'} dtype must be either a floating point "
            f"or complex dtype. Got: {dtype_name(torch_dtype(out))}"
        ),
    )
    axes = _axes(dim, self.ndim)
    total = jnp.sum(self.astype(out), axes, dtype=_acc(out), keepdims=keepdim)
    return (total / _count(self.shape, axes)).astype(out)


@lowers(aten.count_nonzero.default, aten.count_nonzero.dim_IntList)
def count_nonzero(self, dim=None):
    return jnp.sum(self != 0, _axes(dim, self.ndim), dtype=jnp.int64)


# --- extrema ------------------------------------------------------------------------


def _check_nonempty(name: str, x, dims) -> None:
    """ATen's check that an extremum (no identity) has elements to reduce along ``dims``
    (as given), ``zero_numel_check_dims``; ``name`` as its messages print it."""
    if x.size:
        return
    check(
        bool(dims),
        lambda: (
            f"{name}: Expected reduction dim to be specified for input.numel() == 0. "
            "Specify the reduction dim with the 'dim' argument."
        ),
    )
    for d in dims:
        if x.ndim == 0:
            message = f"{name}: Expected reduction dim -1 or 0 for scalar but received {d}"
            check(d in (0, -1), message, IndexError)
        else:
            message = f"{name}: Expected reduction dim {d} to have non-zero size."
            check(x.shape[d] != 0, message, IndexError)


@lowers(aten.amax.default)
def amax(self, dim=(), keepdim=False):
    axes = _axes(dim, self.ndim)
    _check_nonempty("amax()", self, _dims(dim))
    return jnp.max(self, axes, keepdims=keepdim)


@lowers(aten.amin.default)
def amin(self, dim=(), keepdim=False):
    axes = _axes(dim, self.ndim)
    _check_nonempty("amin()", self, _dims(dim))
    return jnp.min(self, axes, keepdims=keepdim)


@lowers(aten.aminmax.default)
def aminmax(self, dim=None, keepdim=False):
    if dim is None:
        check(
            self.size > 0,
            "aminmax(): cannot compute aminmax over an empty dimension as the operation has "
            "no identity.",
        )
        lo, hi = jnp.min(self), jnp.max(self)
        shape = (1,) * self.ndim if keepdim else ()
        return lo.reshape(shape), hi.reshape(shape)
    _check_nonempty("aminmax", self, [maybe_wrap_dim(dim, self.ndim)])
    return amin(self=self, dim=[dim], keepdim=keepdim), amax(self=self, dim=[dim], keepdim=keepdim)


@lowers(aten.max.default)
def max(self):
    _check_nonempty("max()", self, ())
    return jnp.max(self)


@lowers(aten.min.default)
def min(self):
    _check_nonempty("min()", self, ())
    return jnp.min(self)


def _arg_extreme(x, axis, largest):
    """Index of the first maximum (minimum), NaN counting as the extreme, as in ATen."""
    return (jnp.argmax if largest else jnp.argmin)(x, axis).astype(jnp.int64)


def _values_indices(x, dim, keepdim, largest):
    v = to_last(x, dim)
    if v.shape[-1] == 0:
        raise IndexError(
            f"{'max' if largest else 'min'}(): Expected reduction dim {dim} to have non-zero size."
        )
    values = (jnp.max if largest else jnp.min)(v, -1, keepdims=True)
    indices = _arg_extreme(v, -1, largest)[..., None]
    return from_last(values, x, dim, keepdim), from_last(indices, x, dim, keepdim)


@lowers(aten.max.dim)
def max_dim(self, dim, keepdim=False):
    return _values_indices(self, dim, keepdim, largest=True)


@lowers(aten.min.dim)
def min_dim(self, dim, keepdim=False):
    return _values_indices(self, dim, keepdim, largest=False)


def _argextreme(x, dim, keepdim, largest):
    if dim is None:
        name = "argmax" if largest else "argmin"
        message = f"{name}(): Expected reduction dim to be specified for input.numel() == 0."
        check(x.size != 0, message, IndexError)
        i = _arg_extreme(x.reshape(-1), 0, largest)
        return i.reshape((1,) * x.ndim) if keepdim else i
    v = to_last(x, dim)
    return from_last(_arg_extreme(v, -1, largest)[..., None], x, dim, keepdim)


@lowers(aten.argmax.default)
def argmax(self, dim=None, keepdim=False):
    check(not is_bool(self), "argmax(): does not support bool input")
    check(not jnp.iscomplexobj(self), "argmax(): does not support complex input")
    return _argextreme(self, dim, keepdim, largest=True)


@lowers(aten.argmin.default)
def argmin(self, dim=None, keepdim=False):
    check(not is_bool(self), "argmin(): does not support bool input")
    check(not jnp.iscomplexobj(self), "argmin(): does not support complex input")
    return _argextreme(self, dim, keepdim, largest=False)


def _logical_dtype(x):
    # ATen keeps uint8 for any/all of uint8 tensors
    return jnp.uint8 if x.dtype == jnp.uint8 else jnp.bool_


@lowers(aten.any.default, aten.any.dim, aten.any.dims)
def any(self, dim=None, keepdim=False):
    return jnp.any(self != 0, _axes(dim, self.ndim), keepdims=keepdim).astype(_logical_dtype(self))


@lowers(aten.all.default, aten.all.dim, aten.all.dims)
def all(self, dim=None, keepdim=False):
    return jnp.all(self != 0, _axes(dim, self.ndim), keepdims=keepdim).astype(_logical_dtype(self))


# --- statistics ---------------------------------------------------------------------


def _real(dtype):
    """The real dtype of a complex one (float32 for complex64); a real dtype itself."""
    return jnp.finfo(dtype).dtype if jnp.issubdtype(dtype, jnp.complexfloating) else dtype


def _var_mean(x, dim, correction, keepdim, name="std and var"):
    """The variance (of a complex tensor: the mean squared distance from the mean, real)
    and the mean, in the accumulation dtype."""
    check(is_float(x), f"{name} only support floating point and complex dtypes")
    axes = _axes(dim, x.ndim)
    n = _count(x.shape, axes)
    acc = x.astype(_acc(x.dtype))
    mean = jnp.sum(acc, axes, keepdims=True) / n
    correction = 1 if correction is None else correction
    d = acc - mean
    squares = jnp.square(d.real) + jnp.square(d.imag) if jnp.iscomplexobj(d) else jnp.square(d)
    denom = jnp.maximum(n - correction, 0).astype(squares.dtype)
    var = jnp.sum(squares, axes, keepdims=keepdim) / denom
    if not keepdim:
        mean = jnp.squeeze(mean, axes)
    return var, mean


@lowers(aten.var.correction)
def var(self, dim=None, correction=None, keepdim=False):
    v, _ = _var_mean(self, dim, correction, keepdim)
    return v.astype(_real(self.dtype))


@lowers(aten.std.correction)
def std(self, dim=None, correction=None, keepdim=False):
    v, _ = _var_mean(self, dim, correction, keepdim)
    return jnp.sqrt(v).astype(_real(self.dtype))


@lowers(aten.var_mean.correction)
def var_mean(self, dim=None, correction=None, keepdim=False):
    v, m = _var_mean(self, dim, correction, keepdim, "var_mean")
    return v.astype(_real(self.dtype)), m.astype(self.dtype)


@lowers(aten.std_mean.correction)
def std_mean(self, dim=None, correction=None, keepdim=False):
    v, m = _var_mean(self, dim, correction, keepdim, "std_mean")
    return jnp.sqrt(v).astype(_real(self.dtype)), m.astype(self.dtype)


@lowers(aten.logsumexp.default)
def logsumexp(self, dim, keepdim=False):
    _, out = result_type(self, kind=KIND.INT_TO_FLOAT)
    x = self.astype(_acc(out))
    axes = _axes(dim, self.ndim)
    if x.size == 0:
        return jnp.log(jnp.sum(jnp.exp(x), axes, keepdims=keepdim)).astype(out)
    # (complex: shifted by the largest real part, as ATen; the result's imaginary part
    # is then the principal logarithm's)
    m = jnp.max(x.real if jnp.iscomplexobj(x) else x, axes, keepdims=True)
    m = jnp.where(jnp.isinf(m), 0, m)
    total = jnp.sum(jnp.exp(x - m), axes, keepdims=True)
    y = jnp.log(total) + m
    return (y if keepdim else jnp.squeeze(y, axes)).astype(out)


def _vector_norm(x, ord, axes, keepdim):
    a = jnp.abs(x)
    ord = 2 if ord is None else ord
    if a.size == 0 or ord == 1:
        return jnp.sum(a, axes, keepdims=keepdim)
    if ord == jnp.inf:
        return jnp.max(a, axes, keepdims=keepdim)
    if ord == -jnp.inf:
        return jnp.min(a, axes, keepdims=keepdim)
    if ord == 0:
        return jnp.sum((a != 0).astype(a.dtype), axes, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(a * a, axes, keepdims=keepdim))
    return jnp.sum(a**ord, axes, keepdims=keepdim) ** (1 / ord)


@lowers(aten.linalg_vector_norm.default, static=("ord",))
def linalg_vector_norm(self, ord=2, dim=None, keepdim=False, dtype=None):
    if not is_float(self):
        raise RuntimeError(
            "linalg.vector_norm: Expected a floating point or complex tensor as input. Got "
            + str(self.dtype)
        )
    out = jax_dtype(dtype) if dtype is not None else self.dtype
    x = self.astype(_acc(out))
    return _vector_norm(x, ord, _axes(dim, self.ndim), keepdim).astype(_real(out))


@lowers(
    aten.norm.Scalar,
    aten.norm.ScalarOpt_dim,
    aten.norm.ScalarOpt_dtype,
    aten.norm.ScalarOpt_dim_dtype,
    static=("p",),
)
def norm(self, p=2, dim=None, keepdim=False, dtype=None):
    return linalg_vector_norm(self=self, ord=p, dim=dim, keepdim=keepdim, dtype=dtype)


@lowers(aten.renorm.default, static=("p",))
def renorm(self, p, dim, maxnorm):
    if self.ndim < 2 or p <= 0 or not is_float(self):
        raise RuntimeError("renorm: invalid arguments")  # PyTorch's message comes from Meta
    dim = maybe_wrap_dim(dim, self.ndim)
    axes = tuple(a for a in range(self.ndim) if a != dim)
    norm = _vector_norm(self.astype(_acc(self.dtype)), p, axes, keepdim=True)
    factor = jnp.where(norm > maxnorm, maxnorm / (norm + 1e-7), 1)
    return self * factor.astype(self.dtype)


# --- scans --------------------------------------------------------------------------


@lowers(aten.cumsum.default)
def cumsum(self, dim, dtype=None):
    out = _int_to_long(self, dtype)
    x = self.astype(_acc(out))
    if self.ndim == 0:
        return x.astype(out)
    return jnp.cumsum(x, maybe_wrap_dim(dim, self.ndim)).astype(out)


@lowers(aten.cumprod.default)
def cumprod(self, dim, dtype=None):
    out = _int_to_long(self, dtype)
    x = self.astype(_acc(out))
    if self.ndim == 0:
        return x.astype(out)
    return jnp.cumprod(x, maybe_wrap_dim(dim, self.ndim)).astype(out)


@lowers(aten.logcumsumexp.default, aten._logcumsumexp.default)
def logcumsumexp(self, dim):
    if not is_float(self):
        raise unsupported("logcumsumexp_out", self)
    x = self.astype(_acc(self.dtype))
    if self.ndim == 0:
        return self
    if jnp.iscomplexobj(x):
        return lax.associative_scan(complex_logaddexp, x, axis=maybe_wrap_dim(dim, self.ndim))
    return lax.cumlogsumexp(x, maybe_wrap_dim(dim, self.ndim)).astype(self.dtype)


def _cum_extreme(x, dim, largest):
    """Running max (min) with indices; NaN wins and ties take the later index, as in ATen."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = maybe_wrap_dim(dim, x.ndim)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    idx = jnp.broadcast_to(jnp.arange(x.shape[axis], dtype=jnp.int64).reshape(shape), x.shape)

    def combine(a, b):
        (va, ia), (vb, ib) = a, b
        better = (vb >= va) if largest else (vb <= va)
        if is_float(x):
            better = (better & ~jnp.isnan(va)) | jnp.isnan(vb)
        return jnp.where(better, vb, va), jnp.where(better, ib, ia)

    return lax.associative_scan(combine, (x, idx), axis=axis)


@lowers(aten.cummax.default)
def cummax(self, dim):
    return _cum_extreme(self, dim, largest=True)


@lowers(aten.cummin.default)
def cummin(self, dim):
    return _cum_extreme(self, dim, largest=False)


@lowers(aten.trace.default)
def trace(self):
    if is_bool(self):
        raise unsupported("trace", self, cpu=False)
    out = _int_to_long(self, None)
    return jnp.trace(self.astype(_acc(out))).astype(out)


@lowers(aten.equal.default)
def equal(self, other):
    """A Python bool, as on CPU: the kernel reads the result on the host."""
    if self.shape != other.shape:
        return jnp.asarray(False)
    return jnp.all(self == other)
