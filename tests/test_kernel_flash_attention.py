"""``pjrt::flash_attention``: the Pallas kernel (interpreted on the CPU) against its
reference, forward and backward, and the op against CPU PyTorch's
``scaled_dot_product_attention`` eagerly, compiled and on CPU tensors.

An interpreted Pallas case takes seconds, so the fast cases combine features; each
feature alone is a ``slow`` case (``--exhaustive``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torch_pjrt.kernels import flash_attention as fa
from torch_pjrt.kernels.flash_attention import flash_attention

_slow = pytest.mark.slow

# (B, Hq, Hkv, Sq, Sk, D), kv_lengths, features
PALLAS_CASES = [
    # Sq != Sk, neither a whole number of blocks; an empty batch row gives zeros
    pytest.param((2, 4, 2, 24, 40, 16), [40, 0], {"softcap": 5.0}, id="cross-gqa-softcap-lengths"),
    # (causal with GQA and lengths: test_op_on_the_pallas_path_matches_sdpa)
    pytest.param(
        (2, 4, 1, 32, 32, 16), [32, 13], {"causal": True}, id="causal-gqa-lengths", marks=_slow
    ),
    pytest.param(
        (2, 4, 2, 40, 40, 32),
        [40, 17],
        {"causal": True, "window": 6, "softcap": 3.0},
        id="window-softcap-gqa-lengths",
    ),
    pytest.param((1, 2, 2, 32, 32, 16), None, {}, id="plain", marks=_slow),
    pytest.param((1, 2, 2, 24, 40, 16), None, {}, id="cross", marks=_slow),
    pytest.param((1, 2, 2, 32, 32, 16), None, {"causal": True}, id="causal", marks=_slow),
    pytest.param((2, 2, 2, 32, 32, 16), [32, 13], {}, id="lengths", marks=_slow),
    pytest.param((1, 4, 2, 32, 32, 16), None, {}, id="gqa", marks=_slow),
    pytest.param(
        (1, 2, 2, 48, 48, 16), None, {"causal": True, "window": 8}, id="window", marks=_slow
    ),
    pytest.param((1, 2, 2, 32, 32, 16), None, {"softcap": 5.0}, id="softcap", marks=_slow),
]


def _jax_inputs(b, hq, hkv, sq, sk, d):
    q, k, v, g = jax.random.split(jax.random.key(0), 4)
    return (
        jax.random.normal(q, (b, hq, sq, d)),
        jax.random.normal(k, (b, hkv, sk, d)),
        jax.random.normal(v, (b, hkv, sk, d)),
        jax.random.normal(g, (b, hq, sq, d)),
    )


@pytest.mark.parametrize(("shape", "lengths", "features"), PALLAS_CASES)
def test_pallas_kernel_matches_the_reference(shape, lengths, features):
    q, k, v, grad = _jax_inputs(*shape)
    lengths = None if lengths is None else jnp.array(lengths, jnp.int32)
    statics = {"causal": False, "window": None, "softcap": None, "scale": 1 / math.sqrt(shape[-1])}
    statics |= features

    def forward_and_backward(impl):
        def both(q, k, v, grad, lengths):
            blocks = {"impl": impl, "block_q": 8, "block_k": 16}
            out = fa._attention(q, k, v, lengths, **blocks, **statics)
            return out, fa._attention_backward(q, k, v, lengths, grad, **blocks, **statics)

        return jax.tree.leaves(jax.jit(both)(q, k, v, grad, lengths))

    for got, want in zip(forward_and_backward("pallas"), forward_and_backward("reference")):
        torch.testing.assert_close(
            torch.from_numpy(np.array(got)), torch.from_numpy(np.array(want))
        )


# --- the op against PyTorch ---------------------------------------------------------------


def _torch_inputs(b, hq, hkv, sq, sk, d):
    torch.manual_seed(0)
    return (
        torch.randn(b, hq, sq, d),
        torch.randn(b, hkv, sk, d),
        torch.randn(b, hkv, sk, d),
        torch.randn(b, hq, sq, d),
    )


def _padding_mask(lengths, sk):
    """kv_lengths as SDPA's boolean attn_mask [B, 1, 1, Sk]."""
    return (torch.arange(sk)[None, :] < lengths[:, None])[:, None, None, :]


