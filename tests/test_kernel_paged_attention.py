"""Paged decode attention (torch_pjrt/kernels/paged_attention.py).

Our Pallas kernel (interpreted) and JAX's TPU kernel (under TPU interpret mode) against
the plain-JAX reference; the op on pjrt tensors, compiled and on CPU tensors against
PyTorch's scaled_dot_product_attention on each sequence's contiguous keys and values.
The caches hold shuffled physical blocks, sequences of different lengths ending
mid-block, and grouped-query heads.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from jax.experimental.pallas import tpu as pltpu

import torch_pjrt
from torch_pjrt.kernels.paged_attention import (
    paged_attention,
    paged_attention_kv,
    paged_attention_kv_pallas,
    paged_attention_kv_reference,
    paged_attention_pallas,
    paged_attention_reference,
    paged_attention_tpu,
)

# (B, Hq, Hkv, D, block_size, context_lens): lengths end mid-block, on a block's edge,
# in the first block; Hkv < Hq is GQA
CASES = {
    "gqa": (3, 4, 1, 16, 4, [13, 4, 1]),
    "two_kv_heads": (2, 4, 2, 32, 16, [20, 16]),
    "mha": (2, 4, 4, 16, 8, [9, 24]),
}


def _cache(batch, hq, hkv, d, block_size, lens, *, seed=0, dtype=torch.float32):
    """q, k_pages, v_pages, block_tables, context_lens, with shuffled physical blocks.

    Values are bfloat16-exact so that TPU interpret mode, which rounds matmul inputs to
    bfloat16 as the chip does at default precision, computes the same products.
    """
    g = torch.Generator().manual_seed(seed)
    max_blocks = -(-max(lens) // block_size) + 1  # (a spare, unused block per row)
    num_blocks = batch * max_blocks + 3

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(torch.bfloat16).to(dtype)

    q = randn(batch, hq, d)
    k_pages = randn(num_blocks, block_size, hkv, d)
    v_pages = randn(num_blocks, block_size, hkv, d)
    tables = torch.randperm(num_blocks, generator=g)[: batch * max_blocks]
    tables = tables.reshape(batch, max_blocks).to(torch.int32)
    return q, k_pages, v_pages, tables, torch.tensor(lens, dtype=torch.int32)


def _sdpa(q, k_pages, v_pages, tables, lens, scale=None):
    """The expected output: each sequence's keys and values made contiguous, then SDPA."""
    block_size, hkv = k_pages.shape[1], k_pages.shape[2]
    out = []
    for b, n in enumerate(lens.tolist()):
        blocks = tables[b, : -(-n // block_size)].long()
        k = k_pages[blocks].reshape(-1, hkv, k_pages.shape[-1])[:n].transpose(0, 1)
        v = v_pages[blocks].reshape(-1, hkv, v_pages.shape[-1])[:n].transpose(0, 1)
        query = q[b][:, None, :]  # [Hq, 1, D]
        out.append(F.scaled_dot_product_attention(query, k, v, scale=scale, enable_gqa=True))
    return torch.stack(out)[:, :, 0]


def _jax(*tensors):
    return [jnp.asarray(t.numpy()) for t in tensors]


def _close(actual, expected, **tol):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), **tol)


@pytest.fixture(autouse=True)
def _no_cpu_fallback():
    """Nothing here may leave the device: an op without a lowering raises."""
    with torch_pjrt.config(fallback="error"):
        yield


# --- the kernels against the reference ---------------------------------------------------


@pytest.mark.parametrize(("case", "softcap"), [("gqa", None), ("two_kv_heads", 2.0)])
def test_pallas_kernel_matches_reference(case, softcap):
    inputs = _jax(*_cache(*CASES[case]))
    expected = paged_attention_reference(*inputs, scale=0.25, softcap=softcap)
    out = paged_attention_pallas(*inputs, scale=0.25, softcap=softcap, interpret=True)
    _close(out, expected, atol=1e-5, rtol=1e-5)


def test_pallas_kernel_empty_sequence_and_bfloat16():
    q, k, v, tables, lens = _jax(*_cache(2, 4, 2, 16, 4, [0, 7]))
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
    out = paged_attention_pallas(q, k, v, tables, lens, scale=0.25, interpret=True)
    assert out.dtype == jnp.bfloat16
    expected = paged_attention_reference(q, k, v, tables, lens, scale=0.25)
    _close(out.astype(jnp.float32), expected.astype(jnp.float32), atol=1e-2, rtol=1e-2)
    assert not np.asarray(out[0].astype(jnp.float32)).any()  # (length 0: zeros)


