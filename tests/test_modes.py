"""Execution modes (debug, eager, fused), strict mode, and the metrics that explain them."""

from __future__ import annotations

import copy
import inspect
import math
import warnings

import pytest
import torch

import torch_pjrt
from tests.models import MODELS
from tests.test_compile import COMPILE_SUBSET
from tests.test_ops import check_op, dtype_for, ops_by_key
from torch_pjrt import metrics
from torch_pjrt.config import Config
from torch_pjrt.ops import registry
from torch_pjrt.ops.checks import NumericsWarning
from torch_pjrt.runtime import executor

aten = torch.ops.aten


DEFAULT = Config.from_env().mode  # fused, unless TORCH_PJRT_MODE says otherwise


@pytest.fixture(autouse=True)
def _default_mode_after():
    yield
    torch_pjrt.set_mode(DEFAULT)


# --- switching ------------------------------------------------------------------------


def test_set_mode_and_scoped_mode(monkeypatch):
    monkeypatch.delenv("TORCH_PJRT_MODE", raising=False)
    assert Config.from_env().mode == "fused"  # the default
    torch_pjrt.set_mode("eager")
    with torch_pjrt.mode("fused"):
        assert torch_pjrt.get_mode() == "fused"
        with torch_pjrt.mode("debug"):
            assert torch_pjrt.get_mode() == "debug"
        assert torch_pjrt.get_mode() == "fused"
    assert torch_pjrt.get_mode() == "eager"
    torch_pjrt.set_mode("debug")
    assert torch_pjrt.get_mode() == "debug"


def test_bad_mode_name():
    with pytest.raises(ValueError, match="must be one of debug, eager, fused, but got 'lazy'"):
        torch_pjrt.set_mode("lazy")


def test_mode_from_environment(monkeypatch):
    monkeypatch.setenv("TORCH_PJRT_MODE", "Fused")
    monkeypatch.setenv("TORCH_PJRT_CHECK_NAN", "1")
    monkeypatch.setenv("TORCH_PJRT_STRICT", "1")
    cfg = Config.from_env()
    assert (cfg.mode, cfg.check_nan, cfg.strict, cfg.check_numerics) == ("fused", True, True, False)


def test_switching_modes_mid_program_keeps_values_exact():
    g = torch.Generator().manual_seed(0)
    a_cpu = torch.randn(6, 5, generator=g)
    a = a_cpu.to("pjrt")
    expected = a_cpu.clone()
    steps = [
        ("eager", lambda t: t.mul_(2)),
        ("fused", lambda t: t[:, 1:3].add_(1)),
        ("fused", lambda t: t.t().mul_(3)),
        ("debug", lambda t: t.sub_(t.mean(0))),
        ("fused", lambda t: t.exp_()),
        ("eager", lambda t: t.div_(t.sum())),
    ]
    for name, fn in steps:
        torch_pjrt.set_mode(name)
        fn(a)
        fn(expected)
    torch_pjrt.set_mode("eager")
    torch.testing.assert_close(a.cpu(), expected, rtol=1e-6, atol=1e-7)


# --- fused ------------------------------------------------------------------------------


def test_fused_views_and_inplace_updates_stay_exact():
    g = torch.Generator().manual_seed(1)
    base_cpu = torch.randn(4, 6, generator=g)
    with torch_pjrt.mode("fused"):
        base = base_cpu.to("pjrt")
        outs = []
        for t in (base_cpu, base):
            x = t.clone()
            v = x[1:, ::2]  # a strided view
            v.mul_(10)
            x.t()[0].add_(1)  # a write through a transposed view
            w = x.view(2, 12)
            w[1] = w[0] * 2  # a row written from another row
            y = torch.cat([x, x.sum(1, keepdim=True).expand(4, 2)], dim=1)
            outs.append((x, v, y))
        metrics.reset()
        for a, b in zip(outs[0], outs[1]):
            torch.testing.assert_close(b.cpu(), a, rtol=1e-6, atol=1e-6)
        assert metrics.as_dict()["fused_flushes"] == 1  # one program ran everything


def test_fused_loop_of_identical_steps_compiles_once():
    x = torch.randn(8, 8).to("pjrt")
    with torch_pjrt.mode("fused"):
        metrics.reset()
        results = []
        for _ in range(5):
            y = torch.tanh(x @ x.t() + 1).sum(0)
            results.append(y.max().item())
    d = metrics.as_dict()
    assert d["fused_compilations"] == 1 and d["fused_executions"] == 5
    assert d["fused_ops"] == 5 * 6  # mm, t's view read, add, tanh, sum, max
    assert d["fused_flush_reasons"] == {"host read": 5}
    assert results[0] == pytest.approx(torch.tanh(x.cpu() @ x.cpu().t() + 1).sum(0).max().item())


