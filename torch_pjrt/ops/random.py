"""Random lowerings: each gets a fresh ``key`` from the device RNG state.

The in-place samplers (``uniform_``, ``exponential_``, ``random_`` ...) are derived
from their functional ops. ``rand``, ``randn``, ``randint`` and the ``*_like`` ops are
CompositeExplicitAutograd in ATen (``empty`` then an in-place sampler). Draws follow
PyTorch's distributions, not its CPU generator's bit stream.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from torch_pjrt.ops._helpers import check, default_dtype, dtype_name
from torch_pjrt.ops._promote import opmath, result_type, upcast
from torch_pjrt.ops.registry import implements, lowers, pjrt_generator
from torch_pjrt.ops.registry import lowers_in_graphs as in_graphs
from torch_pjrt.runtime import asserts
from torch_pjrt.runtime.transfer import torch_dtype

aten = torch.ops.aten


def _float_dtype(dtype):
    """The dtype to draw in: JAX samples floats of at least 32 bits most accurately."""
    return jnp.float32 if jnp.finfo(dtype).bits < 32 else dtype


def _uniform(key, shape, dtype, low=0.0, high=1.0):
    draw = _float_dtype(dtype)
    value = jax.random.uniform(key, shape, draw, low, high).astype(dtype)
    # a draw just below ``high`` can round to ``high`` in a narrower dtype (bfloat16):
    # the largest value below it keeps the range half-open, as PyTorch documents
    below = jnp.nextafter(jnp.asarray(high, dtype), jnp.asarray(low, dtype))
    return jnp.minimum(value, below)


def _check_generator(generator) -> None:
    """A generator belongs to one device: a pjrt op takes a pjrt ``torch.Generator``
    (its kernel draws from it: ops/registry.py), and refuses another."""
    if generator is not None:
        pjrt_generator(generator, "a random op")


def _normal(key, shape, dtype):
    return jax.random.normal(key, shape, _float_dtype(dtype))


@lowers(aten.uniform.default, random=True)
def uniform(self, from_=0.0, to=1.0, generator=None, *, key):
    _check_generator(generator)
    return _uniform(key, self.shape, self.dtype, from_, to)


# The in-place samplers check their arguments here, before dispatch: an error raised
# inside a lowering is reported as a torch_pjrt bug unless PyTorch's Meta kernel
# raises it too, and Meta kernels check neither bounds nor generators.


@implements(aten.uniform_.default)
def uniform_(self, from_=0.0, to=1.0, *, generator=None):
    _check_generator(generator)
    if from_ > to:
        raise RuntimeError(
            f"uniform_ expects to return a [from, to) range, but found from={from_:g} > to={to:g}"
        )
    return self.copy_(aten.uniform.default(self, from_, to, generator=generator))


@lowers(aten.normal_functional.default, random=True)
def normal_functional(self, mean=0.0, std=1.0, generator=None, *, key):
    _check_generator(generator)
    return (mean + std * _normal(key, self.shape, self.dtype)).astype(self.dtype)


@implements(aten.normal_.default)
def normal_(self, mean=0.0, std=1.0, *, generator=None):
    _check_generator(generator)
    if std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std:g}")
    return self.copy_(aten.normal_functional.default(self, mean, std, generator=generator))


@lowers(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor, random=True)
def normal(mean, std=1.0, generator=None, *, key):
    _check_generator(generator)
    arrays = [x for x in (mean, std) if not isinstance(x, float)]
    if not isinstance(std, float):
        asserts.check(std >= 0, RuntimeError, "normal expects all elements of std >= 0.0")
    dtype = result_type(*arrays)[1]
    shape = jnp.broadcast_shapes(*(x.shape for x in arrays))
    return (mean + std * _normal(key, shape, dtype)).astype(dtype)


@lowers(aten.normal.float_float, random=True)
def normal_float_float(
    mean, std, size, generator=None, dtype=None, layout=None, device=None, pin_memory=None, *, key
):
    from torch_pjrt.runtime.transfer import jax_dtype

    _check_generator(generator)
    dtype = jax_dtype(torch.get_default_dtype() if dtype is None else dtype)
    return (mean + std * _normal(key, tuple(size), dtype)).astype(dtype)


@lowers(aten.bernoulli.default, aten.bernoulli.p, aten.bernoulli.Tensor, random=True)
def bernoulli(self, p=None, generator=None, *, key):
    _check_generator(generator)
    p = self if p is None else p
    if not isinstance(p, float):
        asserts.check(
            (p >= 0) & (p <= 1),
            RuntimeError,
            "Expected p_in >= 0 && p_in <= 1 to be true, but got false.  (Could this error "
            "message be improved?  If so, please report an enhancement request to PyTorch.)",
        )
    u = jax.random.uniform(key, self.shape, _float_dtype(jnp.result_type(p, jnp.float32)))
    return (u < p).astype(self.dtype)


@implements(aten.bernoulli_.float)
def bernoulli_(self, p=0.5, *, generator=None):
    _check_generator(generator)
    if not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p:g}")
    return self.copy_(aten.bernoulli.p(self, p, generator=generator))


@lowers(aten.exponential.default, random=True)
def exponential(self, lambd=1.0, generator=None, *, key):
    _check_generator(generator)
    return (jax.random.exponential(key, self.shape, _float_dtype(self.dtype)) / lambd).astype(
        self.dtype
    )


@implements(aten.exponential_.default)
def exponential_(self, lambd=1.0, *, generator=None):
    _check_generator(generator)
    if not lambd > 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd:g}")
    return self.copy_(aten.exponential.default(self, lambd, generator=generator))


@lowers(aten.geometric.default, random=True)
def geometric(self, p, generator=None, *, key):
    _check_generator(generator)
    # 1 - u lies in (0, 1]: log never sees zero
    u = 1.0 - jax.random.uniform(key, self.shape, jnp.float64)
    trials = jnp.ceil(jnp.log(u) / jnp.log1p(-p))
    return jnp.maximum(trials, 1).astype(self.dtype)


@lowers(aten.log_normal.default, random=True)
def log_normal(self, mean=1.0, std=2.0, generator=None, *, key):
    _check_generator(generator)
    return jnp.exp(mean + std * _normal(key, self.shape, self.dtype)).astype(self.dtype)


@lowers(aten.cauchy.default, random=True)
def cauchy(self, median=0.0, sigma=1.0, generator=None, *, key):
    _check_generator(generator)
    draw = jax.random.cauchy(key, self.shape, _float_dtype(self.dtype))
    return (median + sigma * draw).astype(self.dtype)


# --- integers in a range -------------------------------------------------------------


def _top(dtype) -> int:
    """The largest value ``random_`` draws by default for ``dtype``."""
    if dtype == jnp.bool_:
        return 1
    if jnp.issubdtype(dtype, jnp.floating):
        return 2 ** (jnp.finfo(dtype).nmant + 1)  # every integer up to here is exact
    return int(jnp.iinfo(dtype).max)


def _randint(key, shape, low: int, high: int, dtype):
    """Integers in [low, high] (inclusive), as PyTorch draws them: 64 random bits modulo
    the range."""
    span = high - low + 1
    bits = jax.random.bits(key, shape, jnp.uint64)
    if span < 2**64:
        bits = bits % jnp.uint64(span)
    value = bits + jnp.uint64(low % 2**64)  # wraps modulo 2**64, as int64 arithmetic does
    return jax.lax.bitcast_convert_type(value, jnp.int64).astype(dtype)


@lowers(aten.random.default, aten.random.to, getattr(aten.random, "from"), random=True)
def random(self, from_=0, to=None, generator=None, *, key):
    _check_generator(generator)
    high = _top(self.dtype) if to is None else to - 1
    return _randint(key, self.shape, from_, high, self.dtype)


@implements(getattr(aten.random_, "from"))
def random_from_(self, from_, to, *, generator=None):
    _check_generator(generator)
    if to is not None and from_ >= to:
        raise RuntimeError(
            f"random_ expects 'from' to be less than 'to', but got from={from_} >= to={to}"
        )
    return self.copy_(getattr(aten.random, "from")(self, from_, to, generator=generator))


@implements(aten.random_.to)
def random_to_(self, to, *, generator=None):
    return random_from_(self, 0, to, generator=generator)


@implements(aten.random_.default)
def random_(self, *, generator=None):
    return random_from_(self, 0, None, generator=generator)


@lowers(aten.randperm.default, aten.randperm.generator, random=True)
def randperm(
    n, generator=None, dtype=torch.int64, layout=None, device=None, pin_memory=None, *, key
):
    from torch_pjrt.runtime.transfer import jax_dtype

    _check_generator(generator)
    dtype = torch.int64 if dtype is None else dtype
    return jax.random.permutation(key, n).astype(jax_dtype(dtype))


# NOTE: ATen samples categories through float32 indices: FLOAT32_MAX_CONSECUTIVE_INT
_MAX_CATEGORIES = 2**24


def _check_multinomial(self, num_samples: int, replacement: bool) -> None:
    """ATen's argument checks of multinomial, in its words and order (its Meta kernel words
    the first otherwise and makes none of the others)."""
    check(1 <= self.ndim <= 2, "prob_dist must be 1 or 2 dim")
    check(
        jnp.issubdtype(self.dtype, jnp.floating),
        lambda: (
            "multinomial only supports floating-point dtypes for input, got: "
            f"{dtype_name(torch_dtype(self.dtype))}"
        ),
    )
    check(num_samples > 0, "cannot sample n_sample <= 0 samples")
    check(
        replacement or num_samples <= self.shape[-1],
        "cannot sample n_sample > prob_dist.size(-1) samples without replacement",
    )
    check(self.shape[-1] <= _MAX_CATEGORIES, "number of categories cannot exceed 2^24")


def _check_probabilities(probs) -> None:
    """ATen's checks of the probabilities (without replacement, or one sample): every entry
    finite and >= 0, then every row's sum > 0."""
    asserts.check(
        jnp.isfinite(probs) & (probs >= 0),
        RuntimeError,
        "probability tensor contains either `inf`, `nan` or element < 0",
    )
    asserts.check(
        jnp.sum(probs, axis=-1) > 0,
        RuntimeError,
        "invalid multinomial distribution (sum of probabilities <= 0)",
    )


