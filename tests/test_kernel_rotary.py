"""The kernel library's rotary position embedding, ``pjrt::rotary_embedding``.

The Pallas kernel (interpreted on the CPU platform) is checked against its plain-JAX
reference, forward and backward; the op on pjrt tensors against Hugging Face's formulas
written in PyTorch (Llama's ``apply_rotary_pos_emb`` with ``rotate_half``, GPT-J's
interleaved pairs), through autograd and under ``torch.compile``; bad shapes raise
PyTorch's kind of error.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_pjrt
from torch_pjrt.kernels import rotary
from torch_pjrt.kernels.rotary import rotary_embedding

B, H, S, D = 2, 2, 20, 16


@pytest.fixture(autouse=True)
def _no_cpu_fallback():
    """Nothing in these tests may leave the device: an op without a lowering raises."""
    with torch_pjrt.config(fallback="error"):
        yield


# --- Hugging Face's formulas, in PyTorch ---------------------------------------------


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, cos, sin, unsqueeze_dim=1):
    """Llama's, for q of shape [B, H, S, D] and cos, sin of shape [B, S, D]."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin)


def rotate_every_two(x):
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def apply_rotary_pos_emb_gptj(q, cos, sin):
    """GPT-J's interleaved pairs, for q of shape [B, H, S, D]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (q * cos) + (rotate_every_two(q) * sin)


def cos_sin(interleaved, batch=B, dtype=torch.float32, base=10000.0):
    """The tables Hugging Face's rotary embeddings make, for positions 0..S-1 (shifted per
    batch row, so rows differ): [batch, S, D]."""
    inv_freq = 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
    positions = torch.arange(S, dtype=torch.float32)[None] + 3 * torch.arange(batch)[:, None]
    freqs = positions[..., None] * inv_freq
    emb = freqs.repeat_interleave(2, -1) if interleaved else torch.cat((freqs, freqs), -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


HF = {False: apply_rotary_pos_emb, True: apply_rotary_pos_emb_gptj}
TOLERANCE = {torch.float32: {}, torch.bfloat16: {"atol": 3e-2, "rtol": 3e-2}}


def _grads(fn, tensors, grad):
    leaves = [t.detach().requires_grad_() for t in tensors]
    out = fn(*leaves)
    return out.detach(), torch.autograd.grad(out, leaves, grad)


# --- the kernel against its reference, in JAX --------------------------------------------


@pytest.mark.parametrize(
    ("table", "dtype", "interleaved"),
    [
        ((S, D), jnp.float32, False),
        ((B, S, D), jnp.float32, True),
        ((1, S, D), jnp.bfloat16, False),
        ((B, S, D), jnp.bfloat16, True),
    ],
)
def test_pallas_matches_the_reference(table, dtype, interleaved, monkeypatch):
    monkeypatch.setattr(rotary, "_BLOCK_BYTES", 8 * D * 4)  # blocks of 8 positions, 20 of them
    rng = np.random.default_rng(0)
    x, g = (jnp.asarray(rng.standard_normal((B, H, S, D)), dtype) for _ in range(2))
    cos, sin = (jnp.asarray(rng.standard_normal(table), dtype) for _ in range(2))
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == jnp.float32 else {"atol": 3e-2, "rtol": 3e-2}

    out = rotary.rotary_embedding_pallas(x, cos, sin, interleaved=interleaved)
    expected = rotary.rotary_embedding_reference(x, cos, sin, interleaved=interleaved)
    assert out.dtype == dtype
    np.testing.assert_allclose(np.float32(out), np.float32(expected), **tol)
    got = rotary.rotary_embedding_pallas_backward(x, cos, sin, g, interleaved=interleaved)
    _, pullback = jax.vjp(
        lambda *a: rotary.rotary_embedding_reference(*a, interleaved=interleaved), x, cos, sin
    )
    for a, e, p in zip(got, pullback(g), (x, cos, sin)):
        assert a.shape == p.shape and a.dtype == p.dtype
        np.testing.assert_allclose(np.float32(a), np.float32(e), **tol)


# --- the op on pjrt tensors against Hugging Face's formulas ------------------------------


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize(
    ("dtype", "impl"),
    [(torch.float32, "auto"), (torch.float32, "pallas"), (torch.bfloat16, "pallas")],
)
def test_op_matches_hugging_face(interleaved, dtype, impl):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, H, S, D, generator=g).to(dtype)
    grad = torch.randn(B, H, S, D, generator=g).to(dtype)
    cos, sin = cos_sin(interleaved, dtype=dtype)
    expected, expected_grads = _grads(HF[interleaved], (x, cos, sin), grad)

    def on_device(x, cos, sin):
        return rotary_embedding(x, cos, sin, interleaved=interleaved, impl=impl)

    moved = [t.to("pjrt") for t in (x, cos, sin)]
    out, grads = _grads(on_device, moved, grad.to("pjrt"))
    assert out.device.type == "pjrt" and out.dtype == dtype
    torch.testing.assert_close(out.cpu(), expected, **TOLERANCE[dtype])
    for got, want in zip(grads, expected_grads):  # dx, and cos's and sin's true gradients
        torch.testing.assert_close(got.cpu(), want, **TOLERANCE[dtype])


def test_tables_shared_by_the_batch():
    """cos, sin of shape [S, D]: broadcast over batch and heads; their gradient summed."""
    x, grad = torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    cos, sin = (t[0] for t in cos_sin(False, batch=1))
    expected, expected_grads = _grads(
        lambda x, c, s: apply_rotary_pos_emb(x, c[None].expand(B, S, D), s[None].expand(B, S, D)),
        (x, cos, sin),
        grad,
    )
    out, grads = _grads(
        lambda *a: rotary_embedding(*a, impl="pallas"),
        [t.to("pjrt") for t in (x, cos, sin)],
        grad.to("pjrt"),
    )
    torch.testing.assert_close(out.cpu(), expected)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got.cpu(), want)


def test_cpu_tensors_run_pytorch():
    x, grad = torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    cos, sin = cos_sin(True)
    out, grads = _grads(lambda *a: rotary_embedding(*a, interleaved=True), (x, cos, sin), grad)
    expected, expected_grads = _grads(apply_rotary_pos_emb_gptj, (x, cos, sin), grad)
    torch.testing.assert_close(out, expected)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want)


# --- torch.compile -----------------------------------------------------------------------


def test_compiled_forward_and_backward(programs):
    x, grad = torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    cos, sin = cos_sin(False)

    def fn(q, cos, sin):
        return rotary_embedding(q * 2, cos, sin, impl="pallas").tanh()

    compiled = torch.compile(fn, backend="pjrt", fullgraph=True)
    out, grads = _grads(compiled, [t.to("pjrt") for t in (x, cos, sin)], grad.to("pjrt"))
    expected, expected_grads = _grads(
        lambda q, c, s: apply_rotary_pos_emb(q * 2, c, s).tanh(), (x, cos, sin), grad
    )
    torch.testing.assert_close(out.cpu(), expected)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got.cpu(), want)
    assert programs == ["forward", "backward"]  # the kernel is in the graphs' programs


# --- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["pjrt", "cpu"])
@pytest.mark.parametrize(
    ("x_shape", "cos_shape", "sin_shape", "message"),
    [
        ((B, H, S, D), (S, D // 2), (S, D), r"expected cos of shape \[20, 16\] or \[2, 20, 16\]"),
        (
            (B, H, S, D),
            (B, S, D),
            (S + 1, D),
            r"expected sin of shape .* got sin of shape \[21, 16\]",
        ),
        ((B, H, S, D), (1, S, D), (S, D), r"expected cos and sin of the same shape"),
        ((B, S, D), (S, D), (S, D), r"expected x of shape \[batch, heads, seq, head_dim\]"),
    ],
    ids=["cos", "sin", "mismatch", "rank"],
)
def test_tables_of_the_wrong_shape(device, x_shape, cos_shape, sin_shape, message):
    x = torch.randn(*x_shape, device=device)
    cos, sin = torch.randn(*cos_shape, device=device), torch.randn(*sin_shape, device=device)
    with pytest.raises(RuntimeError, match=message):
        rotary_embedding(x, cos, sin).cpu()


def test_schema():
    assert rotary_embedding is torch.ops.pjrt.rotary_embedding
    assert str(rotary_embedding.default._schema) == (
        "pjrt::rotary_embedding(Tensor x, Tensor cos, Tensor sin, *, bool interleaved=False, "
        'str impl="auto") -> Tensor'
    )
