"""Precision and autocast, PyTorch's way: float32 products at full precision unless
``torch.set_float32_matmul_precision`` says otherwise, and ``torch.autocast`` on pjrt
following PyTorch's (CUDA) autocast op lists."""

from __future__ import annotations

import copy
import re

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from torch_pjrt.ops import autocast, registry
from torch_pjrt.ops import convolution as pjrt_convolution
from torch_pjrt.ops import linalg as pjrt_linalg

LOW = [torch.bfloat16, torch.float16]


@pytest.fixture
def precision():
    """Restore the float32 matmul precision after the test."""
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


# --- float32 matmul precision ----------------------------------------------------------


def _hlo_precisions(fn, *args) -> set[str]:
    """The operand precisions of the products in ``fn``'s StableHLO."""
    text = jax.jit(fn).lower(*args).as_text()
    dots = re.findall(r"precision = \[(\w+), (\w+)\]", text)
    convs = re.findall(r"precision (\w+)>", text)
    assert dots or convs, text
    return {p for pair in dots for p in pair} | set(convs)


@pytest.mark.parametrize(
    "setting, expected",
    [("highest", {"HIGHEST"}), ("high", {"HIGH"}), ("medium", {"DEFAULT"})],
)
def test_matmul_precision_reaches_the_program(precision, setting, expected):
    torch.set_float32_matmul_precision(setting)
    a = jnp.ones((4, 4), jnp.float32)
    img, w = jnp.ones((1, 2, 5, 5), jnp.float32), jnp.ones((3, 2, 3, 3), jnp.float32)

    def conv(x, k):
        return pjrt_convolution._conv(x, k, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)

    # (fresh functions: jax.jit caches a trace per function, whatever the setting)
    assert _hlo_precisions(lambda x, y: pjrt_linalg.matmul_acc(x, y), a, a) == expected
    assert _hlo_precisions(lambda x, y: pjrt_linalg.einsum_acc("ij,jk->ik", x, y), a, a) == (
        expected
    )
    assert _hlo_precisions(conv, img, w) == expected


def test_default_precision_is_full_float32():
    assert torch.get_float32_matmul_precision() == "highest"
    assert pjrt_linalg.matmul_precision() == jax.lax.Precision.HIGHEST


@pytest.mark.parametrize("setting", ["highest", "medium"])
def test_products_left_to_jax_are_full_precision(precision, tmp_path, setting):
    """JAX's own default precision is TF32 on recent NVIDIA GPUs and one bfloat16 pass
    on TPU: a product a lowering leaves to JAX (inside jnp.linalg or jax.scipy, or
    written without precision=) is traced at "highest" in eager and compiled programs
    (runtime.executor.traced_at_full_precision), while user-level products follow the setting."""
    torch.set_float32_matmul_precision(setting)
    user = {"highest": {"HIGHEST"}, "medium": {"DEFAULT"}}[setting]

    def lowering(self, mat2):  # a product with no precision= of its own, and mm's
        return jnp.matmul(self, mat2) + pjrt_linalg.matmul_acc(self, mat2)

    kernel = registry.Kernel(torch.ops.aten.mm.default, registry.Lowering(lowering))
    a = torch.randn(4, 4, device="pjrt")
    torch.testing.assert_close(kernel(a, a).cpu(), 2 * (a.cpu() @ a.cpu()))
    (program,) = kernel.program.cache.values()
    arr = torch_pjrt.device.tensor.read(a)
    text = program.lower([arr, arr], [], None).as_text()
    dots = re.findall(r"precision = \[(\w+), (\w+)\]", text)
    assert sorted(p for p, _ in dots) == sorted(["HIGHEST", *user]), text

    # a compiled graph: ldl_solve's eliminations are products without precision=
    A = torch.randn(5, 5)
    A = A @ A.T + 5 * torch.eye(5)
    LD, pivots = torch.linalg.ldl_factor(A)
    B = torch.randn(5, 2)
    torch_pjrt.compile.dump_graphs(tmp_path)
    try:
        f = torch.compile(
            lambda ld, p, b, x: (torch.linalg.ldl_solve(ld, p, b), x @ x), backend="pjrt"
        )
        got = f(LD.to("pjrt"), pivots.to("pjrt"), B.to("pjrt"), A.to("pjrt"))
    finally:
        torch_pjrt.compile.dump_graphs(None)
        torch._dynamo.reset()
    torch.testing.assert_close(got[0].cpu(), torch.linalg.ldl_solve(LD, pivots, B))
    text = "".join(f.read_text() for f in tmp_path.glob("*.stablehlo.mlir"))
    found = {p for pair in re.findall(r"precision = \[(\w+), (\w+)\]", text) for p in pair}
    assert found == {"HIGHEST", *user}, text


