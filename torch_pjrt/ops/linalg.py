"""Linalg lowerings of matrix products and what is built on them: ``mm`` and its
relatives, the cross product, the matrix exponential, pairwise distances.

Factorizations and solvers are in ``factorizations.py``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_pjrt.ops._helpers import is_bool, unsupported
from torch_pjrt.ops._promote import opmath as _acc_dtype
from torch_pjrt.ops._promote import promote, upcast
from torch_pjrt.ops.registry import lowers

aten = torch.ops.aten

HIGHEST = jax.lax.Precision.HIGHEST

# torch.get_float32_matmul_precision() -> the XLA precision of float32 products: full
# float32 by default; "high" is TF32 on NVIDIA GPUs and three bfloat16 passes on TPU,
# "medium" the platform's fastest (one bfloat16 pass on TPU). Internal products of the
# factorizations (matrix_exp, lstsq, ...) stay at full precision whatever the setting.
_PRECISIONS = {
    "highest": jax.lax.Precision.HIGHEST,
    "high": jax.lax.Precision.HIGH,
    "medium": jax.lax.Precision.DEFAULT,
}


def matmul_precision() -> jax.lax.Precision:
    """The precision of user-level matrix products and convolutions, read when a program
    traces (``torch.set_float32_matmul_precision`` is part of every program's cache key)."""
    return _PRECISIONS[torch.get_float32_matmul_precision()]


def _check_same_dtype(a, b, what="expected m1 and m2 to have the same dtype"):
    if a.dtype != b.dtype:
        raise RuntimeError(f"{what}, but got: {a.dtype} != {b.dtype}")


def matmul_acc(a, b):
    """``a @ b`` (jnp.matmul rules) in the accumulation dtype, at :func:`matmul_precision`."""
    precision = matmul_precision()
    return jnp.matmul(a, b, precision=precision, preferred_element_type=_acc_dtype(a.dtype))


def einsum_acc(spec, a, b):
    precision = matmul_precision()
    return jnp.einsum(spec, a, b, precision=precision, preferred_element_type=_acc_dtype(a.dtype))


def _scaled(x, s):
    """``s * x`` with a Scalar factor that keeps x's dtype (1 is skipped statically)."""
    if isinstance(s, (int, float)) and not isinstance(s, bool) and s == 1:
        return x
    return x * jnp.asarray(s, x.dtype)


def _add_scaled(self, product, beta, alpha, dtype):
    """``beta * self + alpha * product``; self is ignored (nan included) when beta == 0."""
    acc = product.dtype
    out = _scaled(product, alpha)
    if isinstance(beta, (int, float)) and beta == 0:
        return out.astype(dtype)
    s = self.astype(acc)
    if dtype == jnp.bool_:
        return (out | (s & jnp.asarray(beta, jnp.bool_))).astype(dtype)
    term = jnp.where(jnp.asarray(beta) == 0, jnp.zeros_like(s), _scaled(s, beta))
    return (out + term).astype(dtype)


def _no_bool(x, kernel: str) -> None:
    # CPU PyTorch's matrix products have no bool kernels (addr, outer and kron have)
    if is_bool(x):
        raise unsupported(kernel, x, cpu=False)


@lowers(aten.mm.default)
def mm(self, mat2):
    _no_bool(self, "addmm_impl_cpu_")
    _check_same_dtype(self, mat2, "self and mat2 must have the same dtype")
    return matmul_acc(self, mat2).astype(self.dtype)


@lowers(aten.bmm.default)
def bmm(self, mat2):
    _no_bool(self, "bmm")
    _check_same_dtype(self, mat2, "expected scalar type")
    return matmul_acc(self, mat2).astype(self.dtype)


@lowers(aten.mv.default)
def mv(self, vec):
    _no_bool(self, "addmv_impl_cpu")
    return matmul_acc(self, vec).astype(self.dtype)


@lowers(aten.dot.default)
def dot(self, tensor):
    _no_bool(self, "dot")
    _check_same_dtype(self, tensor, "dot : expected both vectors to have same dtype")
    return matmul_acc(self, tensor).astype(self.dtype)


@lowers(aten.vdot.default)
def vdot(self, other):
    _no_bool(self, "dot")
    _check_same_dtype(self, other, "vdot : expected both vectors to have same dtype")
    return matmul_acc(jnp.conj(self), other).astype(self.dtype)


@lowers(aten.addmm.default)
def addmm(self, mat1, mat2, beta=1, alpha=1):
    _no_bool(mat1, "addmm_impl_cpu_")
    _check_same_dtype(mat1, mat2)
    return _add_scaled(self, matmul_acc(mat1, mat2), beta, alpha, mat1.dtype)


@lowers(aten.addmv.default)
def addmv(self, mat, vec, beta=1, alpha=1):
    _no_bool(mat, "addmv_impl_cpu")
    return _add_scaled(self, matmul_acc(mat, vec), beta, alpha, mat.dtype)


@lowers(aten.baddbmm.default)
def baddbmm(self, batch1, batch2, beta=1, alpha=1):
    _no_bool(batch1, "baddbmm")
    return _add_scaled(self, matmul_acc(batch1, batch2), beta, alpha, batch1.dtype)


@lowers(aten.addbmm.default)
def addbmm(self, batch1, batch2, beta=1, alpha=1):
    _no_bool(batch1, "addmm_impl_cpu_")
    return _add_scaled(self, einsum_acc("bij,bjk->ik", batch1, batch2), beta, alpha, batch1.dtype)


@lowers(aten.addr.default)
def addr(self, vec1, vec2, beta=1, alpha=1):
    dtype = jnp.result_type(self, vec1, vec2)
    # CPU's order, each step rounded in dtype: beta * self + (alpha * vec1) * vec2
    if dtype == jnp.bool_:
        outer = (vec1[:, None] & vec2[None, :]) & jnp.asarray(alpha, jnp.bool_)
        return _add_scaled(self, outer, beta, 1, dtype)
    outer = _scaled(vec1.astype(dtype), alpha)[:, None] * vec2.astype(dtype)[None, :]
    return _add_scaled(self, outer, beta, 1, dtype)


@lowers(aten.linalg_cross.default)
@promote(n=2)
def linalg_cross(self, other, dim=-1):
    self, other = jnp.broadcast_arrays(self, other)
    return jnp.cross(self, other, axis=dim)


# --- matrix exponential: PyTorch's optimized Taylor polynomials with scaling and squaring ---

# 1-norm bounds under which the degree 1, 2, 4, 8, 12, 18 polynomials are accurate enough
_EXP_THETAS = {
    "single": (
        1.192092800768788e-07,
        5.978858893805233e-04,
        5.116619363445086e-02,
        5.800524627688768e-01,
        1.461661507209034e00,
        3.010066362817634e00,
    ),
    "double": (
        2.220446049250313e-16,
        2.580956802971767e-08,
        3.397168839976962e-04,
        4.991228871115323e-02,
        2.996158913811580e-01,
        1.090863719290036e00,
    ),
}

# Bader, Blanes and Casas (2019): degree 12 and 18 as products of combinations of powers;
# row i gives the weights of the powers (I, A, A^2, A^3[, A^6]) in the i-th combination
_EXP_B12 = (
    (
        -1.86023205146205530824e-02,
        -5.00702322573317714499e-03,
        -5.73420122960522249400e-01,
        -1.33399693943892061476e-01,
    ),
    (4.6, 9.92875103538486847299e-01, -1.32445561052799642976e-01, 1.72990000000000000000e-03),
    (
        2.11693118299809440730e-01,
        1.58224384715726723583e-01,
        1.65635169436727403003e-01,
        1.07862779315792429308e-02,
    ),
    (0.0, -1.31810610138301836924e-01, -2.02785554058925905629e-02, -6.75951846863086323186e-03),
)
_EXP_B18 = (
    (
        0.0,
        -1.00365581030144618291e-01,
        -8.02924648241156932449e-03,
        -8.92138498045729985177e-04,
        0.0,
    ),
    (
        0.0,
        3.97849749499645077844e-01,
        1.36783778460411720168e00,
        4.98289622525382669416e-01,
        -6.37898194594723280150e-04,
    ),
    (
        -1.09676396052962061844e01,
        1.68015813878906206114e00,
        5.71779846478865511061e-02,
        -6.98210122488052056106e-03,
        3.34975017086070470649e-05,
    ),
    (
        -9.04316832390810593223e-02,
        -6.76404519071381882256e-02,
        6.75961301770459654925e-02,
        2.95552570429315521194e-02,
        -1.39180257516060693404e-05,
    ),
    (
        0.0,
        0.0,
        -9.23364619367118555360e-02,
        -1.69364939002081722752e-02,
        -1.40086798182036094347e-05,
    ),
)


def _no_fma(x):
    """x, behind a select XLA's CPU compiler cannot see through: products rounded before
    they are summed, never contracted into fused multiply-adds (CPU's kernels do not)."""
    return jnp.where(jnp.isnan(x), jnp.asarray(jnp.nan, x.dtype), x)


def _mm(a, b):
    """a @ b summed term by term in k order, as CPU's BLAS does for these small matrices."""
    if a.shape[-1] > 16:
        return jnp.matmul(a, b, precision=HIGHEST)
    terms = _no_fma(a[..., :, :, None] * b[..., None, :, :])
    acc = terms[..., :, 0, :]
    for k in range(1, a.shape[-1]):
        acc = acc + terms[..., :, k, :]
    return acc


def _combine(weights, powers):
    terms = [_no_fma(p * jnp.asarray(w, p.dtype)) for w, p in zip(weights, powers) if w != 0]
    out = terms[0]
    for term in terms[1:]:
        out = out + term
    return out


def _exp_taylor(A, degree):
    eye = jnp.broadcast_to(jnp.eye(A.shape[-1], dtype=A.dtype), A.shape)
    if degree == 1:
        return eye + A
    A2 = _mm(A, A)
    if degree == 2:
        return _combine((1.0, 1.0, 0.5), (eye, A, A2))
    if degree == 4:
        return eye + A + _mm(A2, _combine((0.5, 1 / 6, 1 / 24), (eye, A, A2)))
    if degree == 8:
        r = 177.0**0.5
        x3 = 2.0 / 3.0
        x1 = x3 * (1.0 + r) / 88.0
        x2 = x3 * (1.0 + r) / 352.0
        x4 = (-271.0 + 29.0 * r) / (315.0 * x3)
        x5 = (-11.0 + 11.0 * r) / (1260.0 * x3)
        x6 = (-99.0 + 11.0 * r) / (5040.0 * x3)
        x7 = (89.0 - r) / (5040.0 * x3)
        y2 = (857.0 - 58.0 * r) / 630.0
        A4 = _mm(A2, _combine((x1, x2), (A, A2)))
        A8 = _mm(_combine((x3, 1.0), (A2, A4)), _combine((x4, x5, x6, x7), (eye, A, A2, A4)))
        return _combine((1.0, 1.0, y2, 1.0), (eye, A, A2, A8))
    A3 = _mm(A, A2)
    if degree == 12:
        q = [_combine(row, (eye, A, A2, A3)) for row in _EXP_B12]
        inner = q[2] + _mm(q[3], q[3])
        return q[0] + _mm(q[1] + inner, inner)
    A6 = _mm(A3, A3)
    q = [_combine(row, (eye, A, A2, A3, A6)) for row in _EXP_B18]
    inner = _mm(q[0], q[4]) + q[3]
    return q[1] + _mm(q[2] + inner, inner)


@lowers(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(self):
    n = self.shape[-1]
    if self.size == 0:
        return self
    if n == 1:
        return jnp.exp(self)
    if upcast(self).dtype != self.dtype:
        # half types in float32, rounded once: in their own precision the norm fell
        # between the degree brackets' rounded bounds, and the result was NaN
        return linalg_matrix_exp(upcast(self)).astype(self.dtype)
    A = self
    double = jnp.finfo(A.dtype).bits >= 64
    thetas = _EXP_THETAS["double" if double else "single"]
    norm = jnp.max(jnp.sum(jnp.abs(A), axis=-2), axis=-1)
    real = norm.dtype
    # large norms: T18 of A / 2^s, squared s times
    s = jnp.maximum(0, jnp.ceil(jnp.log2(norm / jnp.asarray(thetas[-1], real))))
    s = jnp.where(jnp.isfinite(s), s, 0).astype(jnp.int32)
    scaled = A / jnp.exp2(s.astype(real)).astype(A.dtype)[..., None, None]
    big = _exp_taylor(scaled, 18)
    steps = jnp.max(s) if s.ndim else s

    def square(i, x):
        return jnp.where((i < s)[..., None, None], _mm(x, x), x)

    big = jax.lax.fori_loop(0, steps, square, big)
    out = jnp.where((norm >= thetas[-2])[..., None, None], big, jnp.full_like(A, jnp.nan))
    lower = None
    for i, degree in enumerate((1, 2, 4, 8, 12)):
        inside = norm <= thetas[i]
        if i:
            inside = inside & (norm >= thetas[i - 1])
        if lower is not None:
            inside = inside & ~lower
        lower = inside if lower is None else lower | inside
        out = jnp.where(inside[..., None, None], _exp_taylor(A, degree), out)
    return out


# --- pairwise distances --------------------------------------------------------------


def _p_norm(diff, p: float):
    """The p-norm over the last axis as cdist defines it (p=0 counts nonzeros)."""
    a = jnp.abs(diff)
    if diff.shape[-1] == 0:
        return jnp.zeros(diff.shape[:-1], diff.dtype)
    if p == 0:
        return jnp.sum((a != 0).astype(a.dtype), axis=-1)
    if p == 1:
        return jnp.sum(a, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=-1))
    if p == float("inf"):
        return jnp.max(a, axis=-1)
    return jnp.sum(a**p, axis=-1) ** (1 / p)


def _p_norm_grad(diff, dist, p: float):
    """d dist / d diff, with CPU's zeros where the norm is not differentiable."""
    a, sign = jnp.abs(diff), jnp.sign(diff)
    zero = jnp.zeros_like(diff)
    if p == 0 or diff.size == 0:
        return zero
    if p == 1:
        return sign
    if p == float("inf"):
        return sign * (a == dist)
    safe_dist = jnp.where(dist == 0, 1, dist)
    if p == 2:
        return jnp.where(dist == 0, zero, diff / safe_dist)
    if p < 2:
        undefined = (dist == 0) | ((diff == 0) & (p < 1))
        return jnp.where(undefined, zero, sign * a ** (p - 1) / safe_dist ** (p - 1))
    return jnp.where(dist == 0, zero, diff * a ** (p - 2) / safe_dist ** (p - 1))


def _broadcast_batches(x1, x2):
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    return (
        jnp.broadcast_to(x1, batch + x1.shape[-2:]),
        jnp.broadcast_to(x2, batch + x2.shape[-2:]),
    )


def _euclidean_by_matmul(x1, x2):
    """CPU's matrix-product form: |a|^2 - 2 a.b + |b|^2, clamped at 0."""
    n1 = jnp.sum(x1 * x1, axis=-1, keepdims=True)
    n2 = jnp.sum(x2 * x2, axis=-1, keepdims=True)
    a = jnp.concatenate([-2 * x1, n1, jnp.ones_like(n1)], axis=-1)
    b = jnp.concatenate([x2, jnp.ones_like(n2), n2], axis=-1)
    squared = jnp.matmul(a, jnp.swapaxes(b, -1, -2), precision=jax.lax.Precision.HIGHEST)
    return jnp.sqrt(jnp.maximum(squared, 0))


@lowers(aten._cdist_forward.default)
def _cdist_forward(x1, x2, p, compute_mode):
    x1, x2 = _broadcast_batches(x1, x2)
    r1, r2 = x1.shape[-2], x2.shape[-2]
    mode = compute_mode or 0
    if x1.size and x2.size and p == 2 and (mode == 1 or (mode == 0 and max(r1, r2) > 25)):
        return _euclidean_by_matmul(x1, x2)
    return _p_norm(x1[..., :, None, :] - x2[..., None, :, :], p)


@lowers(aten._cdist_backward.default)
def _cdist_backward(grad, x1, x2, p, cdist):
    x1, x2 = _broadcast_batches(x1, x2)
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    per_pair = _p_norm_grad(diff, cdist[..., None], p) * grad[..., None]
    return jnp.sum(per_pair, axis=-2)


def _pairs(n: int):
    """Row indices (i, j), i < j, in pdist's row-major order."""
    i, j = np.triu_indices(n, k=1)
    return jnp.asarray(i), jnp.asarray(j)


@lowers(aten._pdist_forward.default)
def _pdist_forward(self, p=2.0):
    i, j = _pairs(self.shape[0])
    return _p_norm(self[i] - self[j], p)


@lowers(aten._pdist_backward.default)
def _pdist_backward(grad, self, p, pdist):
    i, j = _pairs(self.shape[0])
    per_pair = _p_norm_grad(self[i] - self[j], pdist[:, None], p) * grad[:, None]
    return jnp.zeros_like(self).at[i].add(per_pair).at[j].add(-per_pair)