def _outputs_and_grads(fn, q, k, v, grad):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    out.backward(grad.to(out.device))
    return [t.detach().cpu() for t in (out, q.grad, k.grad, v.grad)]


def _assert_all_close(got, want):
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


# (B, Hq, Hkv, Sq, Sk, D), kv_lengths, causal: each against SDPA with the same features
SDPA_CASES = [
    pytest.param((2, 2, 2, 16, 16, 16), None, True, id="causal"),
    pytest.param((2, 2, 2, 16, 24, 16), [24, 5], False, id="padding"),
    pytest.param((2, 4, 2, 16, 16, 32), None, False, id="gqa"),
    pytest.param((1, 2, 2, 8, 24, 16), None, False, id="cross"),
    pytest.param((2, 4, 1, 16, 16, 16), [16, 9], True, id="causal-gqa-padding"),
]


def _sdpa(lengths, causal, sk):
    mask = None if lengths is None else _padding_mask(torch.tensor(lengths), sk)

    def fn(q, k, v):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True
        )

    return fn


def _ours(lengths, causal, device, **kwargs):
    kv_lengths = None if lengths is None else torch.tensor(lengths, device=device)

    def fn(q, k, v):
        return flash_attention(q, k, v, kv_lengths=kv_lengths, causal=causal, **kwargs)

    return fn


@pytest.mark.parametrize(("shape", "lengths", "causal"), SDPA_CASES)
@pytest.mark.parametrize("device", ["pjrt", "cpu"])
def test_op_matches_sdpa(shape, lengths, causal, device):
    q, k, v, grad = _torch_inputs(*shape)
    want = _outputs_and_grads(_sdpa(lengths, causal, shape[4]), q, k, v, grad)
    on = [x.to(device) for x in (q, k, v)]
    got = _outputs_and_grads(_ours(lengths, causal, device), *on, grad)
    _assert_all_close(got, want)


def test_op_on_the_pallas_path_matches_sdpa():
    shape, lengths = (2, 4, 2, 24, 24, 16), [24, 11]
    q, k, v, grad = _torch_inputs(*shape)
    want = _outputs_and_grads(_sdpa(lengths, True, shape[4]), q, k, v, grad)
    ours = _ours(lengths, True, "pjrt", impl="pallas", block_q=8, block_k=16)
    got = _outputs_and_grads(ours, *(x.to("pjrt") for x in (q, k, v)), grad)
    _assert_all_close(got, want)