def test_jax_tpu_kernel_matches_reference():
    """JAX's TPU kernel (the TPU path) runs on the CPU under TPU interpret mode."""
    inputs = _jax(*_cache(*CASES["two_kv_heads"]))
    expected = paged_attention_reference(*inputs, scale=0.25, softcap=3.0)
    with pltpu.force_tpu_interpret_mode():
        out = paged_attention_tpu(*inputs, scale=0.25, softcap=3.0)
    _close(out, expected, atol=1e-5, rtol=1e-5)


# --- the op ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "impl", "mode"),
    [("gqa", "auto", "eager"), ("two_kv_heads", "pallas", "fused")],
)
def test_op_matches_sdpa(case, impl, mode):
    inputs = _cache(*CASES[case])
    expected = _sdpa(*inputs, scale=0.3)
    with torch_pjrt.mode(mode):
        out = paged_attention(*(t.to("pjrt") for t in inputs), scale=0.3, impl=impl)
        assert out.device.type == "pjrt" and out.shape == inputs[0].shape
        torch.testing.assert_close(out.cpu(), expected)


def test_op_under_torch_compile_fullgraph():
    inputs = _cache(*CASES["gqa"])

    def f(q, k_pages, v_pages, tables, lens):
        return paged_attention(q * 2, k_pages, v_pages, tables, lens, impl="pallas") + 1

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="pjrt", fullgraph=True)
    out = compiled(*(t.to("pjrt") for t in inputs))
    q, *rest = inputs
    torch.testing.assert_close(out.cpu(), _sdpa(q * 2, *rest) + 1)


def test_cpu_tensors_run_the_reference():
    inputs = _cache(*CASES["mha"])
    torch.testing.assert_close(paged_attention(*inputs, softcap=None), _sdpa(*inputs))
    capped = paged_attention(*inputs, softcap=2.0)
    on_device = paged_attention(*(t.to("pjrt") for t in inputs), softcap=2.0)
    torch.testing.assert_close(on_device.cpu(), capped)


def test_asking_for_a_gradient_says_it_is_forward_only():
    q, *rest = _cache(*CASES["gqa"])
    qp = q.to("pjrt").requires_grad_()
    out = paged_attention(qp, *(t.to("pjrt") for t in rest))
    torch.testing.assert_close(out.detach().cpu(), _sdpa(q, *rest))  # the forward runs
    with pytest.raises(NotImplementedError, match="forward only"):  # (as PyTorch words it)
        out.sum().backward()


# --- keys and values side by side (pjrt's vLLM cache): paged_attention_kv ------------------


def _side_by_side(k_pages, v_pages):
    """vLLM's layout [N, block_size, Hkv, D] (keys, values) -> [N, Hkv, block_size, 2D]."""
    return torch.cat([k_pages, v_pages], dim=-1).transpose(1, 2).contiguous()