@pytest.mark.parametrize("mode", ["eager", "fused"])
def test_changing_precision_builds_a_new_program(precision, mode):
    a = torch.randn(8, 8, device="pjrt")
    with torch_pjrt.mode(mode):
        for _ in range(2):  # (fused mode: the first recording may differ in donations)
            (a @ a).cpu()
        before = torch_pjrt.metrics.as_dict().get("compilations", 0)
        (a @ a).cpu()
        assert torch_pjrt.metrics.as_dict().get("compilations", 0) == before  # cached
        torch.set_float32_matmul_precision("medium")
        (a @ a).cpu()
        assert torch_pjrt.metrics.as_dict().get("compilations", 0) > before
    if mode == "eager":
        causes = torch_pjrt.metrics.as_dict()["eager_compile_causes"]
        assert (
            "aten.mm.default: float32 matmul precision changed from 'highest' to 'medium'" in causes
        )


def test_changing_precision_recompiles_a_compiled_graph(precision):
    fn = torch.compile(lambda a, b: a @ b, backend="pjrt")
    a = torch.randn(8, 8, device="pjrt")
    torch.testing.assert_close(fn(a, a).cpu(), a.cpu() @ a.cpu())
    before = torch_pjrt.metrics.as_dict().get("graph_compilations", 0)
    torch.set_float32_matmul_precision("high")
    # TensorFloat-32 on a GPU: about 1e-3 relative; the CPU stays at float32
    torch.testing.assert_close(fn(a, a).cpu(), a.cpu() @ a.cpu(), rtol=1e-2, atol=1e-2)
    assert torch_pjrt.metrics.as_dict().get("graph_compilations", 0) == before + 1


# --- autocast: the op lists ----------------------------------------------------------


def test_amp_supported_dtypes():
    assert torch.pjrt.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    assert torch.amp.is_autocast_available("pjrt")


def test_autocast_covers_pytorchs_op_list():
    """Every op PyTorch autocasts on CUDA has a pjrt autocast kernel, and no other op
    (cuDNN's own convolutions excepted: they do not exist here)."""
    cuda = {
        name
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("aten::")
        and not name.startswith("aten::cudnn_")
        and torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutocastCUDA")
    }
    ours = {
        op._schema.name + ("" if op._overloadname == "default" else f".{op._overloadname}")
        for op in autocast.policy()
    }
    assert ours == cuda
    for name in ours:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutocastPrivateUse1")


def _t(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype, device="pjrt")


BF, HF, DF, F32 = torch.bfloat16, torch.float16, torch.float64, torch.float32
# (label, call, dtype under autocast: "low" is the autocast dtype)
CASES = [
    ("mm", lambda low: torch.mm(_t(3, 4), _t(4, 5)), "low"),
    ("matmul", lambda low: _t(2, 3, 4) @ _t(4, 5), "low"),
    ("linear", lambda low: F.linear(_t(3, 4), _t(5, 4), _t(5)), "low"),
    ("addmm", lambda low: torch.addmm(_t(5), _t(3, 4), _t(4, 5)), "low"),
    ("baddbmm", lambda low: torch.baddbmm(_t(2, 3, 5), _t(2, 3, 4), _t(2, 4, 5)), "low"),
    ("conv2d", lambda low: F.conv2d(_t(1, 2, 6, 6), _t(3, 2, 3, 3)), "low"),
    ("einsum", lambda low: torch.einsum("ij,jk->ik", _t(3, 4), _t(4, 5)), "low"),
    ("sdpa", lambda low: F.scaled_dot_product_attention(*[_t(1, 2, 4, 8)] * 3), "low"),
    ("exp", lambda low: torch.exp(_t(4, dtype=BF)), F32),
    ("log_softmax", lambda low: F.log_softmax(_t(3, 4, dtype=HF), -1), F32),
    ("softmax", lambda low: torch.softmax(_t(3, 4, dtype=BF), -1), F32),
    ("softmax_dtype", lambda low: torch.softmax(_t(3, 4), -1, dtype=DF), DF),
    ("sum", lambda low: torch.sum(_t(3, 4, dtype=BF)), F32),
    ("sum_dim", lambda low: _t(3, 4, dtype=HF).sum(1), F32),
    ("cumsum", lambda low: torch.cumsum(_t(3, 4, dtype=BF), 0), F32),
    ("norm", lambda low: torch.norm(_t(3, 4, dtype=BF), 2.0), F32),
    ("layer_norm", lambda low: F.layer_norm(_t(3, 4, dtype=BF), (4,)), F32),
    ("mse_loss", lambda low: F.mse_loss(_t(3, dtype=HF), _t(3, dtype=HF)), F32),
    ("pow", lambda low: torch.pow(_t(3, dtype=BF), 2.0), F32),
    ("addcmul_mixed", lambda low: torch.addcmul(_t(3), _t(3, dtype=BF), _t(3, dtype=BF)), F32),
    ("atan2_low", lambda low: torch.atan2(_t(3, dtype=low), _t(3, dtype=low)), "low"),
    ("atan2_mixed", lambda low: torch.atan2(_t(3, dtype=low), _t(3)), F32),
    ("relu_untouched", lambda low: torch.relu(_t(3, dtype=BF)), BF),
    ("add_untouched", lambda low: _t(3) + _t(3), F32),
    ("mm_float64", lambda low: torch.mm(_t(3, 4, dtype=DF), _t(4, 5, dtype=DF)), DF),
]  # fmt: skip


