"""Lowerings of ``torch.special`` functions: spherical Bessel j0, modified Bessel I0/I1,
orthogonal polynomials, polygamma.

The polynomials follow ATen's special cases and recurrences, element by element. The
Bessel functions of the first and second kind (J, Y, K) and Airy's Ai are not lowered
yet: matching ATen to rounding needs the same approximations, and ours are still to be
written (see tests/op_expectations.py).
"""

from __future__ import annotations

import math
from fractions import Fraction

import jax.numpy as jnp
import jax.scipy.special as jsp
import torch
from jax import lax

from torch_pjrt.ops._promote import KIND, promote
from torch_pjrt.ops.elementwise import digamma
from torch_pjrt.ops.registry import lowers

aten = torch.ops.aten

# sin(x)/x = sum (-1)^k x^2k / (2k+1)!, to x^12
_SINC_TAYLOR = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(6, -1, -1))


# --- evaluation helpers ----------------------------------------------------------------


def _poly(coeffs, z):
    out = jnp.full_like(z, coeffs[0])
    for c in coeffs[1:]:
        out = out * z + c
    return out


def _div(a, b):
    """``a / b`` rounded once, as in ATen: XLA turns a division by a scalar into a
    multiplication by its rounded reciprocal, an error that exp, sin and long
    recurrences amplify."""
    return a / lax.optimization_barrier(jnp.broadcast_to(jnp.asarray(b, a.dtype), a.shape))


# --- Bessel functions -----------------------------------------------------------------


@lowers(aten.special_spherical_bessel_j0.default)
@promote(KIND.INT_TO_FLOAT)
def special_spherical_bessel_j0(x):
    out = jnp.where(jnp.abs(x) < 0.5, _poly(_SINC_TAYLOR, x * x), jnp.sin(x) / x)
    return jnp.where(jnp.isinf(x), 0.0, out)


@lowers(aten.special_modified_bessel_i0.default)
@promote(KIND.INT_TO_FLOAT)
def special_modified_bessel_i0(self):
    return jsp.i0(self)


@lowers(aten.special_modified_bessel_i1.default)
@promote(KIND.INT_TO_FLOAT)
def special_modified_bessel_i1(self):
    return jsp.i1(self)


# --- orthogonal polynomials ------------------------------------------------------------
#
# ATen casts the (float) degree to int64 and evaluates per element: special cases, a
# closed form for some arguments, else the three-term recurrence up to the degree.


def _degree(n):
    """ATen's int64 cast of a float degree: truncation; NaN, infinities and values out of
    int64's range become negative there (x86), which makes the polynomial 0."""
    ok = jnp.isfinite(n) & (jnp.abs(n) < 2.0**63)
    return jnp.where(ok, jnp.trunc(n), -1.0)


def _recurrence(n, p0, p1, step, skip):
    """P_n from P_0, P_1 and P_{k+1} = step(k, P_{k-1}, P_k), each element iterating up to
    its own degree (the loop runs to the largest) and stopping at NaN like ATen's loops;
    elements in ``skip`` do not iterate."""

    def live(k, q):
        return (k.astype(q.dtype) < n) & ~jnp.isnan(q) & ~skip

    def cond(state):
        k, _, q = state
        return jnp.any(live(k, q))

    def body(state):
        k, p, q = state
        go = live(k, q)
        r = step(k.astype(q.dtype), p, q)
        return k + 1, jnp.where(go, q, p), jnp.where(go, r, q)

    _, _, q = lax.while_loop(cond, body, (jnp.int64(1), p0, p1))
    return jnp.where(n == 0, p0, q)


def _prepare(x, n):
    x, n = jnp.broadcast_arrays(x, n)
    n = _degree(n)
    return x, n, jnp.fmod(n, 2.0) == 0


# closed forms used above a degree, for |y| < 1: unshifted, shifted
_CHEBYSHEV_THRESHOLD = {"t": (6, 6), "u": (8, 6), "v": (8, 6), "w": (8, 4)}