def test_isin_is_one_recorded_op():
    """isin is lowered as one op (ATen's decomposition records four): generate()'s logits
    processors and stopping criteria call it several times a token."""
    vocab, eos = torch.arange(10).to("pjrt"), torch.tensor([0, 7]).to("pjrt")
    with torch_pjrt.mode("fused"):
        metrics.reset()
        found = torch.isin(vocab, eos)
        assert metrics.as_dict()["fused_ops"] == 1
        assert found.cpu().tolist() == torch.isin(torch.arange(10), torch.tensor([0, 7])).tolist()


def test_factories_are_one_recorded_op():
    """full, zeros, ones, new_ones and arange(end) record one op each (ATen's composites
    record an allocation, the fill and the write into it): generate() makes several a
    token; one program for every fill value. (scalar_tensor records none: below.)"""
    base = torch.ones(2).to("pjrt")
    made = [
        lambda v: torch.full((2, 3), v, device="pjrt"),
        lambda v: torch.zeros(4, device="pjrt"),
        lambda v: torch.zeros((), device="pjrt"),
        lambda v: torch.ones(1, 4, dtype=torch.int64, device="pjrt"),
        lambda v: base.new_ones((3,)),
        lambda v: torch.arange(5, device="pjrt"),
    ]
    with torch_pjrt.mode("fused"):
        for make in made:
            metrics.reset()
            make(1.5)
            assert metrics.as_dict()["fused_ops"] == 1
    with torch_pjrt.mode("eager"):
        torch.full((3,), 2.0, device="pjrt")
        metrics.reset()
        values = [torch.full((3,), v, device="pjrt").cpu() for v in (0.5, -1.0, 7.25)]
        assert metrics.as_dict().get("compilations", 0) == 0
        assert [v.tolist() for v in values] == [[0.5] * 3, [-1.0] * 3, [7.25] * 3]


@pytest.mark.parametrize("mode", ["eager", "fused"])
def test_a_number_made_a_tensor_is_made_once(mode):
    """A number made a tensor (scalar_tensor: how ATen hands ``torch.where(c, x, -inf)``
    its number) records no op and runs no program once its value was made: the tensors
    of one value share its array and stay apart (a write into one leaves the others);
    -0.0 and 0.0, nan, and each dtype are values of their own."""
    x = torch.tensor([1.0, -2.0, 3.0])
    px = x.to("pjrt")
    runs = []

    def counted(program, key, jitted, args):
        runs.append(program.name)
        return jitted(*args)

    with torch_pjrt.mode(mode):
        torch.scalar_tensor(-math.inf, device="pjrt")
        metrics.reset()
        before = executor.record_runs(counted)
        try:
            got = torch.where(px > 0, -math.inf, px)
            made = [torch.scalar_tensor(v, device="pjrt") for v in (-math.inf, -math.inf)]
        finally:
            executor.record_runs(before)
        assert metrics.as_dict().get("fused_ops", 0) == (2 if mode == "fused" else 0)
        assert "full" not in runs  # (gt and where alone: in programs, or recorded)
        assert torch.equal(got.cpu(), torch.where(x > 0, -math.inf, x))
        made[0].add_(1.0)
        assert made[0].item() == -math.inf and made[1].item() == -math.inf
        a, b = (torch.scalar_tensor(5, dtype=torch.int64, device="pjrt") for _ in "ab")
        a.mul_(2)
        assert (a.item(), b.item(), a.dtype) == (10, 5, torch.int64)
        for v in (-0.0, 0.0, math.nan, 2.5):
            for dtype in (torch.float32, torch.float16):
                mine = torch.scalar_tensor(v, dtype=dtype, device="pjrt").cpu()
                theirs = torch.scalar_tensor(v, dtype=dtype)
                assert mine.dtype == theirs.dtype
                assert torch.equal(torch.signbit(mine), torch.signbit(theirs))
                assert torch.equal(mine, theirs) or (mine.isnan() and theirs.isnan())


