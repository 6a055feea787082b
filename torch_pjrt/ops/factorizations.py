"""Linalg lowerings of factorizations and solvers: LU, Cholesky, QR (also by Householder
reflectors), eigendecompositions, SVD, LDL^T, determinants, inverses, triangular solves
and least squares."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from torch_pjrt.ops._helpers import check, dtype_name
from torch_pjrt.ops.registry import declined, lowers
from torch_pjrt.runtime.transfer import torch_dtype

aten = torch.ops.aten

HIGHEST = jax.lax.Precision.HIGHEST


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


# --- Householder reflectors (LAPACK's geqrf / orgqr / ormqr conventions) -------------------


def _reflector(a, i):
    """v_i of H_i = I - tau_i v_i v_i^H: zeros above row i, 1 at row i, a[i+1:, i] below."""
    m = a.shape[-2]
    rows = jnp.arange(m)
    col = a[..., :, i]
    return jnp.where(rows == i, jnp.ones_like(col), jnp.where(rows > i, col, jnp.zeros_like(col)))


def _apply_left(v, tau, X):
    """(I - tau v v^H) X."""
    w = jnp.einsum("...m,...mn->...n", jnp.conj(v), X, precision=HIGHEST)
    return X - tau[..., None, None] * v[..., :, None] * w[..., None, :]


def _apply_right(v, tau, X):
    """X (I - tau v v^H)."""
    w = jnp.einsum("...nm,...m->...n", X, v, precision=HIGHEST)
    return X - tau[..., None, None] * w[..., :, None] * jnp.conj(v)[..., None, :]


@lowers(aten.geqrf.default)
def geqrf(self):
    """Unblocked Householder QR (LAPACK's geqr2 with larfg's reflector choice)."""
    m, n = self.shape[-2:]
    A = self
    complex_ = jnp.issubdtype(A.dtype, jnp.complexfloating)
    taus = []
    rows = jnp.arange(m)
    for i in range(min(m, n)):
        alpha = A[..., i, i]
        below = jnp.where(rows > i, A[..., :, i], jnp.zeros_like(A[..., :, i]))
        xnorm = jnp.sqrt(jnp.sum(jnp.abs(below) ** 2, axis=-1))
        re = jnp.real(alpha)
        norm = jnp.sqrt(re * re + jnp.imag(alpha) ** 2 + xnorm * xnorm)
        beta = -jnp.where(re >= 0, 1, -1).astype(norm.dtype) * norm
        keep = (xnorm == 0) & (jnp.imag(alpha) == 0)
        safe_beta = jnp.where(keep, 1, beta)
        tau = jnp.where(keep, 0, (beta.astype(A.dtype) - alpha) / safe_beta.astype(A.dtype))
        scale = jnp.where(keep, 1, alpha - beta.astype(A.dtype))
        v = jnp.where(rows == i, 1, below / scale[..., None]).astype(A.dtype)
        v = jnp.where(rows < i, 0, v)
        # H^H = I - conj(tau) v v^H applied to the trailing columns
        t = jnp.conj(tau) if complex_ else tau
        if i + 1 < n:
            rest = _apply_left(v, t, A[..., :, i + 1 :])
            A = A.at[..., :, i + 1 :].set(rest)
        col = jnp.where(rows == i, jnp.where(keep, alpha, beta.astype(A.dtype))[..., None], v)
        col = jnp.where(rows < i, A[..., :, i], col)
        A = A.at[..., :, i].set(col)
        taus.append(tau)
    tau = jnp.stack(taus, axis=-1) if taus else jnp.zeros(A.shape[:-2] + (0,), A.dtype)
    return A, tau


@lowers(aten.linalg_householder_product.default)
def linalg_householder_product(input, tau):
    m, n = input.shape[-2:]
    k = tau.shape[-1]
    if n > m:
        raise RuntimeError(
            "torch.linalg.householder_product: input.shape[-2] must be greater than or equal "
            "to input.shape[-1]"
        )
    if k > n:
        raise RuntimeError(
            "torch.linalg.householder_product: input.shape[-1] must be greater than or equal "
            "to tau.shape[-1]"
        )
    batch = jnp.broadcast_shapes(input.shape[:-2], tau.shape[:-1])
    input = jnp.broadcast_to(input, batch + (m, n))
    tau = jnp.broadcast_to(tau, batch + (k,))
    X = jnp.broadcast_to(jnp.eye(m, n, dtype=input.dtype), input.shape)
    for i in reversed(range(k)):
        X = _apply_left(_reflector(input, i), tau[..., i], X)
    return X


def _check_ormqr(self, tau, other, left: bool) -> None:
    """ATen's checks of ``ormqr``'s arguments, in its words and order."""
    check(self.ndim >= 2, "torch.ormqr: input must have at least 2 dimensions.")
    check(other.ndim >= 2, "torch.ormqr: other must have at least 2 dimensions.")
    check(tau.ndim > 0, "Dimension specified as -1 but tensor has no dimensions", IndexError)
    side = -2 if left else -1
    check(
        tau.shape[-1] == min(other.shape[side], self.shape[-1]),
        f"torch.ormqr: tau.shape[-1] must be equal to min(other.shape[{side}], input.shape[-1])",
    )
    check(
        other.shape[side] == self.shape[-2],
        f"torch.ormqr: other.shape[{side}] must be equal to input.shape[-2]",
    )
    for name, x, core in (("tau", tau, 1), ("other", other, 2)):
        batch = list(x.shape[: x.ndim - core])
        check(
            batch == list(self.shape[:-2]),
            lambda: (
                f"torch.ormqr: Expected batch dimensions of {name} to be equal to "
                f"input.shape[:-2], but got {batch}"
            ),
        )
    for name, x in (("tau", tau), ("other", other)):
        check(
            x.dtype == self.dtype,
            lambda: (
                f"torch.ormqr: Expected input and {name} to have the same dtype, but input "
                f"has dtype{dtype_name(torch_dtype(self.dtype))} and {name} has dtype "
                f"{dtype_name(torch_dtype(x.dtype))}"
            ),
        )


@lowers(aten.ormqr.default)
def ormqr(self, input2, input3, left=True, transpose=False):
    _check_ormqr(self, input2, input3, left)
    k = input2.shape[-1]
    order = range(k)
    # Q = H_1 ... H_k; Q^H = H_k^H ... H_1^H
    if left != transpose:
        order = reversed(order)
    X = input3
    batch = jnp.broadcast_shapes(self.shape[:-2], input2.shape[:-1], X.shape[:-2])
    self = jnp.broadcast_to(self, batch + self.shape[-2:])
    input2 = jnp.broadcast_to(input2, batch + input2.shape[-1:])
    X = jnp.broadcast_to(X, batch + X.shape[-2:])
    for i in order:
        v = _reflector(self, i)
        tau = jnp.conj(input2[..., i]) if transpose else input2[..., i]
        X = _apply_left(v, tau, X) if left else _apply_right(v, tau, X)
    return X


# --- least squares ---------------------------------------------------------------------------


def _check_lstsq(self, b) -> None:
    """ATen's checks of ``linalg_lstsq``'s shapes and dtypes, in its words and order."""
    check(self.ndim >= 2, "torch.linalg.lstsq: input must have at least 2 dimensions.")
    check(b.ndim >= 1, "torch.linalg.lstsq: other must have at least 1 dimension.")
    check(
        self.dtype == b.dtype,
        lambda: (
            "torch.linalg.lstsq: Expected input and other to have the same dtype, but got "
            f"input's dtype {dtype_name(torch_dtype(self.dtype))} and other's dtype "
            f"{dtype_name(torch_dtype(b.dtype))}"
        ),
    )
    vector = self.ndim - b.ndim == 1
    check(
        0 <= self.ndim - b.ndim <= 1,
        "torch.linalg.lstsq: input.dim() must be greater or equal to other.dim() and "
        "(input.dim() - other.dim()) <= 1",
    )
    check(
        self.shape[-2] == b.shape[-1 if vector else -2],
        f"torch.linalg.lstsq: input.size(-2) should match other.size({-1 if vector else -2})",
    )


@lowers(aten.linalg_lstsq.default)
def linalg_lstsq(self, b, rcond=None, driver=None):
    _check_lstsq(self, b)
    driver = driver or "gelsy"
    if driver not in ("gels", "gelsy", "gelsd", "gelss"):
        raise RuntimeError(
            "torch.linalg.lstsq: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)"
        )
    A = self
    vector = b.ndim == A.ndim - 1
    B = b[..., None] if vector else b
    A, B = _broadcast_batch(A, B)
    m, n = A.shape[-2:]
    real = jnp.finfo(A.dtype).dtype
    if rcond is None:
        rcond = float(jnp.finfo(real).eps) * max(m, n)
    u, s, vh = jnp.linalg.svd(A, full_matrices=False)
    smax = s[..., :1] if s.shape[-1] else jnp.zeros(s.shape[:-1] + (1,), real)
    if driver == "gels":
        keep = jnp.ones(s.shape, bool)
    else:
        keep = s > jnp.asarray(rcond, real) * smax
    sinv = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(A.dtype)
    uhb = jnp.einsum("...mk,...mj->...kj", jnp.conj(u), B, precision=HIGHEST)
    x = jnp.einsum("...kn,...kj->...nj", jnp.conj(vh), sinv[..., None] * uhb, precision=HIGHEST)
    residuals = jnp.zeros((0,), real)
    if m > n and driver != "gelsy":
        r = jnp.matmul(A, x, precision=HIGHEST) - B
        residuals = jnp.sum(jnp.abs(r) ** 2, axis=-2).astype(real)
        if vector:
            residuals = residuals[..., 0]
    if driver == "gels":
        rank = jnp.zeros((0,), jnp.int64)
    else:
        rank = jnp.sum(keep, axis=-1).astype(jnp.int64)
    singular = s.astype(real) if driver in ("gelsd", "gelss") else jnp.zeros((0,), real)
    return (x[..., 0] if vector else x), residuals, rank, singular


# --- general eigendecomposition (LAPACK's geev on the CPU platform) -------------------------


def _complex_dtype(dtype):
    return jnp.result_type(dtype, jnp.complex64)


@lowers(aten.linalg_eig.default)
def linalg_eig(self):
    cdtype = _complex_dtype(self.dtype)
    if self.shape[-1] == 0:
        return jnp.zeros(self.shape[:-1], cdtype), jnp.zeros(self.shape, cdtype)
    w, v = jax.lax.linalg.eig(self, compute_left_eigenvectors=False)
    return w.astype(cdtype), v.astype(cdtype)


@lowers(aten._linalg_eigvals.default)
def _linalg_eigvals(self):
    cdtype = _complex_dtype(self.dtype)
    if self.shape[-1] == 0:
        return jnp.zeros(self.shape[:-1], cdtype)
    (w,) = jax.lax.linalg.eig(
        self, compute_left_eigenvectors=False, compute_right_eigenvectors=False
    )
    return w.astype(cdtype)


# --- LDL^T with Bunch-Kaufman pivoting (LAPACK's unblocked sytf2 / sytrs, lower storage) ----

_BK_ALPHA = (1.0 + 17.0**0.5) / 8.0


def _swap(v, i, j):
    """v with entries (rows) i and j exchanged along axis 0."""
    vi, vj = v[i], v[j]
    return v.at[i].set(vj).at[j].set(vi)


def _abs1(x):
    """LAPACK's pivot size: |re| + |im| for complex entries."""
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return jnp.abs(jnp.real(x)) + jnp.abs(jnp.imag(x))
    return jnp.abs(x)


