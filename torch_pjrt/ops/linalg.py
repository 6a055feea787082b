"""Linalg lowerings: matrix products and factorizations."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from torch_pjrt.ops._promote import opmath as _acc_dtype
from torch_pjrt.ops._promote import promote
from torch_pjrt.ops.registry import lowers

aten = torch.ops.aten

HIGHEST = jax.lax.Precision.HIGHEST


def _check_same_dtype(a, b, what="expected m1 and m2 to have the same dtype"):
    if a.dtype != b.dtype:
        raise RuntimeError(f"{what}, but got: {a.dtype} != {b.dtype}")


def matmul_acc(a, b):
    """``a @ b`` (jnp.matmul rules) in the accumulation dtype, at full precision."""
    return jnp.matmul(a, b, precision=HIGHEST, preferred_element_type=_acc_dtype(a.dtype))


def einsum_acc(spec, a, b):
    return jnp.einsum(spec, a, b, precision=HIGHEST, preferred_element_type=_acc_dtype(a.dtype))


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


@lowers(aten.mm.default)
def mm(self, mat2):
    _check_same_dtype(self, mat2, "self and mat2 must have the same dtype")
    return matmul_acc(self, mat2).astype(self.dtype)


@lowers(aten.bmm.default)
def bmm(self, mat2):
    _check_same_dtype(self, mat2, "expected scalar type")
    return matmul_acc(self, mat2).astype(self.dtype)


@lowers(aten.mv.default)
def mv(self, vec):
    return matmul_acc(self, vec).astype(self.dtype)


@lowers(aten.dot.default)
def dot(self, tensor):
    _check_same_dtype(self, tensor, "dot : expected both vectors to have same dtype")
    return matmul_acc(self, tensor).astype(self.dtype)


@lowers(aten.vdot.default)
def vdot(self, other):
    _check_same_dtype(self, other, "vdot : expected both vectors to have same dtype")
    return matmul_acc(jnp.conj(self), other).astype(self.dtype)


@lowers(aten.addmm.default)
def addmm(self, mat1, mat2, beta=1, alpha=1):
    _check_same_dtype(mat1, mat2)
    return _add_scaled(self, matmul_acc(mat1, mat2), beta, alpha, mat1.dtype)


@lowers(aten.addmv.default)
def addmv(self, mat, vec, beta=1, alpha=1):
    return _add_scaled(self, matmul_acc(mat, vec), beta, alpha, mat.dtype)


@lowers(aten.baddbmm.default)
def baddbmm(self, batch1, batch2, beta=1, alpha=1):
    return _add_scaled(self, matmul_acc(batch1, batch2), beta, alpha, batch1.dtype)


@lowers(aten.addbmm.default)
def addbmm(self, batch1, batch2, beta=1, alpha=1):
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


# --- factorizations and solvers (jax.lax.linalg; all supported on the CPU platform) --------


def _int32(x):
    return x.astype(jnp.int32)


def _broadcast_batch(a, b, a_core=2, b_core=2):
    """a and b with their batch dims broadcast together."""
    batch = jnp.broadcast_shapes(a.shape[: a.ndim - a_core], b.shape[: b.ndim - b_core])
    return (
        jnp.broadcast_to(a, batch + a.shape[a.ndim - a_core :]),
        jnp.broadcast_to(b, batch + b.shape[b.ndim - b_core :]),
    )


def _lu(A):
    """(LU, 0-based pivots, permutation, info) of A, info as LAPACK's getrf reports it."""
    lu, pivots, perm = jax.lax.linalg.lu(A)
    return lu, pivots, perm, _first_bad(jnp.diagonal(lu, axis1=-2, axis2=-1) == 0)


def _first_bad(bad):
    """LAPACK's info: 1 + the index of the first failing diagonal entry, else 0."""
    if bad.shape[-1] == 0:
        return jnp.zeros(bad.shape[:-1], jnp.int32)
    return _int32(jnp.where(jnp.any(bad, axis=-1), jnp.argmax(bad, axis=-1) + 1, 0))


def _permute_rows(B, perm):
    return jnp.take_along_axis(B, jnp.broadcast_to(perm[..., :, None], B.shape), axis=-2)