_DRAW_ERRORS = (
    "encountering probability entry < 0",
    "encountering probability entry = infinity or NaN",
    "sum of probabilities <= 0",
)


def _check_rows(probs) -> None:
    """The CPU's checks with replacement, row after row: a row's first entry that is < 0
    (or NaN) or infinite, else its sum <= 0; the first row that fails says which."""
    rows = probs.reshape(-1, probs.shape[-1])
    bad = ~(rows >= 0) | ~jnp.isfinite(rows)
    entry = jnp.take_along_axis(rows, jnp.argmax(bad, axis=1)[:, None], axis=1)[:, 0]
    error = jnp.where(
        bad.any(axis=1), jnp.where(entry >= 0, 2, 1), jnp.where(rows.sum(axis=1) > 0, 0, 3)
    )
    first = error[jnp.argmax(error != 0)]
    for code, what in enumerate(_DRAW_ERRORS, 1):
        asserts.check(first != code, RuntimeError, f"invalid multinomial distribution ({what})")


@lowers(aten.multinomial.default, random=True)
def multinomial(self, num_samples, replacement=False, generator=None, *, key):
    _check_generator(generator)
    _check_multinomial(self, num_samples, replacement)
    probs = self.astype(_float_dtype(self.dtype))
    if replacement and num_samples > 1 and probs.shape[-1] > 0:
        _check_rows(probs)
    else:
        _check_probabilities(probs)
    logits = jnp.log(probs)
    if replacement:
        shape = (num_samples,) + logits.shape[:-1]
        draws = jax.random.categorical(key, logits, axis=-1, shape=shape)
        return jnp.moveaxis(draws, 0, -1).astype(jnp.int64)
    # the Gumbel top-k trick samples without replacement
    scores = logits + jax.random.gumbel(key, logits.shape, logits.dtype)
    return jax.lax.top_k(scores, num_samples)[1].astype(jnp.int64)