def _ldl_one(A):
    n = A.shape[-1]
    idx = jnp.arange(n)
    real = jnp.finfo(A.dtype).dtype
    lower = idx[:, None] >= idx[None, :]
    A = jnp.where(lower, A, A.T)  # the lower triangle, mirrored: the trailing block is kept full

    def step(state):
        A, piv, info, k = state
        absakk = _abs1(A[k, k])
        below = jnp.where(idx > k, _abs1(A[:, k]), -1)
        imax = jnp.argmax(below)
        colmax = jnp.where(k < n - 1, below[imax], 0).astype(real)
        zero = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
        row = jnp.where((idx >= k) & (idx < imax), _abs1(A[imax, :]), -1)
        col = jnp.where(idx > imax, _abs1(A[:, imax]), -1)
        rowmax = jnp.maximum(jnp.max(row), jnp.max(col)).astype(real)
        one = (
            zero
            | (absakk >= _BK_ALPHA * colmax)
            | (absakk >= _BK_ALPHA * colmax * (colmax / jnp.where(rowmax > 0, rowmax, 1)))
        )
        kp = jnp.where(one, k, imax)
        two = ~one & ~(_abs1(A[imax, imax]) >= _BK_ALPHA * rowmax)
        kstep = jnp.where(two, 2, 1)
        kk = k + kstep - 1
        # symmetric interchange of kk and kp inside the trailing block
        perm = _swap(idx, kk, kp)
        trail = (idx[:, None] >= k) & (idx[None, :] >= k)
        A = jnp.where(trail, A[perm][:, perm], A)

        # 1x1 pivot: A22 -= x (x / d)^T, column k scaled by 1 / d
        d11 = 1 / jnp.where(zero, 1, A[k, k])
        x = jnp.where(idx > k, A[:, k], 0)
        A1 = A + x[:, None] * (-d11 * x)[None, :]
        A1 = A1.at[:, k].set(jnp.where(idx > k, x * d11, A[:, k]))
        # 2x2 pivot
        d21 = A[k + 1 if n > 1 else k, k]
        safe21 = jnp.where(d21 == 0, 1, d21)
        e11 = A[jnp.minimum(k + 1, n - 1), jnp.minimum(k + 1, n - 1)] / safe21
        e22 = A[k, k] / safe21
        t = 1 / (e11 * e22 - 1)
        f21 = t / safe21
        k1 = jnp.minimum(k + 1, n - 1)
        ck, ck1 = A[:, k], A[:, k1]
        rest = idx >= k + 2
        wk = jnp.where(rest, f21 * (e11 * ck - ck1), 0)
        wk1 = jnp.where(rest, f21 * (e22 * ck1 - ck), 0)
        A2 = A - (
            jnp.where(rest, ck, 0)[:, None] * wk[None, :]
            + jnp.where(rest, ck1, 0)[:, None] * wk1[None, :]
        )
        A2 = A2.at[:, k].set(jnp.where(rest, wk, ck)).at[:, k1].set(jnp.where(rest, wk1, ck1))
        new = jnp.where(two, A2, jnp.where(zero, A, A1))
        # keep the trailing block symmetric (its lower triangle is the one LAPACK updates)
        after = (idx[:, None] >= k + kstep) & (idx[None, :] >= k + kstep)
        new = jnp.where(after & ~lower, new.T, new)
        update = (idx[:, None] >= k) & (idx[None, :] >= k) & (lower | after)
        A = jnp.where(update, new, A)
        p = jnp.where(two, -(kp + 1), kp + 1).astype(jnp.int32)
        piv = piv.at[k].set(p)
        piv = jnp.where(two & (idx == k + 1), p, piv)
        info = jnp.where((info == 0) & zero, k + 1, info)
        return A, piv, info, k + kstep

    init = (A, jnp.zeros(n, jnp.int32), jnp.int32(0), jnp.int32(0))
    A, piv, info, _ = jax.lax.while_loop(lambda s: s[3] < n, step, init)
    return jnp.where(lower, A, 0), piv, info


