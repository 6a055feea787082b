"""FlexAttention on pjrt tensors (``torch_pjrt/kernels/flex.py``, ``compile/hops.py``,
``compile/inductor.py``): block masks and score mods, eagerly, under
``torch.compile(backend="pjrt")`` and under ``torch.compile`` with its default backend,
forward against CPU PyTorch's ``flex_attention`` and backward against CPU autograd of the
same attention written out densely (CPU PyTorch refuses FlexAttention's backward)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import torch_pjrt

S = 100  # not a multiple of the block size (128): the block mask's padding is exercised
DOCS = torch.tensor([0] * 30 + [1] * 45 + [2] * 25)  # document ids of the positions


def _causal(b, h, q, k):
    return q >= k


def _alibi(score, b, h, q, k):
    return score - (h + 1) * 0.25 * (q - k).abs()


def _softcap(score, b, h, q, k):
    return 5.0 * torch.tanh(score / 5.0)


def _document_mask(docs):
    def mask(b, h, q, k):
        return (docs[q] == docs[k]) & (q >= k)

    return mask


def _alibi_bias(h):
    i = torch.arange(S, dtype=torch.float64)
    slopes = (torch.arange(h, dtype=torch.float64) + 1) * 0.25
    return -slopes[:, None, None] * (i[:, None] - i[None, :]).abs()


# name: (score_mod, mask_mod maker (docs -> mask_mod) or None, dense reference of both:
# (scores [b, h, q, k] float64) -> scores with the mod and -inf where masked)
CASES = {
    "causal": (None, lambda docs: _causal, lambda s: s.masked_fill(~_tril(), -math.inf)),
    "alibi": (_alibi, None, lambda s: s + _alibi_bias(s.shape[1])),
    "softcap-causal": (
        _softcap,
        lambda docs: _causal,
        lambda s: (5.0 * torch.tanh(s / 5.0)).masked_fill(~_tril(), -math.inf),
    ),
    "document": (
        None,
        _document_mask,
        lambda s: s.masked_fill(~(_tril() & (DOCS[:, None] == DOCS[None, :])), -math.inf),
    ),
}


def _tril():
    return torch.ones(S, S, dtype=torch.bool).tril()


def _inputs(hq=4, hkv=4, d=16, b=2):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(b, h, S, d, generator=g) for h in (hq, hkv, hkv)]


def _attend(name, q, k, v, fn=flex_attention, **kwargs):
    score_mod, make_mask, _ = CASES[name]
    block_mask = None
    if make_mask is not None:
        mask_mod = make_mask(DOCS.to(q.device))
        block_mask = create_block_mask(mask_mod, None, None, S, S, device=q.device)
    return fn(q, k, v, score_mod=score_mod, block_mask=block_mask, **kwargs)


def _dense(name, q, k, v):
    """The same attention, written out on float64 CPU tensors (grouped-query heads
    repeated)."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    scores = CASES[name][2](q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]))
    return torch.softmax(scores, -1) @ v


def _weights(out):
    return torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)


def _grads(fn, q, k, v, device, dtype=None):
    q, k, v = (x.to(device, dtype).requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    (out * _weights(out).to(device)).sum().backward()
    return [t.detach().cpu().float() for t in (out, q.grad, k.grad, v.grad)]


COMPILERS = {
    "eager": lambda: flex_attention,
    "pjrt": lambda: torch.compile(flex_attention, backend="pjrt", fullgraph=True),
    "default": lambda: torch.compile(flex_attention, fullgraph=True),
}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("how", sorted(COMPILERS))
@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_matches_cpu_flex_attention(name, how):
    q, k, v = _inputs()
    want = _attend(name, q, k, v)
    got = _attend(name, *(x.to("pjrt") for x in (q, k, v)), fn=COMPILERS[how]())
    assert got.device.type == "pjrt"
    torch.testing.assert_close(got.cpu(), want)


@pytest.mark.parametrize("how", sorted(COMPILERS))
@pytest.mark.parametrize("name", ["document", "alibi"])
def test_backward_matches_cpu_autograd(name, how):
    q, k, v = _inputs(hq=4, hkv=2)  # grouped-query: two query heads a key head
    want = _grads(lambda *t: _dense(name, *t), q, k, v, "cpu", torch.float64)
    fn = COMPILERS[how]()
    got = _grads(lambda *t: _attend(name, *t, fn=fn, enable_gqa=True), q, k, v, "pjrt")
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b.float(), rtol=1e-4, atol=1e-5)