def test_fused_flushes_at_synchronize_step_end_and_size_cap():
    x = torch.ones(3).to("pjrt")
    with torch_pjrt.mode("fused"):
        metrics.reset()
        y = x + 1
        torch.pjrt.synchronize()
        with torch_pjrt.step():
            y = y * 3
        with torch_pjrt.config(fused_max_ops=4):
            for _ in range(8):
                y = y + 1
        assert y.cpu().tolist() == [14.0, 14.0, 14.0]
    reasons = metrics.as_dict()["fused_flush_reasons"]
    assert reasons["synchronize"] == 1 and reasons["end of step"] == 1
    assert reasons["size cap"] == 2


def test_fused_dropped_intermediates_are_not_outputs():
    x = torch.randn(16).to("pjrt")
    with torch_pjrt.mode("fused"):
        y = ((x * 2).exp() + 1).log()  # the intermediates die before the flush
        assert y.sum().item() == pytest.approx(((x.cpu() * 2).exp() + 1).log().sum().item())
    key = torch_pjrt.modes.fused._graph(0).last_key
    assert len(key[0]) == 5  # mul, exp, add, log, sum
    assert len(key[2]) == 2  # out come y and its sum, not the three intermediates


def test_fused_program_reuses_buffers_nothing_else_holds():
    p = torch.randn(64).to("pjrt")
    q = torch.randn(64).to("pjrt")
    p_cpu, q_cpu = p.cpu(), q.cpu()
    with torch_pjrt.mode("fused"):
        metrics.reset()
        for _ in range(3):  # p's old value is held by nothing once p is updated in place
            p.mul_(0.5).add_(q)
            p_cpu.mul_(0.5).add_(q_cpu)
            torch.pjrt.synchronize()
        assert metrics.as_dict()["fused_donated_buffers"] == 3
        assert torch.equal(p.cpu(), p_cpu) and torch.equal(q.cpu(), q_cpu)
        metrics.reset()
        old = p.clone()  # its buffer (fresh, or p's own shared) must survive p's update
        torch.pjrt.synchronize()
        kept = torch_pjrt.device.tensor.cell_of(old).array
        p.add_(1)
        torch.pjrt.synchronize()
        assert not kept.is_deleted()
        torch.testing.assert_close(old.cpu(), p_cpu, rtol=0, atol=0)
        torch.testing.assert_close(p.cpu(), p_cpu + 1, rtol=0, atol=0)


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01),
}


def _train(model, mode, optimizer, steps=4):
    with torch_pjrt.mode(mode):
        model = model.to("pjrt")
        opt = OPTIMIZERS[optimizer](model.parameters())
        g = torch.Generator().manual_seed(1)
        batch = tuple(t.to("pjrt") for t in model.batch(g))
        losses, compiles = [], []
        for _ in range(steps):
            metrics.reset()
            with torch_pjrt.step():
                opt.zero_grad()
                loss = model.loss(batch)
                loss.backward()
                opt.step()
            losses.append(loss.item())
            compiles.append(metrics.as_dict().get("fused_compilations", 0))
        return losses, model, compiles


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("mode", ["fused", "debug"])
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_model_suite_matches_eager(model_name, mode, optimizer):
    torch.manual_seed(0)
    reference = MODELS[model_name]()
    eager_losses, eager_model, _ = _train(copy.deepcopy(reference), "eager", optimizer)
    losses, model, compiles = _train(copy.deepcopy(reference), mode, optimizer)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(eager_losses), rtol=1e-6, atol=0)
    # NOTE: Adam divides by sqrt(v): a parameter whose true gradient is zero (a bias
    # before batch norm, the key bias of attention) moves by +-lr on rounding noise,
    # which fusion changes; weights are compared under SGD, Adam through the losses.
    if optimizer == "sgd":
        for (name, a), b in zip(eager_model.state_dict().items(), model.state_dict().values()):
            torch.testing.assert_close(b.cpu(), a.cpu(), rtol=1e-6, atol=1e-6, msg=name)
    if mode == "fused":
        assert compiles[2:] == [0, 0], compiles  # nothing new from the third step on


# every op family (the compile subset), plus in-place and out= variants: OpInfo samples
# compared with the CPU, arguments written in place included, in the modes other than
# the default (tests/test_ops.py runs every op in the default mode)
MODE_SUBSET = [*COMPILE_SUBSET, "index_add", "masked_fill", "addcmul", "lerp", "remainder"]


@pytest.mark.parametrize("mode", [m for m in torch_pjrt.modes.MODES if m != DEFAULT])
@pytest.mark.parametrize("key", MODE_SUBSET)
def test_opinfo_subset(key, mode):
    op = ops_by_key()[key]
    with torch_pjrt.mode(mode):
        _, compared = check_op(op, dtype_for(op), limit=3)
    assert compared > 0