def _batched(fn, *arrays, core=(2,)):
    batch = arrays[0].shape[: arrays[0].ndim - core[0]]
    flat = [a.reshape((-1,) + a.shape[a.ndim - c :]) for a, c in zip(arrays, core)]
    outs = jax.vmap(fn)(*flat)
    return tuple(o.reshape(batch + o.shape[1:]) for o in outs)


@lowers(aten.linalg_ldl_factor_ex.default)
def linalg_ldl_factor_ex(self, hermitian=False, check_errors=False):
    if hermitian and jnp.issubdtype(self.dtype, jnp.complexfloating):
        raise declined("hermitian=True on complex input")
    n = self.shape[-1]
    batch = self.shape[:-2]
    if n == 0 or 0 in batch:
        return self, jnp.zeros(batch + (n,), jnp.int32), jnp.zeros(batch, jnp.int32)
    return _batched(_ldl_one, self)


def _ldl_solve_one(LD, piv, B):
    n = LD.shape[-1]
    idx = jnp.arange(n)

    def forward(state):
        B, k = state
        p = piv[k]
        two = p < 0
        kp = jnp.where(two, -p, p) - 1
        k1 = jnp.minimum(k + 1, n - 1)
        B = jnp.where(two, _swap(B, k1, kp), _swap(B, k, kp))
        lk = jnp.where(idx > k + jnp.where(two, 1, 0), LD[:, k], 0)
        lk1 = jnp.where(two & (idx > k + 1), LD[:, k1], 0)
        bk, bk1 = B[k], B[k1]
        B = B - lk[:, None] * bk[None, :] - lk1[:, None] * bk1[None, :]
        # 1x1: B[k] / d; 2x2: solve with the block [[a, b], [b, c]]
        one_k = B[k] / LD[k, k]
        d21 = jnp.where(LD[k1, k] == 0, 1, LD[k1, k])
        akm1 = LD[k, k] / d21
        ak = LD[k1, k1] / d21
        denom = akm1 * ak - 1
        bkm1 = B[k] / d21
        bk_ = B[k1] / d21
        two_k = (ak * bkm1 - bk_) / denom
        two_k1 = (akm1 * bk_ - bkm1) / denom
        B = jnp.where(two, B.at[k].set(two_k).at[k1].set(two_k1), B.at[k].set(one_k))
        return B, k + jnp.where(two, 2, 1)

    B, _ = jax.lax.while_loop(lambda s: s[1] < n, forward, (B, jnp.int32(0)))

    def backward(state):
        B, k = state
        p = piv[k]
        two = p < 0
        kp = jnp.where(two, -p, p) - 1
        tail = idx > k
        lk = jnp.where(tail, LD[:, k], 0)
        B = B.at[k].add(-jnp.einsum("n,nj->j", lk, jnp.where(tail[:, None], B, 0)))
        km1 = jnp.maximum(k - 1, 0)
        lkm1 = jnp.where(tail & two, LD[:, km1], 0)
        B = B.at[km1].add(-jnp.einsum("n,nj->j", lkm1, jnp.where(tail[:, None], B, 0)))
        B = _swap(B, k, kp)
        return B, k - jnp.where(two, 2, 1)

    B, _ = jax.lax.while_loop(lambda s: s[1] >= 0, backward, (B, jnp.int32(n - 1)))
    return (B,)


@lowers(aten.linalg_ldl_solve.default)
def linalg_ldl_solve(LD, pivots, B, hermitian=False):
    if hermitian and jnp.issubdtype(LD.dtype, jnp.complexfloating):
        raise declined("hermitian=True on complex input")
    batch = jnp.broadcast_shapes(LD.shape[:-2], pivots.shape[:-1], B.shape[:-2])
    LD = jnp.broadcast_to(LD, batch + LD.shape[-2:])
    pivots = jnp.broadcast_to(pivots, batch + pivots.shape[-1:])
    B = jnp.broadcast_to(B, batch + B.shape[-2:])
    if LD.shape[-1] == 0 or B.size == 0:
        return B
    return _batched(_ldl_solve_one, LD, pivots, B, core=(2, 1, 2))[0]
