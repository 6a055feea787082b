"""``F.scaled_dot_product_attention`` on pjrt tensors, path by path
(``torch_pjrt/kernels/attention.py``): which path each call takes, and both paths
against CPU PyTorch's SDPA, forward and backward, eagerly, under ``inference_mode`` and
compiled."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from tests.hf_families import VOCAB
from torch_pjrt.kernels import attention


def _inputs(b=2, hq=4, hkv=2, sq=16, sk=16, d=16):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(b, h, s, d, generator=g) for h, s in ((hq, sq), (hkv, sk), (hkv, sk))]


def _paths() -> dict:
    return dict(torch_pjrt.metrics.as_dict().get("attention_paths", {}))


def _run(fn, q, k, v, device):
    """fn's output and the gradients of q, k, v (the loss: a fixed weighting of it)."""
    q, k, v = (x.detach().to(device).clone().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(device)
    (out * weights).sum().backward()
    return [t.detach().cpu() for t in (out, q.grad, k.grad, v.grad)]


CALLS = {
    "causal-gqa": lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True
    ),
    "scale-gqa": lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, scale=0.3, enable_gqa=True
    ),
}


@pytest.mark.parametrize("setting", ["auto", "kernel", "xla"])
@pytest.mark.parametrize("name", sorted(CALLS))
def test_each_path_matches_cpu_sdpa(name, setting):
    """On the CPU platform ``auto`` is XLA; ``kernel`` runs the Pallas kernel
    (interpreted): both give CPU PyTorch's values and gradients."""
    q, k, v = _inputs()
    want = _run(CALLS[name], q, k, v, "cpu")
    torch_pjrt.metrics.reset()
    with torch_pjrt.config(attention=setting):
        got = _run(CALLS[name], q, k, v, "pjrt")
    assert _paths() == {"kernel" if setting == "kernel" else "xla": 1}
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_calls_the_kernel_does_not_take_stay_on_xla():
    """A mask, dropout, 3-D tensors or mixed dtypes take the XLA path even when the
    kernel is asked for; the values stay the CPU's."""
    q, k, v = _inputs(hkv=4)
    mask = torch.rand(16, 16, generator=torch.Generator().manual_seed(1)) > 0.3
    cases = [
        (
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.device)),
            (q, k, v),
        ),
        (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), (q[0], k[0], v[0])),
    ]
    for fn, args in cases:
        want = _run(fn, *args, "cpu")
        torch_pjrt.metrics.reset()
        with torch_pjrt.config(attention="kernel"):
            got = _run(fn, *args, "pjrt")
        assert _paths() == {"xla": 1}
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
    pq, pk, pv = (x.to("pjrt") for x in (q, k, v))
    assert attention.choose(pq, pk, pv, dropout_p=0.1) == ("xla", "dropout")
    assert attention.choose(pq, pk.half(), pv) == ("xla", "dtype torch.float32")
    assert attention.choose(pq, pk[:, :2], pv[:, :2]) == (
        "xla",
        "heads that differ without enable_gqa",
    )


def test_the_auto_rule_per_platform(monkeypatch):
    """``auto``: XLA on the CPU; on an accelerator the kernel from 512 x 512 scores a
    head, XLA below."""
    short = [x.to("pjrt") for x in _inputs(sq=16, sk=16)]
    long = [torch.empty(1, 2, 512, 64, device="pjrt") for _ in range(3)]
    assert attention.choose(*long) == ("xla", "the CPU platform")
    monkeypatch.setattr(attention, "current_platform", lambda: "tpu")
    assert attention.choose(*short, enable_gqa=True) == ("xla", "a short sequence")
    assert attention.choose(*long) == ("kernel", "an accelerator")
    with torch_pjrt.config(attention="xla"):
        assert attention.choose(*long) == ("xla", "attention='xla'")


def test_no_grad_inference_mode_and_compiled_take_the_same_paths():
    q, k, v = _inputs()
    fn = CALLS["causal-gqa"]
    want = fn(q, k, v)
    on = [x.to("pjrt") for x in (q, k, v)]
    torch_pjrt.metrics.reset()
    with torch_pjrt.config(attention="kernel"):
        with torch.no_grad():
            torch.testing.assert_close(fn(*on).cpu(), want)
        with torch.inference_mode():
            torch.testing.assert_close(fn(*on).cpu(), want)
        compiled = torch.compile(fn, backend="pjrt", fullgraph=True)
        got = _run(compiled, q, k, v, "pjrt")
    paths = _paths()  # (Dynamo and AOT autograd trace the call too: each counts)
    assert list(paths) == ["kernel"] and paths["kernel"] >= 3
    for a, b in zip(got, _run(fn, q, k, v, "cpu")):
        torch.testing.assert_close(a, b)