def _chebyshev(kind, x, n, shifted):
    x, n, even = _prepare(x, n)
    one = jnp.ones_like(x)
    sign = jnp.where(even, 1.0, -1.0)
    y = x + x - 1.0 if shifted else x
    at_plus, at_minus, p1 = {
        "t": (one, sign, y),
        "u": (n + 1.0, sign * (n + 1.0), y + y),
        "v": (one, sign * (n + n + 1.0), y + y - 1.0),
        "w": (n + n + 1.0, sign, y + y + 1.0),
    }[kind]
    # ATen tests the shifted polynomials' ends on x, not on y
    is_plus = x == 1.0
    is_minus = x == 0.0 if shifted else x == -1.0

    theta = jnp.arccos(y)
    if kind == "t":
        closed = jnp.cos(n * theta)
    elif kind == "u":
        s = jnp.sin(theta)
        closed = jnp.where(
            s != 0, jnp.sin((n + 1.0) * theta) / s, (n + 1.0) * jnp.cos((n + 1.0) * theta) / y
        )
    elif kind == "v":
        closed = jnp.where(
            jnp.sin(theta / 2.0) != 1.0,
            jnp.cos((n + 0.5) * theta) / jnp.cos(theta / 2.0),
            at_minus,
        )
    else:
        closed = jnp.where(
            jnp.cos(theta / 2.0) != 1.0,
            jnp.sin((n + 0.5) * theta) / jnp.sin(theta / 2.0),
            # the shifted W takes the other end's value here in ATen
            at_minus if shifted else at_plus,
        )
    use_closed = (n > _CHEBYSHEV_THRESHOLD[kind][shifted]) & (jnp.abs(y) < 1.0)

    def step(k, p, q):
        return (y + y) * q - p

    skip = (n < 0) | is_plus | is_minus | use_closed
    out = _recurrence(n, one, p1, step, skip)
    out = jnp.where(use_closed, closed, out)
    out = jnp.where(is_minus, at_minus, jnp.where(is_plus, at_plus, out))
    return jnp.where(n < 0, 0.0, out)


def _register_chebyshev(packet, kind, shifted):
    def lowered(x, n):
        return _chebyshev(kind, x, n, shifted)

    lowered.__name__ = packet.__name__
    lowers(packet)(promote(KIND.INT_TO_FLOAT)(lowered))


for _kind in "tuvw":
    _register_chebyshev(getattr(aten, f"special_chebyshev_polynomial_{_kind}"), _kind, False)
    _register_chebyshev(getattr(aten, f"special_shifted_chebyshev_polynomial_{_kind}"), _kind, True)


def _hermite(x, n, physicists):
    x, n, _ = _prepare(x, n)
    # ATen gives NaN past these degrees
    too_high = n > (128 if x.dtype == jnp.float32 else 512)
    if physicists:
        p1 = x + x

        def step(k, p, q):
            return (x + x) * q - (k + k) * p
    else:
        p1 = x

        def step(k, p, q):
            return x * q - k * p

    out = _recurrence(n, jnp.ones_like(x), p1, step, (n < 0) | too_high)
    out = jnp.where(too_high, jnp.nan, out)
    return jnp.where(n < 0, 0.0, out)


@lowers(aten.special_hermite_polynomial_h)
@promote(KIND.INT_TO_FLOAT)
def special_hermite_polynomial_h(x, n):
    return _hermite(x, n, physicists=True)


@lowers(aten.special_hermite_polynomial_he)
@promote(KIND.INT_TO_FLOAT)
def special_hermite_polynomial_he(x, n):
    return _hermite(x, n, physicists=False)


@lowers(aten.special_laguerre_polynomial_l)
@promote(KIND.INT_TO_FLOAT)
def special_laguerre_polynomial_l(x, n):
    x, n, _ = _prepare(x, n)
    at_zero = x == 0

    def step(k, p, q):
        return _div(((k + k) + (1.0 - x)) * q - k * p, k + 1.0)

    out = _recurrence(n, jnp.ones_like(x), 1.0 - x, step, (n < 0) | at_zero)
    out = jnp.where(at_zero, 1.0, out)
    return jnp.where(n < 0, 0.0, out)


@lowers(aten.special_legendre_polynomial_p)
@promote(KIND.INT_TO_FLOAT)
def special_legendre_polynomial_p(x, n):
    x, n, even = _prepare(x, n)
    at_end = jnp.abs(x) == 1.0

    def step(k, p, q):
        return _div((k + k + 1.0) * x * q - k * p, k + 1.0)

    out = _recurrence(n, jnp.ones_like(x), x, step, (n < 0) | at_end)
    out = jnp.where(at_end, jnp.where((x > 0) | even, 1.0, -1.0), out)
    return jnp.where(n < 0, 0.0, out)