def test_inplace_and_out_variants_in_fused_mode():
    g = torch.Generator().manual_seed(2)
    a_cpu, b_cpu = torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)
    with torch_pjrt.mode("fused"):
        a, b = a_cpu.to("pjrt"), b_cpu.to("pjrt")
        out = torch.empty(4, 5, device="pjrt")
        view = out[1:3]
        torch.mul(a, b, out=out)  # written through out=: the view sees it
        a.addcmul_(a, b, value=0.5)
        torch.testing.assert_close(view.cpu(), (a_cpu * b_cpu)[1:3])
        torch.testing.assert_close(a.cpu(), a_cpu.addcmul(a_cpu, b_cpu, value=0.5))


# --- debug ----------------------------------------------------------------------------


def test_check_nan_names_the_op_and_the_line():
    x = torch.tensor([1.0, -1.0]).to("pjrt")
    with torch_pjrt.mode("debug"), torch_pjrt.config(check_nan=True):
        torch.exp(x)  # fine
        masked = (
            torch.zeros(3)
            .to("pjrt")
            .masked_fill(torch.tensor([True, False, True]).to("pjrt"), float("-inf"))
        )
        masked.softmax(0)  # -inf from the fill, not produced here: no error
        with pytest.raises(
            RuntimeError, match=r"aten\.log\.default produced NaN .*test_modes\.py:\d+"
        ):
            torch.log(x)


def test_check_numerics_reports_a_diverging_op():
    # a deliberately wrong kernel for neg: the checker must name it, the line, the error
    wrong = registry.Kernel(aten.neg.default, registry.Lowering(lambda self: -self + 1e-3))
    x = torch.randn(5).to("pjrt")
    metrics.reset()
    with torch_pjrt.config(check_numerics=True), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.neg(x)  # the real kernel agrees with the CPU
        wrong(x)
    found = [w for w in seen if issubclass(w.category, NumericsWarning)]
    assert len(found) == 1
    message = str(found[0].message)
    assert "aten.neg.default" in message and "test_modes.py" in message
    assert "max abs error 0.001" in message
    (where,) = metrics.as_dict()["numerics_divergences"]
    assert where.startswith("aten.neg.default at ") and "test_modes.py:" in where


def test_debug_mode_is_synchronous_and_errors_surface_at_the_line():
    x = torch.ones(2, 3).to("pjrt")
    with torch_pjrt.mode("debug"):
        with pytest.raises(RuntimeError, match="must match the size of tensor b"):
            x + torch.ones(4).to("pjrt")


# --- eager: the host waits only where the user reads ----------------------------------


@pytest.mark.parametrize("mode", ["eager", "fused"])
def test_waits_only_at_reads(mode):
    torch_pjrt.set_mode(mode)
    x = torch.randn(4, 4).to("pjrt")
    metrics.reset()
    y = (x @ x).relu().sum(0) * 2
    assert metrics.as_dict()["host_syncs"] == 0
    reads = [
        lambda: y[0].item(),
        lambda: y.cpu(),
        lambda: y.tolist(),
        lambda: bool(y[0] > -1),
        lambda: torch.pjrt.synchronize(),
    ]
    for n, read in enumerate(reads, 1):
        read()
        assert metrics.as_dict()["host_syncs"] == n
    str(y)  # printing reads the values (PyTorch's formatting reads a few of them)
    assert metrics.as_dict()["host_syncs"] > n


# --- strict mode ----------------------------------------------------------------------


def test_strict_raises_on_cpu_fallback():
    import tests.test_errors  # noqa: F401  (defines pjrt_test::twice, with a CPU kernel only)

    x = torch.rand(3).to("pjrt")
    with torch_pjrt.strict(), pytest.raises(torch_pjrt.StrictModeError, match="pjrt_test.twice"):
        torch.ops.pjrt_test.twice(x)


@pytest.mark.parametrize("mode", ["eager", "fused"])
def test_strict_raises_on_host_sync_inside_a_step_after_warmup(mode):
    torch_pjrt.set_mode(mode)
    x = torch.randn(4).to("pjrt")
    with torch_pjrt.strict():
        for i in range(3):
            with torch_pjrt.step():
                s = (x * 2).sum()
                if i < 2:
                    s.item()  # warm-up steps may sync
        s.item()  # outside a step: allowed
        with pytest.raises(
            torch_pjrt.StrictModeError, match=r"host sync inside step 4 at .*test_modes\.py:\d+"
        ):
            with torch_pjrt.step():
                (x * 2).sum().item()