def test_a_bad_setting_says_what_is_allowed():
    with pytest.raises(ValueError, match="one of auto, kernel, xla"):
        torch_pjrt.config(attention="flash")


def _llama():
    """tests/hf_families.py's small Llama (transformers' SDPA attention, CPU) and a copy
    on pjrt with ``attn_implementation="pjrt"``."""
    import copy

    from tests.hf_families import FAMILIES  # (transformers imported here: slow)

    torch.manual_seed(0)
    reference = FAMILIES["llama"].build().eval()
    model = copy.deepcopy(reference)
    model.set_attn_implementation("pjrt")
    return reference, model.to("pjrt")


@pytest.mark.parametrize("setting", ["auto", "kernel"])
def test_hugging_face_attn_implementation_pjrt(setting):
    """``attn_implementation="pjrt"``: a batch without padding runs the kernel (the
    reference on the CPU with ``auto``, the Pallas kernel with ``kernel``), a padded
    one transformers' SDPA attention; logits and greedy tokens as the CPU model's."""
    reference, model = _llama()
    assert model.config._attn_implementation == "pjrt"
    ids = torch.randint(3, VOCAB, (2, 12), generator=torch.Generator().manual_seed(2))
    padded = torch.ones_like(ids)
    padded[1, :4] = 0
    with torch.no_grad(), torch_pjrt.config(attention=setting):
        torch_pjrt.metrics.reset()
        got = model(ids.to("pjrt")).logits.cpu()
        assert _paths() == {"kernel": 2}  # (one call a layer)
        torch.testing.assert_close(got, reference(ids).logits)
        torch_pjrt.metrics.reset()
        got = model(ids.to("pjrt"), attention_mask=padded.to("pjrt")).logits.cpu()
        assert _paths() == {"xla": 2}
        want = reference(ids, attention_mask=padded).logits
        torch.testing.assert_close(got[padded.bool()], want[padded.bool()])
        tokens = model.generate(ids[:1].to("pjrt"), max_new_tokens=6, do_sample=False)
        assert torch.equal(
            tokens.cpu(), reference.generate(ids[:1], max_new_tokens=6, do_sample=False)
        )


def test_pjrt_attention_is_registered_whichever_is_imported_first():
    """The import hook registers ``"pjrt"`` when transformers' modules load after
    torch_pjrt; loaded before, they are registered at once."""
    import subprocess
    import sys

    check = (
        "from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS; "
        "from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS; "
        "print('pjrt' in ALL_ATTENTION_FUNCTIONS, 'pjrt' in ALL_MASK_ATTENTION_FUNCTIONS)"
    )
    for first in (
        "import torch_pjrt; " + check,
        check.replace("print(", "import torch_pjrt; print("),
    ):
        out = subprocess.run(
            [sys.executable, "-c", first], capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.split()[-2:] == ["True", "True"], out.stdout


def test_pytorchs_route_reaches_the_overrideable_backend():
    """SDPA's C++ choice sends pjrt calls without dropout to the overrideable op (a float
    bias's gradient included), calls with dropout and ``sdpa_kernel(MATH)`` to PyTorch's
    math; a direct call of the op with dropout is refused clearly."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = _inputs(hkv=4)
    bias = torch.randn(16, 16, generator=torch.Generator().manual_seed(3))

    def grads(device):
        ins = [x.to(device).requires_grad_() for x in (q, k, v, bias)]
        out = F.scaled_dot_product_attention(*ins[:3], attn_mask=ins[3])
        weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(device)
        found = torch.autograd.grad((out * weights).sum(), ins)
        return [t.detach().cpu() for t in (out, *found)]

    want = grads("cpu")
    torch_pjrt.metrics.reset()
    got = grads("pjrt")
    assert _paths() == {"xla": 1}
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    on = [x.to("pjrt") for x in (q, k, v)]
    assert torch._fused_sdp_choice(*on) == SDPBackend.OVERRIDEABLE.value
    assert torch._fused_sdp_choice(*on, dropout_p=0.5) == SDPBackend.MATH.value
    torch_pjrt.metrics.reset()
    with sdpa_kernel([SDPBackend.MATH]):
        assert torch._fused_sdp_choice(*on) == SDPBackend.MATH.value
        got = F.scaled_dot_product_attention(*on).cpu()
        torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v))
    assert _paths() == {}
    with pytest.raises(NotImplementedError, match="runs without dropout"):
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable(*on, dropout_p=0.5)