def _lu_solve(lu, perm, B, adjoint=False):
    """Solve A X = B (or A^H X = B) for A = P^T L U, B with a matrix core."""
    tri = jax.lax.linalg.triangular_solve
    if not adjoint:
        y = tri(lu, _permute_rows(B, perm), left_side=True, lower=True, unit_diagonal=True)
        return tri(lu, y, left_side=True, lower=False)
    y = tri(lu, B, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
    y = tri(
        lu, y, left_side=True, lower=True, unit_diagonal=True, transpose_a=True, conjugate_a=True
    )
    return _permute_rows(y, jnp.argsort(perm, axis=-1))


def _solve(lu, perm, B, left, adjoint):
    if left:
        return _lu_solve(lu, perm, B, adjoint)
    # X A = B  <=>  A^H X^H = B^H
    bh = jnp.conj(jnp.swapaxes(B, -1, -2))
    return jnp.conj(jnp.swapaxes(_lu_solve(lu, perm, bh, not adjoint), -1, -2))


@lowers(aten._linalg_solve_ex.default)
def _linalg_solve_ex(A, B, left=True, check_errors=False):
    vector = B.ndim == 1 or (B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])
    b = B[..., None] if vector else B
    if not left and vector:
        b = jnp.swapaxes(b, -1, -2)
    A, b = _broadcast_batch(A, b)
    lu, pivots, perm, info = _lu(A)
    x = _solve(lu, perm, b, left, False)
    if vector:
        x = x[..., 0] if left else x[..., 0, :]
    return x, lu, _int32(pivots + 1), info


@lowers(aten.linalg_lu_solve.default)
def linalg_lu_solve(LU, pivots, B, left=True, adjoint=False):
    LU, B = _broadcast_batch(LU, B)
    piv = jnp.broadcast_to(pivots, LU.shape[:-1]) - 1
    perm = jax.lax.linalg.lu_pivots_to_permutation(piv, LU.shape[-1])
    return _solve(LU, perm, B, left, adjoint)


@lowers(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(A, pivot=True, check_errors=False):
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on the CPU")
    lu, pivots, _, info = _lu(A)
    return lu, _int32(pivots + 1), info


@lowers(aten.linalg_lu.default)
def linalg_lu(A, pivot=True):
    if not pivot:
        raise RuntimeError("linalg.lu: LU without pivoting is not implemented on the CPU")
    m, n = A.shape[-2:]
    k = min(m, n)
    lu, _, perm, _ = _lu(A)
    L = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=A.dtype)
    U = jnp.triu(lu[..., :k, :])
    # (P A)[i] = A[perm[i]] and P A = L U, so A = P^T L U and torch's P is P^T
    P = jnp.swapaxes(jax.nn.one_hot(perm, m, dtype=A.dtype), -1, -2)
    return P, L, U


def _det_parts(A):
    lu, pivots, _, _ = _lu(A)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    swaps = jnp.sum(pivots != jnp.arange(pivots.shape[-1], dtype=pivots.dtype), axis=-1)
    parity = jnp.where(swaps % 2 == 1, -1, 1).astype(A.dtype)
    return lu, pivots, diag, parity


@lowers(aten._linalg_det.default)
def _linalg_det(A):
    lu, pivots, diag, parity = _det_parts(A)
    return parity * jnp.prod(diag, axis=-1), lu, _int32(pivots + 1)


@lowers(aten._linalg_slogdet.default)
def _linalg_slogdet(A):
    lu, pivots, diag, parity = _det_parts(A)
    mag = jnp.abs(diag)
    logabsdet = jnp.sum(jnp.log(mag), axis=-1)
    if jnp.issubdtype(A.dtype, jnp.complexfloating):
        unit = jnp.where(mag == 0, 0, diag / jnp.where(mag == 0, 1, mag).astype(A.dtype))
        sign = parity * jnp.prod(unit, axis=-1)
    else:
        sign = parity * jnp.prod(jnp.sign(diag), axis=-1)
    return sign, logabsdet, lu, _int32(pivots + 1)