def _sdpa_lse(q, k_pages, tables, lens, scale, softcap=None):
    """The expected log-sum-exp of each query's scores over its contiguous keys."""
    block_size, hkv = k_pages.shape[1], k_pages.shape[2]
    rows = []
    for b, n in enumerate(lens.tolist()):
        blocks = tables[b, : -(-n // block_size)].long()
        k = k_pages[blocks].reshape(-1, hkv, k_pages.shape[-1])[:n]  # [n, Hkv, D]
        k = k.repeat_interleave(q.shape[1] // hkv, dim=1)  # [n, Hq, D]
        scores = torch.einsum("hd,nhd->hn", q[b], k) * scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        rows.append(torch.logsumexp(scores, dim=-1))  # (-inf for n == 0)
    return torch.stack(rows)


@pytest.mark.parametrize(("case", "softcap"), [("gqa", None), ("two_kv_heads", 2.0)])
def test_side_by_side_kernel_matches_reference_and_sdpa(case, softcap):
    """The Pallas kernel (interpreted) and the reference against SDPA's output and the
    scores' log-sum-exp; a sequence of length 0 gives zeros and -inf."""
    batch, hq, hkv, d, block_size, lens = CASES[case]
    lens = [0, *lens[1:]]
    q, k, v, tables, lens = _cache(batch, hq, hkv, d, block_size, lens)
    kv = _side_by_side(k, v)
    inputs = _jax(q, kv, tables, lens)
    expected = paged_attention_kv_reference(*inputs, scale=0.25, softcap=softcap)
    out, lse = paged_attention_kv_pallas(*inputs, scale=0.25, softcap=softcap, interpret=True)
    _close(out, expected[0], atol=1e-5, rtol=1e-5)
    _close(lse, expected[1], atol=1e-5, rtol=1e-5)
    assert not np.asarray(out[0]).any() and np.isneginf(np.asarray(lse[0])).all()
    want = paged_attention(q, k, v, tables, lens, scale=0.25, softcap=softcap)
    _close(out, want, atol=1e-5, rtol=1e-5)
    _close(lse, _sdpa_lse(q, k, tables, lens, 0.25, softcap), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("impl", "mode"), [("auto", "eager"), ("pallas", "fused")])
def test_side_by_side_op_on_pjrt_matches_cpu(impl, mode):
    """The op on pjrt tensors against its PyTorch reference on CPU tensors, which gives
    paged_attention's output on the other layout."""
    q, k, v, tables, lens = _cache(*CASES["two_kv_heads"])
    inputs = (q, _side_by_side(k, v), tables, lens)
    out, lse = paged_attention_kv(*inputs, scale=0.3, softcap=3.0)
    torch.testing.assert_close(out, paged_attention(q, k, v, tables, lens, scale=0.3, softcap=3.0))
    with torch_pjrt.mode(mode):
        on_pjrt = paged_attention_kv(*(t.to("pjrt") for t in inputs), scale=0.3, softcap=3.0)
        torch.testing.assert_close(on_pjrt[0].cpu(), out)
        torch.testing.assert_close(on_pjrt[1].cpu(), lse)
        assert on_pjrt[1].dtype == torch.float32


def test_side_by_side_bad_input_is_reported():
    q, k, v, tables, lens = _cache(*CASES["gqa"])
    kv = _side_by_side(k, v)
    bad = [
        ((q, kv[..., :16], tables, lens), "expected kv_pages of shape", ValueError),
        ((q, kv, tables[:1], lens), "expected block_tables of shape", ValueError),
        ((q, kv, tables, lens.float()), "expected integer context_lens", TypeError),
    ]
    for inputs, message, error in bad:
        with pytest.raises(error, match=message):
            paged_attention_kv(*(t.to("pjrt") for t in inputs))
        with pytest.raises(error, match=message):
            paged_attention_kv(*inputs)


# --- bad input ----------------------------------------------------------------------------


def _bad_inputs(what):
    q, k, v, tables, lens = _cache(*CASES["two_kv_heads"])
    if what == "table_batch":
        return (
            (q, k, v, tables[:1], lens),
            "expected block_tables of shape .B, max_blocks.",
            ValueError,
        )
    if what == "lens_batch":
        return (q, k, v, tables, lens[:1]), r"expected context_lens of shape \[2\]", ValueError
    if what == "gqa":
        return (
            (q[:, :3], k, v, tables, lens),
            r"query heads \(3\) must be a multiple of",
            ValueError,
        )
    if what == "float_table":
        return (q, k, v, tables.float(), lens), "expected integer block_tables", TypeError
    return (q, k, v[..., :8], tables, lens), "expected v_pages of k_pages' shape", ValueError


@pytest.mark.parametrize("what", ["table_batch", "lens_batch", "gqa", "float_table", "v_shape"])
def test_bad_input_is_reported(what):
    inputs, message, error = _bad_inputs(what)
    with pytest.raises(error, match=message):  # (the same error as on the CPU)
        paged_attention(*(t.to("pjrt") for t in inputs))
    with pytest.raises(error, match=message):
        paged_attention(*inputs)


def test_bad_impl_is_reported():
    inputs = [t.to("pjrt") for t in _cache(*CASES["gqa"])]
    with pytest.raises(ValueError, match="impl must be one of"):
        paged_attention(*inputs, impl="flash")
    with pytest.raises(ValueError, match="block_tables of shape"):  # (CPU: the reference)
        cpu = _cache(*CASES["gqa"])
        paged_attention(cpu[0], cpu[1], cpu[2], cpu[3][:1], cpu[4])