def test_compiled_step_is_one_program_each_way():
    """Under the pjrt backend the attention is traced into the graph's program: no
    higher-order op is left to run eagerly, forward or backward."""
    q, k, v = (x.to("pjrt").requires_grad_() for x in _inputs())
    torch_pjrt.metrics.reset()
    fn = torch.compile(flex_attention, backend="pjrt", fullgraph=True)
    out = _attend("document", q, k, v, fn=fn)
    out.sum().backward()
    stats = torch_pjrt.metrics.as_dict()
    assert "graph_eager_ops" not in stats, stats.get("graph_eager_ops")
    assert stats.get("graph_forward_compilations") == 1
    assert stats.get("graph_backward_compilations") == 1


def test_logsumexp_matches_cpu():
    from torch.nn.attention.flex_attention import AuxRequest

    q, k, v = _inputs()
    want, want_aux = _attend("causal", q, k, v, return_aux=AuxRequest(lse=True))
    got, got_aux = _attend(
        "causal", *(x.to("pjrt") for x in (q, k, v)), return_aux=AuxRequest(lse=True)
    )
    torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close(got_aux.lse.cpu(), want_aux.lse)


def test_bfloat16_is_as_close_to_exact_as_cpu():
    """In bfloat16 the two differ by a few units in the last place (matmul accumulation
    order); measured against the exact (float64) attention pjrt is as close as CPU."""
    q, k, v = (x.bfloat16() for x in _inputs())
    exact = _dense("softcap-causal", *(x.double() for x in (q, k, v)))
    want = _attend("softcap-causal", q, k, v)
    got = _attend("softcap-causal", *(x.to("pjrt") for x in (q, k, v)))
    assert got.dtype == torch.bfloat16
    cpu_error = (want.double() - exact).abs().max()
    pjrt_error = (got.cpu().double() - exact).abs().max()
    assert pjrt_error <= 1.5 * cpu_error, (pjrt_error, cpu_error)


def test_other_devices_keep_pytorchs_device_check():
    q = torch.empty(1, 1, S, 16, device="meta")
    with pytest.raises(ValueError, match="FlexAttention is only supported on"):
        flex_attention(q, q, q)


def test_default_backend_takes_pjrt_graphs_and_leaves_the_rest():
    """``torch.compile`` with no backend on pjrt tensors runs the pjrt backend (inductor
    has no code generator for pjrt); a graph over CPU tensors stays inductor's."""
    torch_pjrt.metrics.reset()
    fn = torch.compile(lambda x: (x + 1).sin() * 2)
    x = torch.randn(8)
    torch.testing.assert_close(fn(x.to("pjrt")).cpu(), (x + 1).sin() * 2)
    assert torch_pjrt.metrics.as_dict().get("inductor_graphs_on_pjrt") == 1
    torch.testing.assert_close(fn(x), (x + 1).sin() * 2)
    assert torch_pjrt.metrics.as_dict().get("inductor_graphs_on_pjrt") == 1


def test_hugging_face_flex_attention_trains_as_on_cpu():
    """``attn_implementation="flex_attention"``: transformers builds its block masks
    with ``create_block_mask`` and calls ``torch.compile(flex_attention)`` (the default
    backend); on pjrt the logits, with and without padding, the loss and the gradients
    are the CPU model's (transformers' SDPA attention)."""
    import copy

    from tests.hf_families import FAMILIES, VOCAB  # (transformers imported here: slow)

    torch.manual_seed(0)
    reference = FAMILIES["llama"].build().eval()
    model = copy.deepcopy(reference)
    model.set_attn_implementation("flex_attention")
    model.to("pjrt")
    ids = torch.randint(3, VOCAB, (2, 12), generator=torch.Generator().manual_seed(2))
    padded = torch.ones_like(ids)
    padded[1, :4] = 0
    torch_pjrt.metrics.reset()
    with torch.no_grad():
        got = model(ids.to("pjrt"), attention_mask=padded.to("pjrt")).logits.cpu()
    want = reference(ids, attention_mask=padded).logits
    torch.testing.assert_close(got[padded.bool()], want[padded.bool()])
    loss = model(ids.to("pjrt"), labels=ids.to("pjrt")).loss
    loss.backward()
    want_loss = reference(ids, labels=ids).loss
    want_loss.backward()
    torch.testing.assert_close(loss.cpu(), want_loss)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-5, msg=name)
    assert torch_pjrt.metrics.as_dict().get("inductor_graphs_on_pjrt", 0) >= 2


def test_the_docs_example():
    """docs/kernels.md's FlexAttention example runs as written."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).parents[1] / "docs" / "kernels.md").read_text()
    section = text[text.index("## FlexAttention") :]
    example = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    exec(compile(example, "docs/kernels.md", "exec"), scope)
    assert scope["q"].grad is not None and scope["q"].grad.device.type == "pjrt"