def _formula(q, k, v, *, window, softcap):
    """Causal attention in a sliding window, with capped logits, written out."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = softcap * torch.tanh(s / softcap)
    i = torch.arange(q.shape[2])[:, None]
    j = torch.arange(k.shape[2])[None, :]
    s = s.masked_fill(~((j <= i) & (j > i - window)), float("-inf"))
    return s.softmax(-1) @ v


@pytest.mark.parametrize("device", ["pjrt", "cpu"])
def test_window_and_softcap_match_a_pytorch_formula(device):
    q, k, v, grad = _torch_inputs(1, 4, 2, 24, 24, 16)
    want = _outputs_and_grads(lambda *a: _formula(*a, window=5, softcap=4.0), q, k, v, grad)
    on = [x.to(device) for x in (q, k, v)]
    got = _outputs_and_grads(_ours(None, True, device, window=5, softcap=4.0), *on, grad)
    _assert_all_close(got, want)


def test_compiled_fullgraph_matches_sdpa():
    shape, lengths = (2, 4, 2, 16, 16, 16), [16, 7]
    q, k, v, grad = _torch_inputs(*shape)
    want = _outputs_and_grads(_sdpa(lengths, True, shape[4]), q, k, v, grad)
    kv_lengths = torch.tensor(lengths, device="pjrt")
    compiled = torch.compile(
        lambda q, k, v: flash_attention(q, k, v, kv_lengths=kv_lengths, causal=True) * 1.0,
        backend="pjrt",
        fullgraph=True,
    )
    got = _outputs_and_grads(compiled, *(x.to("pjrt") for x in (q, k, v)), grad)
    _assert_all_close(got, want)


def test_the_op_and_its_kernels():
    assert flash_attention is torch.ops.pjrt.flash_attention
    assert "Tensor? kv_lengths=None" in str(flash_attention.default._schema)
    assert fa.flash_attention_dense is torch.ops.pjrt.flash_attention_dense
    assert fa.flash_attention_varlen is torch.ops.pjrt.flash_attention_varlen


# --- bad input ---------------------------------------------------------------------------


def _bad(q=(1, 4, 8, 16), k=(1, 2, 8, 16), v=None, lengths=None, **kwargs):
    q, k = torch.randn(*q, device="pjrt"), torch.randn(*k, device="pjrt")
    v = k if v is None else torch.randn(*v, device="pjrt")
    return lambda: flash_attention(q, k, v, kv_lengths=lengths, **kwargs)


BAD_INPUTS = [
    pytest.param(_bad(q=(4, 8, 16)), "expected q to be 4-D", id="3-D q"),
    pytest.param(_bad(v=(1, 2, 4, 16)), "expected k and v of the same shape", id="k-v shapes"),
    pytest.param(_bad(k=(1, 2, 8, 32)), "agree in batch and head_dim", id="head_dim"),
    pytest.param(_bad(k=(2, 2, 8, 16)), "agree in batch and head_dim", id="batch"),
    pytest.param(_bad(k=(1, 3, 8, 16)), r"query heads \(4\) must be a multiple", id="Hq % Hkv"),
    pytest.param(
        _bad(lengths=torch.ones(2, dtype=torch.int64, device="pjrt")),
        r"kv_lengths to be an integer tensor of shape \[batch\]",
        id="lengths shape",
    ),
    pytest.param(_bad(window=4), "needs causal=True", id="window without causal"),
    pytest.param(_bad(softcap=-1.0), "softcap must be positive", id="softcap"),
    pytest.param(_bad(impl="triton"), "impl must be one of auto, pallas, reference", id="impl"),
]


@pytest.mark.parametrize(("call", "message"), BAD_INPUTS)
def test_bad_input_says_what_is_wrong(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# --- memory --------------------------------------------------------------------------------


def _temp_bytes(impl: str, s: int, backward: bool) -> int:
    spec = jax.ShapeDtypeStruct((1, 1, s, 64), jnp.float32)
    statics = dict(impl=impl, block_q=128, block_k=128, causal=True, scale=0.125)
    statics.update(window=None, softcap=None)
    if backward:
        fn = lambda q, k, v, g: fa._attention_backward(q, k, v, None, g, **statics)  # noqa: E731
        specs = (spec,) * 4
    else:
        fn = lambda q, k, v: fa._attention(q, k, v, None, **statics)  # noqa: E731
        specs = (spec,) * 3
    return jax.jit(fn).lower(*specs).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_memory_grows_linearly_with_the_sequence(backward):
    """XLA's compiled memory analysis (benchmarks/kernel_memory.py has the table): the
    kernel's temporaries grow like the sequence, the XLA path's like its square (it holds
    the [S, S] scores)."""
    kernel = [_temp_bytes("pallas", s, backward) for s in (1024, 2048)]
    xla = [_temp_bytes("reference", s, backward) for s in (1024, 2048)]
    assert xla[1] >= 3.5 * xla[0] and xla[0] >= 1024 * 1024 * 4  # quadratic: the scores
    assert kernel[1] <= 2.5 * kernel[0]  # linear
    assert kernel[1] * 8 < xla[1]
