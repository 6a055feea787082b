"""The one executor (torch_pjrt/runtime/executor.py): each program compiles once.

Every mode's programs run through ``executor.Program``, which counts a compilation each
time jit traces. A new op on new shapes compiles exactly once in eager and debug mode
(whichever of the kernel's two call paths runs it first, and with its scalars at their
schema defaults or not), once per recording in fused mode, once per graph compiled.
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

import torch_pjrt
from tests import expectations as E
from torch_pjrt import metrics

# shapes no other test uses: a program already built elsewhere would hide a compilation
_sizes = itertools.count(41)


def _fresh_shape():
    return (3, next(_sizes))


# (label, function of two tensors): defaulted scalars (add's alpha), scalars given
# positionally or by keyword, Python numbers in tensor positions, static arguments
OPS = [
    ("add", lambda a, b: a + b),
    ("add alpha=1 by keyword", lambda a, b: torch.add(a, b, alpha=1)),
    ("add alpha=2", lambda a, b: torch.add(a, b, alpha=2)),
    ("sub alpha=0.5", lambda a, b: torch.sub(a, b, alpha=0.5)),
    ("mul by a number", lambda a, b: a * 2.5),
    ("addcmul value default", lambda a, b: torch.addcmul(a, a, b)),
    ("addcmul value=0.5", lambda a, b: torch.addcmul(a, a, b, value=0.5)),
    ("clamp min", lambda a, b: a.clamp(min=0.0)),
    ("sum dim", lambda a, b: a.sum(dim=1)),
    ("sum keepdim", lambda a, b: torch.sum(a, 1, keepdim=True)),
    ("where", lambda a, b: torch.where(a > 0, a, b)),
]


def _compilations(scope: str) -> int:
    return metrics.as_dict().get(f"{scope}_compilations", 0)


@pytest.mark.parametrize("mode", ["eager", "debug"])
@pytest.mark.parametrize("label, fn", OPS, ids=[o[0] for o in OPS])
def test_a_new_op_compiles_once_per_op(mode, label, fn):
    shape = _fresh_shape()
    a, b = torch.randn(shape), torch.randn(shape)
    pa, pb = a.to("pjrt"), b.to("pjrt")
    expected = fn(a, b)
    with torch_pjrt.mode(mode):
        metrics.reset()
        first = fn(pa, pb)
        torch.testing.assert_close(first.cpu(), expected)
        compiled = metrics.as_dict().get("eager_compile_causes", {})
        n_ops = len(metrics.as_dict()["ops"])
        assert _compilations("eager") == n_ops, compiled  # one per op, none twice
        metrics.reset()
        for _ in range(3):
            torch.testing.assert_close(fn(pa, pb).cpu(), expected)
        assert _compilations("eager") == 0, metrics.as_dict().get("eager_compile_causes")


def test_the_two_eager_paths_share_programs():
    """A keyword call takes the general path and a positional one the fast path: the
    program either builds serves the other."""
    shape = _fresh_shape()
    pa, pb = torch.randn(shape, device="pjrt"), torch.randn(shape, device="pjrt")
    with torch_pjrt.mode("eager"):
        metrics.reset()
        torch.add(pa, pb, alpha=1)  # general path (keyword): builds the program
        torch.add(pa, pb)  # fast path, alpha at its default: the same program
        torch.ops.aten.add.Tensor(pa, pb, alpha=1)
        assert _compilations("eager") == 1, metrics.as_dict()["eager_compile_causes"]


@pytest.mark.parametrize("label, fn", OPS, ids=[o[0] for o in OPS])
def test_a_recording_compiles_once(label, fn):
    shape = _fresh_shape()
    a, b = torch.randn(shape), torch.randn(shape)
    pa, pb = a.to("pjrt"), b.to("pjrt")
    expected = fn(a, b)
    with torch_pjrt.mode("fused"):
        torch.pjrt.synchronize()
        metrics.reset()
        for step in range(3):
            out = fn(pa, pb)
            torch.testing.assert_close(out.cpu(), expected)  # the host read flushes
            d = metrics.as_dict()
            assert d.get("eager_compilations", 0) == 0, d.get("eager_compile_causes")
            assert _compilations("fused") == 1, d.get("fused_compile_causes")
            assert d["fused_flushes"] == step + 1


@pytest.mark.parametrize("label, fn", OPS, ids=[o[0] for o in OPS])
def test_a_compiled_graph_compiles_once(label, fn):
    shape = _fresh_shape()
    a, b = torch.randn(shape), torch.randn(shape)
    pa, pb = a.to("pjrt"), b.to("pjrt")
    compiled = torch.compile(fn, backend="pjrt", fullgraph=True)
    torch.pjrt.synchronize()
    metrics.reset()
    for _ in range(3):
        torch.testing.assert_close(compiled(pa, pb).cpu(), fn(a, b))
    d = metrics.as_dict()
    assert _compilations("graph") == 1, d.get("graph_compile_causes")
    assert _compilations("eager") == 0, d.get("eager_compile_causes")
    assert _compilations("fused") == 0, d.get("fused_compile_causes")


# the small programs of raw kernels: a strided view's read and write, a cast, a filled tensor
HELPERS = [
    ("view read", lambda a: a.t().contiguous()),
    ("view write", lambda a: a.clone()[:, 1:3].mul_(2)),
    ("cast", lambda a: a.to(torch.float16)),
    ("full", lambda a: torch.zeros(a.shape, device=a.device)),
]


@pytest.mark.parametrize("label, fn", HELPERS, ids=[h[0] for h in HELPERS])
def test_a_raw_kernels_program_is_counted_once(label, fn):
    a = torch.randn(_fresh_shape())
    pa = a.to("pjrt")
    expected = fn(a)
    with torch_pjrt.mode("eager"):  # (a fused recording inlines them into its program)
        metrics.reset()
        torch.testing.assert_close(fn(pa).cpu(), expected)
        causes = metrics.as_dict().get("helper_compile_causes", {})
        assert sum(n for cause, n in causes.items() if cause.startswith(label)) == 1, causes
        before = metrics.as_dict()["compilations"]
        torch.testing.assert_close(fn(pa).cpu(), expected)
        assert metrics.as_dict()["compilations"] == before  # the same shapes: nothing new


def test_a_dumped_graph_compiles_once(tmp_path):
    """Writing a graph's StableHLO lowers it first; the call that follows compiles it
    (counted once) without tracing again."""
    shape = _fresh_shape()
    a = torch.randn(shape)
    fn = torch.compile(lambda x: (x * 2).sin(), backend="pjrt", fullgraph=True)
    torch_pjrt.compile.dump_graphs(tmp_path)
    try:
        metrics.reset()
        for _ in range(2):
            torch.testing.assert_close(fn(a.to("pjrt")).cpu(), (a * 2).sin())
    finally:
        torch_pjrt.compile.dump_graphs(None)
    assert _compilations("graph") == 1, metrics.as_dict().get("graph_compile_causes")
    assert list(tmp_path.glob("*.stablehlo.mlir"))


# --- one error contract ---------------------------------------------------------------


def _hermitian():
    a = torch.randn(4, 4, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))
    return a @ a.mH + 4 * torch.eye(4)


@pytest.mark.parametrize("mode", ["eager", "fused", "debug"])
def test_a_declined_lowering_falls_back(mode):
    """ldl_factor's lowering declines a complex Hermitian input: the op takes the
    fallback road (the CPU, counted), as an op with no lowering does."""
    a = _hermitian()
    expected = torch.linalg.ldl_factor(a, hermitian=True)
    with torch_pjrt.mode(mode):
        metrics.reset()
        with pytest.warns(UserWarning, match="not lowered for hermitian=True on complex"):
            torch_pjrt.ops.fallback._warned.discard("aten.linalg_ldl_factor_ex.default")
            out = torch.linalg.ldl_factor(a.to("pjrt"), hermitian=True)
        for x, y in zip(out, expected):
            torch.testing.assert_close(x.cpu(), y)
        assert metrics.as_dict()["fallbacks"] == {"aten.linalg_ldl_factor_ex.default": 1}


def test_a_declined_lowering_in_a_graph_runs_the_graph_eagerly():
    a = _hermitian()
    fn = torch.compile(lambda x: torch.linalg.ldl_factor(x, hermitian=True)[0], backend="pjrt")
    metrics.reset()
    expected = torch.linalg.ldl_factor(a, hermitian=True)[0]
    torch.testing.assert_close(fn(a.to("pjrt")).cpu(), expected)
    d = metrics.as_dict()
    assert d["fallbacks"] == {"aten.linalg_ldl_factor_ex.default": 1}
    assert any("hermitian=True on complex input" in k for k in d["graph_declined"])


def test_a_declined_lowering_is_an_error_where_fallback_is():
    with torch_pjrt.config(fallback="error"):
        with pytest.raises(torch_pjrt.LoweringMissing) as info:
            torch.linalg.ldl_factor(_hermitian().to("pjrt"), hermitian=True)
    message = str(info.value)
    assert "aten.linalg_ldl_factor_ex.default" in message
    assert "does not support these arguments (hermitian=True on complex input)" in message
    assert "schema: aten::linalg_ldl_factor_ex(Tensor self" in message
    assert isinstance(info.value, NotImplementedError)
    with torch_pjrt.strict():
        with pytest.raises(torch_pjrt.StrictModeError, match="linalg_ldl_factor_ex"):
            torch.linalg.ldl_factor(_hermitian().to("pjrt"), hermitian=True)


@pytest.mark.parametrize("mode", ["eager", "fused"])
def test_a_failing_lowering_names_op_schema_and_line(mode):
    from torch_pjrt.ops import registry

    def lowering(self, other, alpha=1):
        raise TypeError("a lowering bug")

    kernel = registry.Kernel(torch.ops.aten.add.Tensor, registry.Lowering(lowering))
    x = torch.ones(2, device="pjrt")
    with torch_pjrt.mode(mode), pytest.raises(RuntimeError) as info:
        kernel(x, x)
    message = str(info.value)
    assert "the lowering of aten.add.Tensor failed at" in message
    assert f"{__file__}:" in message  # the user's line: this test
    assert "schema: aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1)" in message
    assert "a lowering bug" in message


# --- donation by ownership of storage cells ---------------------------------------------


def test_a_fused_step_donates_what_its_cells_let_go():
    """A parameter updated in place: its old array is owned by its cell alone until the
    update, so each step's program reuses the buffer (a host copy of the tensor, made
    before, takes nothing away)."""
    p, q = torch.randn(64).to("pjrt"), torch.randn(64).to("pjrt")
    p_cpu, q_cpu = p.cpu(), q.cpu()
    with torch_pjrt.mode("fused"):
        torch.pjrt.synchronize()
        metrics.reset()
        for _ in range(3):
            p.mul_(0.5).add_(q)
            p_cpu.mul_(0.5).add_(q_cpu)
            torch.pjrt.synchronize()
        assert metrics.as_dict()["fused_donated_buffers"] == 3
    assert torch.equal(p.cpu(), p_cpu) and torch.equal(q.cpu(), q_cpu)


def _empty_copy(a):
    b = torch.empty(a.shape, device="pjrt")
    return b.copy_(a)


# how a second tensor of the same value is made -> buffers an in-place update of the
# first may then donate: a same-device copy makes a new array (as CUDA copies memory),
# so the source keeps owning its own; copy.deepcopy clones the storage by sharing the
# immutable array, so neither storage owns it
COPIES = [
    ("copy_", _empty_copy, 1),
    ("to(copy=True)", lambda a: a.to("pjrt", copy=True), 1),
    ("deepcopy", copy.deepcopy, 0),
]


@pytest.mark.parametrize("label, make_copy, donated", COPIES, ids=[c[0] for c in COPIES])
def test_a_copy_keeps_its_value_whatever_is_donated(label, make_copy, donated):
    a_cpu = torch.randn(64)
    with torch_pjrt.mode("fused"):
        a = a_cpu.to("pjrt") * 1.0
        torch.pjrt.synchronize()
        b = make_copy(a)
        torch.pjrt.synchronize()
        metrics.reset()
        a.add_(1)
        torch.pjrt.synchronize()
        assert metrics.as_dict().get("fused_donated_buffers", 0) == donated
        torch.testing.assert_close(b.cpu(), a_cpu)
        torch.testing.assert_close(a.cpu(), a_cpu + 1)


def test_an_array_read_out_is_never_donated():
    """Code that keeps a storage's array (tensor.read) takes the ownership away: an
    in-place update then leaves the kept array alive."""
    from torch_pjrt.device.tensor import read

    with torch_pjrt.mode("fused"):
        a = torch.randn(64).to("pjrt") * 1.0
        torch.pjrt.synchronize()
        kept = read(a)
        before = kept.copy()
        metrics.reset()
        a.add_(1)
        torch.pjrt.synchronize()
        assert metrics.as_dict().get("fused_donated_buffers", 0) == 0
        assert not kept.is_deleted() and bool((kept == before).all())


def test_a_compiled_step_donates_owned_parameters():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    reference = torch.nn.Linear(8, 8)
    reference.load_state_dict(model.state_dict())
    model.to("pjrt")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)

    def step(m, o, x):
        loss = m(x).square().sum()
        loss.backward()
        o.step()
        o.zero_grad()
        return loss

    compiled = torch.compile(step, backend="pjrt")
    x = torch.randn(4, 8)
    metrics.reset()
    for _ in range(3):
        loss = compiled(model, opt, x.to("pjrt"))
        torch.testing.assert_close(loss.cpu(), step(reference, ref_opt, x))
    assert metrics.as_dict().get("graph_donated_buffers", 0) >= 2 * 2  # weight, bias
    torch.testing.assert_close(model.weight.cpu(), reference.weight)


# --- placement -----------------------------------------------------------------------

# ops whose programs read no input array (fill_ reads only self's shape): jit would
# drop the unused inputs and run them on JAX's default device, pjrt:0
MAKERS = [
    ("full", lambda: torch.full((2, 3), 3.0, device="pjrt:1")),
    ("zeros + 1", lambda: torch.zeros(2, device="pjrt:1") + 1),
    ("fill_", lambda: torch.empty(3, device="pjrt:1").fill_(2.0)),
    ("arange", lambda: torch.arange(5, device="pjrt:1")),
    ("eye", lambda: torch.eye(3, device="pjrt:1")),
    ("rand", lambda: torch.rand(3, device="pjrt:1")),
    ("ones_like, compiled", lambda: _ones_like(torch.zeros(4, device="pjrt:1"))),
]


def _ones_like(x):
    return torch.compile(lambda a: torch.ones_like(a) * 2, backend="pjrt")(x)


@pytest.mark.devices(2)
@pytest.mark.parametrize("mode", ["eager", "fused", "debug"])
@pytest.mark.parametrize("label, make", MAKERS, ids=[m[0] for m in MAKERS])
def test_results_live_on_their_tensors_device(mode, label, make):
    from torch_pjrt import runtime
    from torch_pjrt.device.tensor import cell_of

    with torch_pjrt.mode(mode):
        t = make()
        assert t.device == torch.device("pjrt:1")
        assert cell_of(t).array.devices() == {runtime.device(1)}


def test_programs_are_let_go_before_the_mappings_limit(monkeypatch):
    """XLA:CPU maps each compiled kernel in memory mappings of its own; a process that
    keeps every program it ever compiled reaches Linux's vm.max_map_count and crashes in
    XLA's next compilation. Past 80% of the limit the executor lets go of the older half
    of every program cache: the mappings go with them, and a program that is needed
    again is compiled again."""
    import gc

    from torch_pjrt.runtime import executor

    if executor.mappings() is None:
        pytest.skip(E.SKIP_NO_PROC_MAPS)
    with torch_pjrt.mode("eager"):
        xs = [torch.ones(2, 200 + i, device="pjrt") for i in range(40)]
        [(x * 3).tanh().cpu() for x in xs]  # 40 new programs of each op
        mul = torch.ops.aten.mul.Tensor
        programs = [p for p in executor._programs if p.name == str(mul)]
        before = sum(len(p.cache) for p in programs)
        held = executor.mappings()
        metrics.reset()
        monkeypatch.setattr(executor, "_until_check", 1)  # (restored after the test)
        monkeypatch.setattr(executor, "mappings_limit", lambda: held)  # (over 80% of it)
        dropped = executor.keep_mappings_in_bounds()
        gc.collect()
        assert dropped >= 1 and metrics.as_dict()["programs_dropped"] == dropped
        # (an eager op has one program, a jit holding an executable per input shape)
        assert before >= 1 and sum(len(p.cache) for p in programs) == 0
        assert executor.mappings() < held - 80  # (XLA:CPU: several per executable)
        monkeypatch.setattr(executor, "mappings_limit", lambda: 10 * held)
        assert executor.keep_mappings_in_bounds() == 0  # (under the share: nothing goes)
        torch.testing.assert_close((xs[0] * 3).tanh().cpu(), torch.full((2, 200), 3.0).tanh())
        assert metrics.as_dict()["eager_compilations"] >= 1  # (compiled again)
