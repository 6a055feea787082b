"""Random ops on pjrt: their distributions, seeding, and a fresh key for every draw.

Draws follow PyTorch's distributions, not its CPU generator's bit stream, so the
statistical checks compare sample moments with the exact ones. Every test starts from a
fixed seed, so the samples (and the outcome) are the same on every run; the bounds are
6 standard errors wide.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

import torch_pjrt

DEV = "pjrt"
N = 200_000
FLOATS = [torch.float32, torch.float64, torch.bfloat16]


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


def _check_moments(x, mean, var):
    """Sample mean and variance within 6 standard errors of the exact ``mean``, ``var``."""
    x = x.cpu().double().flatten()
    n = x.numel()
    assert abs(x.mean().item() - mean) <= 6 * math.sqrt(var / n)
    # the mean square about the exact mean: its standard error comes from the 4th moment
    square = ((x - mean) ** 2).mean().item()
    fourth = ((x - mean) ** 4).mean().item()
    assert abs(square - var) <= 6 * math.sqrt((fourth - var**2) / n)


def _check_fraction(hits, total, p):
    """``hits`` of ``total`` Bernoulli(p) trials within 6 standard errors."""
    assert abs(hits / total - p) <= 6 * math.sqrt(p * (1 - p) / total)


# --- continuous distributions ---------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
def test_rand_is_uniform_on_zero_one(dtype):
    x = torch.rand(N, device=DEV, dtype=dtype).cpu()
    assert x.dtype == dtype
    assert x.min() >= 0 and x.max() < 1
    _check_moments(x, 0.5, 1 / 12)


@pytest.mark.parametrize("dtype", FLOATS)
def test_uniform_stays_in_its_half_open_range(dtype):
    # in bfloat16 a draw just below 5 rounds to 5 unless the lowering keeps it below
    x = torch.empty(N, device=DEV, dtype=dtype).uniform_(-2, 5).cpu()
    assert x.min() >= -2 and x.max() < 5
    _check_moments(x, 1.5, 49 / 12)


@pytest.mark.parametrize("dtype", FLOATS)
def test_randn_and_normal_have_the_asked_mean_and_std(dtype):
    _check_moments(torch.randn(N, device=DEV, dtype=dtype), 0.0, 1.0)
    _check_moments(torch.empty(N, device=DEV, dtype=dtype).normal_(2.0, 3.0), 2.0, 9.0)
    mean = torch.full((N,), -1.0, device=DEV, dtype=dtype)
    _check_moments(torch.normal(mean, 0.5), -1.0, 0.25)
    std = torch.full((N,), 2.0, device=DEV, dtype=dtype)
    _check_moments(torch.normal(1.0, std), 1.0, 4.0)
    _check_moments(torch.normal(mean, std), -1.0, 4.0)


def test_normal_float_float_uses_the_default_dtype():
    x = torch.normal(2.0, 3.0, (N,), device=DEV)
    assert x.dtype == torch.float32
    _check_moments(x, 2.0, 9.0)


@pytest.mark.parametrize("dtype", FLOATS)
def test_exponential_has_mean_one_over_lambda(dtype):
    x = torch.empty(N, device=DEV, dtype=dtype).exponential_(2.5).cpu()
    assert x.min() >= 0
    _check_moments(x, 1 / 2.5, 1 / 2.5**2)


# --- Bernoulli and dropout ------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
def test_bernoulli_with_a_scalar_p(dtype):
    x = torch.empty(N, device=DEV, dtype=dtype).bernoulli_(0.3).cpu()
    assert set(x.unique().tolist()) == {0.0, 1.0}
    _check_fraction(x.double().sum().item(), N, 0.3)
    y = torch.bernoulli(torch.empty(N, device=DEV, dtype=dtype), 0.8).cpu()
    _check_fraction(y.double().sum().item(), N, 0.8)
    assert torch.empty(100, device=DEV).bernoulli_(0.0).cpu().eq(0).all()
    assert torch.empty(100, device=DEV).bernoulli_(1.0).cpu().eq(1).all()


@pytest.mark.parametrize("dtype", FLOATS)
def test_bernoulli_with_a_tensor_of_probabilities(dtype):
    p = torch.cat([torch.full((N,), 0.2), torch.full((N,), 0.9), torch.zeros(10), torch.ones(10)])
    x = torch.bernoulli(p.to(DEV, dtype)).cpu()
    assert x.dtype == dtype
    _check_fraction(x[:N].double().sum().item(), N, 0.2)
    _check_fraction(x[N : 2 * N].double().sum().item(), N, 0.9)
    assert x[2 * N : 2 * N + 10].eq(0).all() and x[2 * N + 10 :].eq(1).all()
    y = torch.empty(2 * N, device=DEV, dtype=dtype).bernoulli_(p[: 2 * N].to(DEV)).cpu()
    _check_fraction(y[:N].double().sum().item(), N, 0.2)
    _check_fraction(y[N:].double().sum().item(), N, 0.9)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("p", [0.25, 0.6])
def test_dropout_keeps_one_minus_p_and_scales_them(dtype, p):
    x = torch.ones(N, device=DEV, dtype=dtype)
    out = F.dropout(x, p, training=True).cpu()
    kept = out != 0
    _check_fraction(kept.sum().item(), N, 1 - p)
    # the kept scale is PyTorch's own in this dtype
    scale = F.dropout(torch.ones(1000, dtype=dtype), p, training=True).max()
    assert torch.equal(out[kept].unique(), scale.reshape(1))


def test_dropout_edges_and_eval_mode():
    x = torch.randn(1000, device=DEV)
    assert torch.equal(F.dropout(x, 0.5, training=False).cpu(), x.cpu())
    assert torch.equal(torch.nn.Dropout(0.5).eval()(x).cpu(), x.cpu())
    assert torch.equal(F.dropout(x, 0.0, training=True).cpu(), x.cpu())
    assert F.dropout(x, 1.0, training=True).cpu().eq(0).all()
    out, mask = torch.native_dropout(x, 0.5, False)
    assert torch.equal(out.cpu(), x.cpu()) and mask.cpu().all()


# --- integers -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.float32])
def test_randint_covers_its_range_uniformly(dtype):
    x = torch.randint(3, 10, (N,), device=DEV, dtype=dtype).cpu()
    assert x.dtype == dtype
    assert set(x.unique().tolist()) == set(range(3, 10))
    _check_moments(x, 6.0, (7**2 - 1) / 12)
    y = torch.randint(4, (N,), device=DEV, dtype=dtype).cpu()
    assert set(y.unique().tolist()) == {0, 1, 2, 3}
    z = torch.randint(-(2**40), 2**40, (N,), device=DEV).cpu()
    _check_moments(z, -0.5, ((2**41) ** 2 - 1) / 12)


@pytest.mark.parametrize(
    ("dtype", "top"),
    [
        (torch.uint8, 255),
        (torch.int8, 127),
        (torch.int16, 2**15 - 1),
        (torch.int32, 2**31 - 1),
        (torch.int64, 2**63 - 1),
        (torch.bfloat16, 2**8),  # floats: every integer up to 2**mantissa digits
        (torch.float32, 2**24),
        (torch.float64, 2**53),
        (torch.bool, 1),
    ],
)
def test_random_default_range_is_the_dtypes(dtype, top):
    x = torch.empty(N, device=DEV, dtype=dtype).random_().cpu()
    values = x.double()
    assert values.min() >= 0 and values.max() <= top
    assert torch.equal(values, values.round())
    # uniform on 0..top: float64 keeps the sums exact enough for int64's range
    _check_moments(values / top, 0.5, ((top + 1) ** 2 - 1) / 12 / top**2)
    if top < 300:
        assert x.unique().numel() == top + 1


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.float32])
def test_random_from_to(dtype):
    low = 0 if dtype == torch.uint8 else -3
    x = torch.empty(N, device=DEV, dtype=dtype).random_(low, low + 7).cpu()
    assert set(x.unique().tolist()) == set(range(low, low + 7))
    _check_moments(x, low + 3.0, (7**2 - 1) / 12)
    y = torch.empty(N, device=DEV, dtype=dtype).random_(5).cpu()
    assert set(y.unique().tolist()) == set(range(5))
    if dtype == torch.uint8:  # from with no upper bound: up to the dtype's largest value
        z = torch.empty(N, device=DEV, dtype=dtype).random_(250, None).cpu()
        assert set(z.unique().tolist()) == set(range(250, 256))


# --- multinomial and randperm ---------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
def test_multinomial_with_replacement_follows_the_weights(dtype):
    weights = torch.tensor([[1.0, 2.0, 0.0, 5.0], [4.0, 0.0, 3.0, 1.0]], dtype=dtype)
    draws = torch.multinomial(weights.to(DEV), N, replacement=True).cpu()
    assert draws.shape == (2, N) and draws.dtype == torch.int64
    for row, w in zip(draws, weights.double()):
        counts = torch.bincount(row, minlength=4)
        for count, p in zip(counts.tolist(), (w / w.sum()).tolist()):
            _check_fraction(count, N, p)  # zero weight: never drawn
    flat = torch.multinomial(torch.tensor([0.1, 0.2, 0.7], device=DEV), N, True).cpu()
    for count, p in zip(torch.bincount(flat, minlength=3).tolist(), (0.1, 0.2, 0.7)):
        _check_fraction(count, N, p)


def test_multinomial_without_replacement_never_repeats():
    rows = 20_000
    weights = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0, 10.0]).repeat(rows, 1)
    draws = torch.multinomial(weights.to(DEV), 3, replacement=False).cpu()
    assert draws.shape == (rows, 3)
    assert (draws.sort(dim=1).values.diff(dim=1) != 0).all()
    assert (draws != 4).all()  # zero weight: never drawn while others remain
    # the first draw of each row follows the weights
    for count, p in zip(torch.bincount(draws[:, 0], minlength=6).tolist(), weights[0] / 20):
        _check_fraction(count, rows, p.item())
    whole = torch.multinomial(torch.rand(50, 8, device=DEV) + 0.1, 8).cpu()
    assert torch.equal(whole.sort(dim=1).values, torch.arange(8).expand(50, 8))


@pytest.mark.parametrize(
    ("n", "dtype"),
    [
        (0, torch.int64),
        (1, torch.int64),
        (2, torch.int64),
        (17, torch.int32),
        (1000, torch.float32),
        (100_003, torch.int64),
    ],
)
def test_randperm_is_a_permutation(n, dtype):
    perm = torch.randperm(n, device=DEV, dtype=dtype).cpu()
    assert perm.dtype == dtype
    assert torch.equal(perm.sort().values, torch.arange(n, dtype=dtype))
    if n >= 1000:
        # any value may land in the first slots: their values look uniform on 0..n-1
        # (drawn without replacement, so the bounds are looser than they need be)
        _check_moments(perm[: n // 10], (n - 1) / 2, (n**2 - 1) / 12)


# --- seeds, state, and fresh keys -----------------------------------------------------

DRAWS = {
    "rand": lambda: torch.rand(64, device=DEV),
    "randn": lambda: torch.randn(64, device=DEV),
    "randint": lambda: torch.randint(0, 1000, (64,), device=DEV),
    "bernoulli": lambda: torch.bernoulli(torch.full((64,), 0.5, device=DEV)),
    "bernoulli_": lambda: torch.empty(64, device=DEV).bernoulli_(0.5),
    "dropout": lambda: F.dropout(torch.ones(64, device=DEV), 0.5, training=True),
    "multinomial": lambda: torch.multinomial(torch.ones(4, 16, device=DEV), 8),
    "multinomial_replacement": lambda: torch.multinomial(torch.ones(16, device=DEV), 64, True),
    "normal_": lambda: torch.empty(64, device=DEV).normal_(),
    "normal": lambda: torch.normal(torch.zeros(64, device=DEV), 1.0),
    "uniform_": lambda: torch.empty(64, device=DEV).uniform_(-1, 1),
    "exponential_": lambda: torch.empty(64, device=DEV).exponential_(),
    "randperm": lambda: torch.randperm(64, device=DEV),
    "random_": lambda: torch.empty(64, device=DEV, dtype=torch.int64).random_(),
    "random_from_to": lambda: torch.empty(64, device=DEV).random_(0, 1000),
}


def _run(draw, k=2):
    """``k`` draws, read back only after all of them are made (one fused program)."""
    outs = [draw() for _ in range(k)]
    return [o.cpu() for o in outs]


@pytest.mark.parametrize("name", sorted(DRAWS))
def test_same_seed_replays_and_other_seeds_differ(name):
    draw = DRAWS[name]
    torch.manual_seed(1234)
    first = _run(draw)
    torch.manual_seed(1234)
    assert all(map(torch.equal, first, _run(draw)))
    torch.manual_seed(1235)
    assert not torch.equal(first[0], draw().cpu())
    torch.pjrt.manual_seed(99)
    again = _run(draw)
    torch.pjrt.manual_seed(99)
    assert all(map(torch.equal, again, _run(draw)))
    assert not torch.equal(again[0], first[0])


@pytest.mark.parametrize("name", sorted(DRAWS))
def test_rng_state_replays(name):
    draw = DRAWS[name]
    draw()
    state = torch.pjrt.get_rng_state()
    first = _run(draw)
    torch.pjrt.set_rng_state(state)
    assert all(map(torch.equal, first, _run(draw)))


@pytest.mark.parametrize("name", sorted(DRAWS))
def test_every_draw_gets_a_fresh_key_in_every_mode(name):
    """Two draws recorded into one fused program differ, and every mode draws the same
    values from the same seed (each op takes the next key whenever it runs)."""
    runs = {}
    for mode in ("fused", "eager", "debug"):
        torch.manual_seed(5)
        with torch_pjrt.mode(mode):
            runs[mode] = _run(DRAWS[name], k=3)
        a, b, c = runs[mode]
        assert not torch.equal(a, b) and not torch.equal(b, c) and not torch.equal(a, c)
    for mode in ("eager", "debug"):
        assert all(map(torch.equal, runs["fused"], runs[mode])), mode


def test_many_draws_in_one_fused_program_are_distinct():
    with torch_pjrt.mode("fused"):
        outs = [torch.rand(8, device=DEV) for _ in range(20)]
        rows = torch.stack(outs).cpu()
    assert rows.unique(dim=0).shape[0] == 20


def test_draws_in_a_compiled_function_differ_within_and_between_calls():
    torch._dynamo.reset()

    def sample(x):
        a = torch.rand(x.shape, device=x.device)
        b = torch.rand(x.shape, device=x.device)
        return a, b, torch.randn_like(x), F.dropout(x, 0.5, training=True)

    fn = torch.compile(sample, backend="pjrt")
    x = torch.ones(1000, device=DEV)
    try:
        torch.manual_seed(11)
        first, second = [t.cpu() for t in fn(x)], [t.cpu() for t in fn(x)]
        torch.manual_seed(11)
        replay = [t.cpu() for t in fn(x)]
    finally:
        torch._dynamo.reset()
    a, b, n, d = first
    assert not torch.equal(a, b)
    assert all(not torch.equal(u, v) for u, v in zip(first, second))
    assert all(map(torch.equal, first, replay))
    assert a.min() >= 0 and a.max() < 1 and abs(n.mean().item()) < 0.2
    _check_fraction((d != 0).sum().item(), 1000, 0.5)


# --- generators and bad arguments -----------------------------------------------------

GENERATOR_DRAWS = {
    "rand": lambda g: torch.rand(4, device=DEV, generator=g),
    "randn": lambda g: torch.randn(4, device=DEV, generator=g),
    "randint": lambda g: torch.randint(0, 5, (4,), device=DEV, generator=g),
    "normal_": lambda g: torch.empty(4, device=DEV).normal_(generator=g),
    "uniform_": lambda g: torch.empty(4, device=DEV).uniform_(generator=g),
    "exponential_": lambda g: torch.empty(4, device=DEV).exponential_(generator=g),
    "random_": lambda g: torch.empty(4, device=DEV).random_(generator=g),
    "bernoulli_": lambda g: torch.empty(4, device=DEV).bernoulli_(0.5, generator=g),
    "bernoulli": lambda g: torch.bernoulli(torch.full((4,), 0.5, device=DEV), generator=g),
    "normal": lambda g: torch.normal(torch.zeros(4, device=DEV), 1.0, generator=g),
    "multinomial": lambda g: torch.multinomial(torch.ones(4, device=DEV), 2, generator=g),
    "randperm": lambda g: torch.randperm(4, device=DEV, generator=g),
}


@pytest.mark.parametrize("name", sorted(GENERATOR_DRAWS))
def test_a_cpu_generator_is_refused_as_cuda_refuses_it(name):
    # no torch.Generator lives on pjrt: ignoring one would silently break its seeding
    with pytest.raises(RuntimeError, match="Expected a 'pjrt' device type for generator"):
        GENERATOR_DRAWS[name](torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", sorted(GENERATOR_DRAWS))
def test_a_pjrt_generator_is_its_own_stream(name):
    """``torch.Generator(device="pjrt")``: reseeding it replays its draws, and its draws
    advance its offset, not the device's."""
    draw = GENERATOR_DRAWS[name]
    generator = torch.Generator(device=DEV)
    assert generator.device == torch.device(DEV, 0)
    generator.manual_seed(11)
    torch.pjrt.manual_seed(5)
    first = draw(generator).cpu()
    assert generator.get_offset() >= 1 and torch.pjrt.get_offset() == 0
    generator.manual_seed(11)
    assert torch.equal(draw(generator).cpu(), first)
    state = generator.get_state()
    second = draw(generator).cpu()
    generator.set_state(state)
    assert torch.equal(draw(generator).cpu(), second)


