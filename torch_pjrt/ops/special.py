"""Lowerings of ``torch.special`` functions: Bessel functions (spherical j0, J0, J1, Y0,
Y1, modified I0, I1, K0, K1), Airy's Ai, orthogonal polynomials, polygamma.

The polynomials follow ATen's special cases and recurrences, element by element. The
Bessel functions of integer order and Ai use our own methods (power series, and integral
representations summed by the trapezoidal rule) in float64: they agree with ATen to its
accuracy, not to its rounding.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import partial

import jax.numpy as jnp
import jax.scipy.special as jsp
import torch
from jax import lax

from torch_pjrt.ops._promote import KIND, promote
from torch_pjrt.ops.registry import lowers
from torch_pjrt.ops.unary import digamma

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


# --- Bessel functions of integer order, Airy's Ai -------------------------------------
#
# Evaluated in float64 and rounded once, whatever the float input: the sums below cancel
# a few digits, and the CPU's float32 kernels keep about float32's precision.
#
# Small arguments take power series (A&S 9.1.10-11, 9.6.10-11, 10.4.2). The others take
# exact integrals whose integrands are smooth and decay doubly exponentially, so the
# trapezoidal rule converges geometrically: Hankel's H(1) along its steepest-descent path
# (J, Y; Ai for x < 0) and K's cosh integral (K; Ai for x > 0). Each element gets a step
# narrow enough for its integrand's width (about 1/sqrt(z)) and for the strip in which it
# is analytic, and a fixed number of nodes that reach past exp(-40). The steps, node count
# and switch points were chosen by comparing with mpmath on dense grids: errors stay
# within a few float64 ulps of the functions' envelope.

_EULER = 0.57721566490153286061
_NODES = 28
_SERIES_TERMS = 16


def _harmonic(k):
    return sum((Fraction(1, j) for j in range(1, k + 1)), Fraction(0))


def _descending(terms):
    """Series coefficients, highest power first, for :func:`_poly`."""
    return tuple(float(c) for c in reversed(list(terms)))


# S_n(t) = sum t^k / (k! (k+n)!),  U_n(t) = sum (H_k + H_{k+n}) t^k / (k! (k+n)!),
# with t = -x^2/4 for J, Y and t = x^2/4 for I, K
_S = {
    n: _descending(
        Fraction(1, math.factorial(k) * math.factorial(k + n)) for k in range(_SERIES_TERMS)
    )
    for n in (0, 1)
}
_U = {
    n: _descending(
        (_harmonic(k) + _harmonic(k + n)) / (math.factorial(k) * math.factorial(k + n))
        for k in range(_SERIES_TERMS)
    )
    for n in (0, 1)
}


def _small_jy(order, x):
    """J and Y of order 0 or 1 for 0 <= x <= 2, by their power series."""
    t = -0.25 * x * x
    lead = 1.0 if order == 0 else 0.5 * x  # (x/2)^order
    j = lead * _poly(_S[order], t)
    y = (2 / math.pi) * (jnp.log(0.5 * x) + _EULER) * j
    y = y - (1 / math.pi) * lead * _poly(_U[order], t)
    return j, (y - (2 / math.pi) / x if order else y)


def _small_k(order, x):
    """K of order 0 or 1 for 0 <= x <= 1, by its power series."""
    t = 0.25 * x * x
    lead = 1.0 if order == 0 else 0.5 * x
    i = lead * _poly(_S[order], t)
    k = 0.5 * lead * _poly(_U[order], t) - (jnp.log(0.5 * x) + _EULER) * i
    return 1.0 / x - k if order else k


def _nodes(z, largest, width):
    """Per element: the trapezoidal step and the positive nodes (last axis)."""
    h = jnp.minimum(largest, width * lax.rsqrt(z))
    return h, h[..., None] * jnp.arange(1, _NODES + 1, dtype=z.dtype)


def _hankel_integral(order, z):
    """(re, im) of A = pi exp(-i(z - (order + 1) pi/2)) H(1)_order(z), for z > 0.

    From K(-iz) = 1/2 int exp(iz cosh w + order w) dw, taken along the steepest-descent
    path w = s + i gd(s), where cosh w = 1 + i sinh(s) tanh(s):
    A = int exp(-z sinh(s) tanh(s)) exp(order w) (1 + i sech s) ds, and A -> (1 + i)
    sqrt(pi/z) for large z. The nodes +-s are summed together, as cosh(order w).
    """
    h, s = _nodes(z, 0.15, 0.3)
    sinh = jnp.sinh(s)
    cosh = jnp.sqrt(1.0 + sinh * sinh)
    rise = sinh * sinh / cosh
    decay = 2.0 * jnp.exp(-z[..., None] * rise)
    sech = 1.0 / cosh
    # cosh(order w) = cosh(order s) cos(order gd) + i sinh(order s) sin(order gd), where
    # cos(gd) = sech and sin(gd) = tanh: 1 for order 0, 1 + i rise for order 1
    if order == 0:
        re, im = 1.0, 0.0
    elif order == 1:
        re, im = 1.0, rise
    else:
        gd = jnp.arctan(sinh)
        re = jnp.cosh(order * s) * jnp.cos(order * gd)
        im = jnp.sinh(order * s) * jnp.sin(order * gd)
    return (
        h * (1.0 + jnp.sum(decay * (re - sech * im), -1)),
        h * (1.0 + jnp.sum(decay * (im + sech * re), -1)),
    )


def _large_jy(order, x):
    """J and Y of order 0 or 1 for x > 0 (accurate from x = 1) from H(1) = J + iY."""
    re, im = _hankel_integral(order, x)
    # multiply A by exp(-i(order + 1) pi/2), then by exp(ix) (exact sin and cos of x)
    re, im = (im, -re) if order == 0 else (-re, -im)
    c, s = jnp.cos(x), jnp.sin(x)
    return (re * c - im * s) / math.pi, (re * s + im * c) / math.pi


def _scaled_k_integral(order, z):
    """exp(z) K_order(z) = int_0^inf exp(-2z sinh^2(t/2)) cosh(order t) dt, for z > 0
    (accurate from z = 1/2)."""
    h, t = _nodes(z, 0.25, 0.45)
    sinh = jnp.sinh(0.5 * t)
    rise = 2.0 * sinh * sinh  # cosh(t) - 1
    if order == 0:
        weight = 1.0
    elif order == 1:
        weight = 1.0 + rise  # cosh(t)
    else:
        weight = jnp.cosh(order * t)
    return h * (0.5 + jnp.sum(jnp.exp(-z[..., None] * rise) * weight, -1))


def _jy(order, x):
    """J and Y of order 0 or 1 for x >= 0."""
    small = x <= 2.0
    j_small, y_small = _small_jy(order, x)
    j_large, y_large = _large_jy(order, x)
    return jnp.where(small, j_small, j_large), jnp.where(small, y_small, y_large)


def _bessel_j(order, x):
    j = _jy(order, jnp.abs(x))[0]
    if order:
        j = jnp.sign(x) * j  # J1 is odd
    return jnp.where(jnp.isinf(x), jnp.nan, j)  # ATen gives NaN at infinity


def _bessel_y(order, x):
    y = _jy(order, x)[1]
    y = jnp.where(x == 0, -jnp.inf, y)
    return jnp.where((x < 0) | jnp.isinf(x), jnp.nan, y)  # NaN at +inf too, as ATen


def _bessel_k(order, x, scaled):
    small = x <= 1.0
    series, integral = _small_k(order, x), _scaled_k_integral(order, x)
    if scaled:
        k = jnp.where(small, jnp.exp(x) * series, integral)
    else:
        k = jnp.where(small, series, jnp.exp(-x) * integral)
    k = jnp.where(x == 0, jnp.inf, k)
    k = jnp.where(x == jnp.inf, 0.0, k)
    return jnp.where(x < 0, jnp.nan, k)


# Ai(x) = Ai(0) f(x) + Ai'(0) g(x) (DLMF 9.4.1), as series in x^3:
# f = sum 1*4*...*(3k-2) x^3k / (3k)!,  g = sum 2*5*...*(3k-1) x^(3k+1) / (3k+1)!
_AI0 = 3 ** (-2 / 3) / math.gamma(2 / 3)
_AI0_SLOPE = -(3 ** (-1 / 3)) / math.gamma(1 / 3)
_AIRY_F = _descending(
    Fraction(math.prod(range(1, 3 * k, 3)), math.factorial(3 * k)) for k in range(_SERIES_TERMS)
)
_AIRY_G = _descending(
    Fraction(math.prod(range(2, 3 * k, 3)), math.factorial(3 * k + 1)) for k in range(_SERIES_TERMS)
)


def _to_24_bits(v):
    return lax.reduce_precision(v, exponent_bits=11, mantissa_bits=23)


def _airy_zeta(r):
    """zeta = 2/3 r^(3/2) as hi + lo with hi exact: Ai's phase (and decay) is zeta, and
    its plain float64 rounding (up to zeta * 1e-16) would dominate Ai's error for large
    |x|. Operands rounded to 24 bits make each product and difference below exact."""
    s = _to_24_bits(jnp.sqrt(r))
    ds = (r - s * s) / (s + jnp.sqrt(r))  # sqrt(r) - s
    r_hi = _to_24_bits(r)
    p = r_hi * s
    third = _to_24_bits(p / 3.0)
    rest = (p - 3.0 * third) + (r - r_hi) * s + r * ds  # r^(3/2) - 3 * third
    return 2.0 * third, (2.0 / 3.0) * rest


def _airy_ai(x, cutoff):
    """Ai: Maclaurin series on [-2, 1]; beyond, with zeta = 2/3 |x|^(3/2),
    Ai(x) = sqrt(x/3) K_1/3(zeta) / pi and Ai(-x) = sqrt(x/3) Re(exp(i pi/6) H(1)_1/3(zeta))."""
    cube = x * x * x
    series = _AI0 * _poly(_AIRY_F, cube) + _AI0_SLOPE * x * _poly(_AIRY_G, cube)
    r = jnp.abs(x)
    hi, lo = _airy_zeta(r)
    zeta = hi + lo
    root = jnp.sqrt(r / 3.0)
    # not exp(-hi) * exp(-lo): XLA rewrites that into exp(-(hi + lo))
    decay = jnp.exp(-hi)
    decay = decay + decay * jnp.expm1(-lo)
    decaying = root / math.pi * decay * _scaled_k_integral(1 / 3, zeta)
    re, im = _hankel_integral(1 / 3, zeta)
    cos = jnp.cos(hi) * jnp.cos(lo) - jnp.sin(hi) * jnp.sin(lo)
    sin = jnp.sin(hi) * jnp.cos(lo) + jnp.cos(hi) * jnp.sin(lo)
    oscillating = root / math.pi * (im * cos + re * sin)
    out = jnp.where(x > 1.0, decaying, jnp.where(x < -2.0, oscillating, series))
    out = jnp.where(x > cutoff, 0.0, out)  # ATen's underflow threshold
    return jnp.where(jnp.isinf(x), jnp.nan, out)


def _in_float64(fn, x):
    """``fn(x)`` evaluated in float64, rounded to ``x``'s dtype."""
    return fn(x.astype(jnp.float64)).astype(x.dtype)