@lowers(aten.linalg_inv_ex.default)
def linalg_inv_ex(A, check_errors=False):
    lu, _, perm, info = _lu(A)
    eye = jnp.broadcast_to(jnp.eye(A.shape[-1], dtype=A.dtype), A.shape)
    return _lu_solve(lu, perm, eye), info


def _cholesky(A, upper):
    L = jnp.tril(jax.lax.linalg.cholesky(A, symmetrize_input=False))
    return jnp.conj(jnp.swapaxes(L, -1, -2)) if upper else L


@lowers(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(self, upper=False, check_errors=False):
    L = _cholesky(self, upper)
    # a non positive-definite input leaves NaNs from the failing column on
    return L, _first_bad(jnp.isnan(jnp.real(jnp.diagonal(L, axis1=-2, axis2=-1))))


@lowers(aten.cholesky.default)
def cholesky(self, upper=False):
    return _cholesky(self, upper)


@lowers(aten.linalg_qr.default)
def linalg_qr(A, mode="reduced"):
    if mode == "r":
        return jnp.zeros((0,), A.dtype), jnp.linalg.qr(A, mode="r")
    return jnp.linalg.qr(A, mode=mode)


@lowers(aten._linalg_eigh.default)
def _linalg_eigh(A, UPLO="L", compute_v=True):
    w, v = jnp.linalg.eigh(A, UPLO=UPLO, symmetrize_input=False)
    return w, (v if compute_v else jnp.zeros((0,), A.dtype))


@lowers(aten._linalg_svd.default)
def _linalg_svd(A, full_matrices=False, compute_uv=True, driver=None):
    if not compute_uv:
        empty = jnp.zeros((0,), A.dtype)
        return empty, jnp.linalg.svd(A, compute_uv=False), empty
    return jnp.linalg.svd(A, full_matrices=full_matrices)


@lowers(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(self, B, upper, left=True, unitriangular=False):
    A, B = _broadcast_batch(self, B)
    return jax.lax.linalg.triangular_solve(
        A, B, left_side=left, lower=not upper, unit_diagonal=unitriangular
    )


@lowers(aten.triangular_solve.default)
def triangular_solve(self, A, upper=True, transpose=False, unitriangular=False):
    A, B = _broadcast_batch(A, self)
    x = jax.lax.linalg.triangular_solve(
        A, B, left_side=True, lower=not upper, transpose_a=transpose, unit_diagonal=unitriangular
    )
    return x, A


@lowers(aten._cholesky_solve_helper.default)
def _cholesky_solve_helper(self, A, upper):
    A, B = _broadcast_batch(A, self)
    tri = jax.lax.linalg.triangular_solve
    # A A^H X = B with A lower, or A^H A X = B with A upper
    y = tri(A, B, left_side=True, lower=not upper, transpose_a=upper, conjugate_a=upper)
    return tri(A, y, left_side=True, lower=not upper, transpose_a=not upper, conjugate_a=not upper)


@lowers(aten.cholesky_inverse.default)
def cholesky_inverse(self, upper=False):
    eye = jnp.broadcast_to(jnp.eye(self.shape[-1], dtype=self.dtype), self.shape)
    return _cholesky_solve_helper(eye, self, upper)


@lowers(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(self):
    return jax.scipy.linalg.expm(self)


@lowers(aten.lu_unpack.default)
def lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    m, n = LU_data.shape[-2:]
    k = min(m, n)
    empty = jnp.zeros((0,), LU_data.dtype)
    P = L = U = empty
    if unpack_pivots:
        piv = jnp.broadcast_to(LU_pivots, LU_data.shape[:-2] + (k,)) - 1
        perm = jax.lax.linalg.lu_pivots_to_permutation(piv, m)
        P = jnp.swapaxes(jax.nn.one_hot(perm, m, dtype=LU_data.dtype), -1, -2)
    if unpack_data:
        L = jnp.tril(LU_data[..., :, :k], -1) + jnp.eye(m, k, dtype=LU_data.dtype)
        U = jnp.triu(LU_data[..., :k, :])
    return P, L, U


@lowers(aten.linalg_cross.default)
@promote(n=2)
def linalg_cross(self, other, dim=-1):
    self, other = jnp.broadcast_arrays(self, other)
    return jnp.cross(self, other, axis=dim)