def test_a_generator_in_a_capture_is_refused():
    generator = torch.Generator(device=DEV)
    static = torch.zeros(4, device=DEV)
    graph = torch.pjrt.Graph()
    with pytest.raises(RuntimeError, match="cannot be captured in a torch.pjrt graph"):
        with torch.pjrt.graph(graph):
            static.copy_(torch.rand(4, device=DEV, generator=generator))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda x: x.uniform_(2, 1), r"uniform_ expects to return a \[from, to\) range"),
        (lambda x: x.normal_(0, -1), "normal expects std >= 0.0"),
        (lambda x: x.exponential_(0), "exponential_ expects lambda > 0.0"),
        (lambda x: x.bernoulli_(1.5), r"bernoulli_ expects p to be in \[0, 1\]"),
        (lambda x: x.random_(5, 5), "random_ expects 'from' to be less than 'to'"),
        (lambda x: torch.randint(5, 5, (3,), device=DEV), "from=5 >= to=5"),
        (lambda x: torch.multinomial(x, 5), "cannot sample n_sample > prob_dist.size"),
    ],
)
def test_bad_arguments_raise_pytorchs_error(call, message):
    x = torch.ones(4, device=DEV)
    with pytest.raises(RuntimeError, match=message):
        call(x)
    with pytest.raises(RuntimeError, match=message):
        call(x.cpu())


@pytest.mark.parametrize("mode", ["eager", "fused", "compiled"])
def test_pjrt_random_ops_leave_the_cpu_generator_alone(mode):
    """Random ops on pjrt tensors draw from pjrt's generator only: the CPU's stream is the
    same after them (a CPU stand-in run of an integer op's first call would have drawn
    from it)."""
    torch.manual_seed(0)
    want = torch.rand(3)

    def draw(x):
        return x.random_(0, 10) + torch.randint_like(x, 5) + torch.bernoulli(x.float() / 10).long()

    torch.manual_seed(0)
    x = torch.zeros(4, dtype=torch.int64, device="pjrt")
    if mode == "compiled":
        torch._dynamo.reset()
        torch.compile(draw, backend="pjrt")(x).cpu()
    else:
        with torch_pjrt.mode(mode):
            draw(x).cpu()
    assert torch.equal(torch.rand(3), want)