@lowers(aten.special_bessel_j0.default)
@promote(KIND.INT_TO_FLOAT)
def special_bessel_j0(self):
    return _in_float64(partial(_bessel_j, 0), self)


@lowers(aten.special_bessel_j1.default)
@promote(KIND.INT_TO_FLOAT)
def special_bessel_j1(self):
    return _in_float64(partial(_bessel_j, 1), self)


@lowers(aten.special_bessel_y0.default)
@promote(KIND.INT_TO_FLOAT)
def special_bessel_y0(self):
    return _in_float64(partial(_bessel_y, 0), self)


@lowers(aten.special_bessel_y1.default)
@promote(KIND.INT_TO_FLOAT)
def special_bessel_y1(self):
    return _in_float64(partial(_bessel_y, 1), self)


@lowers(aten.special_modified_bessel_k0.default)
@promote(KIND.INT_TO_FLOAT)
def special_modified_bessel_k0(self):
    return _in_float64(partial(_bessel_k, 0, scaled=False), self)


@lowers(aten.special_modified_bessel_k1.default)
@promote(KIND.INT_TO_FLOAT)
def special_modified_bessel_k1(self):
    return _in_float64(partial(_bessel_k, 1, scaled=False), self)


@lowers(aten.special_scaled_modified_bessel_k0.default)
@promote(KIND.INT_TO_FLOAT)
def special_scaled_modified_bessel_k0(x):
    return _in_float64(partial(_bessel_k, 0, scaled=True), x)


@lowers(aten.special_scaled_modified_bessel_k1.default)
@promote(KIND.INT_TO_FLOAT)
def special_scaled_modified_bessel_k1(x):
    return _in_float64(partial(_bessel_k, 1, scaled=True), x)


@lowers(aten.special_airy_ai.default)
@promote(KIND.INT_TO_FLOAT)
def special_airy_ai(x):
    # ATen returns 0 above these (Cephes' MAXAIRY for double, and its float value)
    cutoff = 103.892 if x.dtype == jnp.float64 else 25.77
    return _in_float64(partial(_airy_ai, cutoff=cutoff), x)


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