@lowers(aten.native_dropout.default, random=True)
def native_dropout(input, p, train, *, key):
    if train is not None and not train:
        return input, jnp.ones(input.shape, bool)
    keep = 1.0 - p
    mask = jax.random.uniform(key, input.shape, jnp.float32) < keep
    scale = 0.0 if keep == 0 else 1.0 / keep
    return input * mask.astype(input.dtype) * jnp.asarray(scale, input.dtype), mask


@lowers(aten.rrelu_with_noise_functional.default, random=True)
def rrelu_with_noise_functional(
    self, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None, *, key
):
    _check_generator(generator)
    if not training:  # leaky_relu with the mean slope, read in float32 for a half self
        slope = jnp.asarray((lower + upper) / 2).astype(opmath(self.dtype))
        return jnp.where(self > 0, self, (upcast(self) * slope).astype(self.dtype)), noise
    slope = jax.random.uniform(key, self.shape, _float_dtype(self.dtype), lower, upper)
    slope = slope.astype(self.dtype)
    negative = self <= 0
    return jnp.where(negative, self * slope, self), jnp.where(negative, slope, 1).astype(
        noise.dtype
    )


@implements(aten.rrelu_with_noise.default)
def rrelu_with_noise(self, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    out, noise_out = aten.rrelu_with_noise_functional.default(
        self, noise, lower, upper, training, generator=generator
    )
    noise.copy_(noise_out)
    return out


@implements(aten.rrelu_with_noise_.default)
def rrelu_with_noise_(self, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    out, noise_out = aten.rrelu_with_noise_functional.default(
        self, noise, lower, upper, training, generator=generator
    )
    noise.copy_(noise_out)
    return self.copy_(out)


# --- random draws in graphs (eagerly: ``empty``, then an in-place sampler) ----------------


@in_graphs(aten.rand.default, random=True)
def rand(size, *, dtype=None, layout=None, device=None, pin_memory=None, key):
    return _uniform(key, tuple(size), default_dtype(dtype))


@in_graphs(aten.rand_like.default, random=True)
def rand_like(
    self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, key
):
    return _uniform(key, self.shape, default_dtype(dtype, self))


@in_graphs(aten.randn.default, random=True)
def randn(size, *, dtype=None, layout=None, device=None, pin_memory=None, key):
    dtype = default_dtype(dtype)
    return _normal(key, tuple(size), dtype).astype(dtype)


@in_graphs(aten.randn_like.default, random=True)
def randn_like(
    self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, key
):
    dtype = default_dtype(dtype, self)
    return _normal(key, self.shape, dtype).astype(dtype)