@pytest.mark.parametrize("low", LOW, ids=str)
@pytest.mark.parametrize("label, call, expected", CASES, ids=[c[0] for c in CASES])
def test_autocast_dtype(low, label, call, expected):
    torch.manual_seed(0)
    with torch.autocast(device_type="pjrt", dtype=low):
        out = call(low)
    assert out.dtype == (low if expected == "low" else expected)


def test_autocast_leaves_cpu_tensors_and_disabled_regions_alone():
    a = torch.randn(3, 4)
    with torch.autocast(device_type="pjrt", dtype=torch.bfloat16):
        assert (a @ a.T).dtype == torch.float32  # a CPU op: autocast("pjrt") is not "cpu"
        with torch.autocast(device_type="pjrt", enabled=False):
            assert (_t(3, 4) @ _t(4, 5)).dtype == torch.float32


def test_autocast_does_not_cast_twice_inside_an_op():
    """cdist runs in float32 as a whole: the matmul it decomposes into is not lowered to
    bfloat16 (the autocast key is excluded while an autocast op runs)."""
    torch.manual_seed(0)
    x, y = torch.randn(5, 8, dtype=torch.float64), torch.randn(6, 8, dtype=torch.float64)
    with torch.autocast(device_type="pjrt", dtype=torch.bfloat16):
        got = torch.cdist(x.float().to("pjrt"), y.float().to("pjrt"))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.cpu().double(), torch.cdist(x, y), rtol=1e-5, atol=1e-5)


def test_autocast_refuses_binary_cross_entropy():
    p = torch.rand(4, device="pjrt")
    with torch.autocast(device_type="pjrt", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="binary_cross_entropy_with_logits"):
            F.binary_cross_entropy(p, p)
    F.binary_cross_entropy(p, p)  # outside autocast it runs


# --- autocast: a model, against CPU autocast ------------------------------------------


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 6 * 6, 32),
        torch.nn.LayerNorm(32),
        torch.nn.GELU(),
        torch.nn.Linear(32, 10),
    )


def _step(model, x, t, device, dtype):
    with torch.autocast(device_type=device, dtype=dtype):
        out = model(x)
        loss = F.cross_entropy(out, t)
    loss.backward()
    return out, loss, [p.grad for p in model.parameters()]


@pytest.mark.parametrize("how", ["eager", "fused", "compiled"])
@pytest.mark.parametrize("low", LOW, ids=str)
def test_model_under_autocast_matches_cpu_autocast(how, low):
    model = _model()
    x, t = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
    ref_out, ref_loss, ref_grads = _step(copy.deepcopy(model), x, t, "cpu", low)
    m = copy.deepcopy(model).to("pjrt")
    if how == "compiled":
        m = torch.compile(m, backend="pjrt")
    with torch_pjrt.mode("fused" if how == "fused" else "eager"):
        out, loss, grads = _step(m, x.to("pjrt"), t.to("pjrt"), "pjrt", low)
    assert out.dtype == ref_out.dtype == low
    assert loss.dtype == ref_loss.dtype == torch.float32
    tol = {"rtol": 2e-2, "atol": 2e-2}  # a few roundings to 8 (bfloat16) or 11 bits
    torch.testing.assert_close(out.cpu(), ref_out, **tol)
    torch.testing.assert_close(loss.cpu(), ref_loss, **tol)
    for g, r in zip(grads, ref_grads):
        assert g.dtype == r.dtype == torch.float32  # parameters keep their dtype
        torch.testing.assert_close(g.cpu(), r, **tol)