@pytest.mark.parametrize("mode", ["eager", "fused"])
def test_strict_raises_on_new_compilation_after_warmup(mode):
    with torch_pjrt.mode(mode), torch_pjrt.strict():
        for _ in range(3):
            with torch_pjrt.step():
                y = torch.ones(5, device="pjrt").cumsum(0)
        assert y.cpu()[-1] == 5
        with pytest.raises(torch_pjrt.StrictModeError, match="new XLA compilation"):
            with torch_pjrt.step():
                torch.ones(7, device="pjrt").cumsum(0).exp()


# --- metrics --------------------------------------------------------------------------


def test_metrics_explain_compilations_and_transfers():
    torch_pjrt.set_mode("eager")
    metrics.reset()
    a = torch.ones(13, 29).to("pjrt")  # shapes no other test uses
    a * 5
    a[0] * 5  # a new shape: compiled again, and the cause says which input changed
    d = metrics.as_dict()
    assert d["transfers_to_device"] == 1 and d["bytes_to_device"] == 13 * 29 * 4
    causes = d["eager_compile_causes"]
    assert causes["aten.mul.Tensor: self changed from float32[13,29] to float32[29]"] == 1
    assert d["eager_compilations"] == sum(causes.values()) and d["eager_compile_seconds"] > 0
    assert d["ops"]["aten.mul.Tensor"] == 2
    report = metrics.report()
    assert "aten.mul.Tensor" in report and "transfers_to_device: 1" in report


def test_a_failed_fused_program_is_reported_where_its_values_are_read(monkeypatch):
    from torch_pjrt.modes import fused

    def broken(key):
        def run(donated, kept):
            raise RuntimeError("device lost")

        return run, False

    x = torch.ones(7, 13).to("pjrt")  # a shape no other test records
    torch.pjrt.synchronize()
    with torch_pjrt.mode("fused"):
        y = (x * 3).exp()
        recorded = inspect.currentframe().f_lineno - 1
        monkeypatch.setattr(fused._graph(0).program, "build", broken)
        with pytest.raises(RuntimeError, match="device lost") as info:
            y.cpu()
        # the error names the ops recorded and the line that asked for their values
        note = "".join(getattr(info.value, "__notes__", []))
        # each with the line that recorded it
        assert "of the 2 ops recorded on pjrt:0 (aten.mul.Tensor at " in note
        assert f", aten.exp.default at {__file__}:{recorded}), run for " in note
        assert f"{__file__}:" in note
        monkeypatch.undo()
        with pytest.raises(RuntimeError, match="the fused program that computes this value failed"):
            y.cpu()
        assert fused.pending_ops() == 0  # the failed recording was dropped
        assert (x * 2).cpu().sum().item() == 2 * 7 * 13  # and the device works on


def test_an_op_failing_as_its_fused_program_is_built_is_named_with_its_line():
    from torch_pjrt.modes import fused

    def failing(*args):
        raise ValueError("lowering failed")

    x = torch.ones(7, 17).to("pjrt")
    torch.pjrt.synchronize()
    with torch_pjrt.mode("fused"):
        y = x * 3
        z = y.exp()
        recorded = inspect.currentframe().f_lineno - 1
        graph = fused._graph(0)
        _, treedef, refs, outs = graph.nodes[-1]
        graph.nodes[-1] = (failing, treedef, refs, outs)  # exp's lowering, broken
        with pytest.raises(ValueError, match="lowering failed") as info:
            z.cpu()
    note = "".join(getattr(info.value, "__notes__", []))
    assert (
        "the op aten.exp.default (aten::exp(Tensor self) -> Tensor), recorded at "
        f"{__file__}:{recorded}, failed as op 1 of the fused program of the 2 ops" in note
    )
    assert fused.pending_ops() == 0


def test_fused_optimizer_steps_end_steps_without_step_blocks():
    # a loop with no torch_pjrt.step() and no host read: each optimizer step ends one
    # recording, so every iteration is the same cached program
    torch.manual_seed(0)
    model = MODELS["mlp"]().to("pjrt")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = tuple(t.to("pjrt") for t in model.batch(torch.Generator().manual_seed(1)))
    compiles = []
    with torch_pjrt.mode("fused"):
        for _ in range(5):
            metrics.reset()
            opt.zero_grad()
            model.loss(batch).backward()
            opt.step()
            compiles.append(metrics.as_dict().get("fused_compilations", 0))
        assert metrics.as_dict()["fused_flush_reasons"] == {"optimizer step": 1}
    assert compiles[2:] == [0, 0, 0], compiles