# --- polygamma -------------------------------------------------------------------------


def _bernoulli(count):
    b = [Fraction(1)]
    for m in range(1, count + 1):
        b.append(-sum(math.comb(m + 1, k) * b[k] for k in range(m)) / (m + 1))
    return b


# (2j)! / B_2j, j = 1..12: divisors of the Euler-Maclaurin corrections
_EM_DIVISORS = tuple(
    float(math.factorial(2 * j) / b) for j, b in enumerate(_bernoulli(24)[2::2], start=1)
)
_MACHEP = 2.0**-53


def _hurwitz_zeta(s, q):
    """zeta(s, q) for an integer s >= 2, summed as Cephes (and ATen) does: direct terms
    until q + i > 9 with i >= 9, then Euler-Maclaurin; each stage stops an element
    once a term no longer changes its sum."""
    pole = (q <= 0) & (q == jnp.floor(q))
    q = jnp.where(pole, 1.0, q)  # keeps poles out of the loop

    def negligible(term, total):
        # never true for a negative total, as in ATen
        return (-_MACHEP * total < term) & (term < _MACHEP * total)

    def more(i, a, done):
        return ((i < 9) | (a <= 9.0)) & ~done

    def cond(state):
        i, a, _, _, done = state
        return jnp.any(more(i, a, done))

    def body(state):
        i, a, b, total, done = state
        go = more(i, a, done)
        a = jnp.where(go, a + 1.0, a)
        b = jnp.where(go, a**-s, b)
        total = jnp.where(go, total + b, total)
        return i + 1, a, b, total, done | (go & negligible(b, total))

    init = (jnp.int32(0), q, jnp.zeros_like(q), q**-s, jnp.zeros(q.shape, bool))
    _, w, b, total, done = lax.while_loop(cond, body, init)

    corrected = total + b * w / (s - 1.0)
    tail = jnp.where(done, total, corrected - 0.5 * b)
    rising, k = 1.0, 0
    for divisor in _EM_DIVISORS:
        rising *= s + k
        b = b / w
        t = b * (rising / divisor)
        updated = tail + t
        tail = jnp.where(done, tail, updated)
        done = done | (jnp.abs(t / updated) < _MACHEP)
        k += 1
        rising *= s + k
        b = b / w
        k += 1
    return jnp.where(pole, jnp.inf, tail)


def _trigamma(x):
    pi = jnp.asarray(math.pi, x.dtype)
    reflect = x < 0.5
    s = jnp.sin(pi * x)
    # ATen: psi1(x) = pi^2 / sin^2(pi x) - psi1(1 - x), accumulated onto -pi^2/sin^2
    total = jnp.where(reflect, -((pi * pi) / (s * s)), 0.0)
    y = jnp.where(reflect, 1.0 - x, x)
    for _ in range(6):
        total = total + 1.0 / (y * y)
        y = y + 1.0
    iyy = 1.0 / (y * y)
    total = total + (1.0 + 1.0 / (2.0 * y) + iyy * (1 / 6 - iyy * (1 / 30 - iyy * (1 / 42)))) / y
    return jnp.where(reflect, -total, total)


_ACCUMULATE = {
    jnp.dtype(jnp.float16): jnp.float32,
    jnp.dtype(jnp.bfloat16): jnp.float32,
    jnp.dtype(jnp.float32): jnp.float64,
}


@promote(KIND.INT_TO_FLOAT, n=1)
def _polygamma(self, order):
    if order == 0:
        return digamma(self)
    if order == 1:
        return _trigamma(self)
    factorial = float(math.factorial(order)) if order <= 170 else math.inf
    sign = 1.0 if order % 2 else -1.0
    # summed in ATen's CPU accumulation type: the terms cancel heavily for negative x
    acc = _ACCUMULATE.get(jnp.dtype(self.dtype), self.dtype)
    zeta = _hurwitz_zeta(order + 1, self.astype(acc)).astype(self.dtype)
    return (sign * factorial) * zeta


@lowers(aten.polygamma.default)
def polygamma(n, self):
    if n < 0:
        raise RuntimeError("polygamma(n, x) does not support negative n.")
    return _polygamma(self, order=n)
