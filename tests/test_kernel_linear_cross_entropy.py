"""pjrt::linear_cross_entropy: F.cross_entropy(hidden @ weight.T) without the [N, V] logits.

Checked against CPU PyTorch and the plain JAX reference, forward and backward, for each
reduction, with ignored rows and chunks that do not divide the rows; in every mode and
under torch.compile; and that the compiled forward and backward hold a chunk's logits,
not all of them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from torch_pjrt.kernels.linear_cross_entropy import (
    chunked_linear_cross_entropy,
    chunked_linear_cross_entropy_grads,
    linear_cross_entropy,
    linear_cross_entropy_bias,
    linear_cross_entropy_reference,
)

REDUCTIONS = ("mean", "sum", "none")


@pytest.fixture(autouse=True)
def _no_cpu_fallback():
    """Nothing in these tests may leave the device: an op without a lowering raises."""
    with torch_pjrt.config(fallback="error"):
        yield


def _case(n=37, d=16, v=50, *, seed=0, bias=False):
    """hidden, weight, target (every fifth row ignored) and bias (or None), on the CPU."""
    g = torch.Generator().manual_seed(seed)
    hidden, weight = torch.randn(n, d, generator=g), torch.randn(v, d, generator=g)
    target = torch.randint(0, v, (n,), generator=g)
    target[::5] = -100
    return hidden, weight, target, torch.randn(v, generator=g) if bias else None


def _expected(hidden, weight, target, bias, grad, **kw):
    """CPU PyTorch's loss and gradients (hidden, weight, bias)."""
    leaves = [
        t.clone().requires_grad_() for t in (hidden, weight) + ((bias,) if bias is not None else ())
    ]
    loss = F.cross_entropy(F.linear(*leaves[:2], *leaves[2:]), target, **kw)
    return loss.detach(), torch.autograd.grad(loss, leaves, grad)


def _on_pjrt(hidden, weight, target, bias, grad, **kw):
    leaves = [
        t.to("pjrt").requires_grad_()
        for t in (hidden, weight) + ((bias,) if bias is not None else ())
    ]
    if bias is None:
        loss = linear_cross_entropy(*leaves, target.to("pjrt"), **kw)
    else:
        loss = linear_cross_entropy_bias(*leaves[:2], target.to("pjrt"), leaves[2], **kw)
    grads = torch.autograd.grad(loss, leaves, grad.to("pjrt"))
    return loss.detach().cpu(), [g.cpu() for g in grads]


def _check(got, expected):
    torch.testing.assert_close(got[0], expected[0], equal_nan=True)
    for g, e in zip(got[1], expected[1]):
        torch.testing.assert_close(g, e)


# --- values and gradients ---------------------------------------------------------------


@pytest.mark.parametrize(
    "reduction, bias", [(r, False) for r in REDUCTIONS] + [("none", True)], ids=str
)
def test_matches_cpu_forward_and_backward(reduction, bias):
    hidden, weight, target, b = _case(bias=bias)
    grad = torch.randn(hidden.shape[0]) if reduction == "none" else torch.tensor(1.7)
    got = _on_pjrt(hidden, weight, target, b, grad, reduction=reduction, chunk_size=8)
    _check(got, _expected(hidden, weight, target, b, grad, reduction=reduction))


@pytest.mark.parametrize("mode", ["debug", "eager", "fused"])
def test_every_mode(mode):
    hidden, weight, target, _ = _case(n=20, seed=1)
    target[target == -100] = 7  # ignore_index 7: a class index, ignored
    kw = {"reduction": "mean", "ignore_index": 7}
    with torch_pjrt.mode(mode):
        got = _on_pjrt(hidden, weight, target, None, torch.tensor(1.0), chunk_size=6, **kw)
    _check(got, _expected(hidden, weight, target, None, torch.tensor(1.0), **kw))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_chunked_jax_matches_the_jax_reference(reduction):
    hidden, weight, target, bias = (jnp.asarray(t.numpy()) for t in _case(n=21, bias=True))
    grad = jnp.linspace(0.5, 2.0, 21) if reduction == "none" else jnp.float32(0.9)
    kw = {"reduction": reduction}

    @jax.jit
    def both(hidden, weight, target, bias, grad):
        loss = chunked_linear_cross_entropy(hidden, weight, target, bias, chunk_size=4, **kw)
        grads = chunked_linear_cross_entropy_grads(
            hidden, weight, target, bias, grad, chunk_size=4, **kw
        )
        ref, pullback = jax.vjp(
            lambda h, w, b: linear_cross_entropy_reference(h, w, target, b, **kw),
            hidden,
            weight,
            bias,
        )
        return (loss, *grads), (ref, *pullback(grad))

    got, expected = both(hidden, weight, target, bias, grad)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_every_row_ignored_gives_nan_mean_and_zero_gradients():
    hidden, weight, target, _ = _case(n=6)
    target[:] = -100
    got = _on_pjrt(hidden, weight, target, None, torch.tensor(1.0))
    assert torch.isnan(got[0])  # (0 / 0, as PyTorch)
    _check(got, _expected(hidden, weight, target, None, torch.tensor(1.0)))


def test_bfloat16_inputs_accumulate_in_float32():
    hidden, weight, target, _ = _case(n=12, v=40)
    hidden, weight = hidden.bfloat16(), weight.bfloat16()
    loss, grads = _on_pjrt(hidden, weight, target, None, torch.tensor(1.0), chunk_size=5)
    assert loss.dtype == grads[0].dtype == grads[1].dtype == torch.bfloat16
    expected = _expected(hidden.float(), weight.float(), target, None, torch.tensor(1.0))
    torch.testing.assert_close(loss.float(), expected[0], rtol=1e-2, atol=1e-2)
    for g, e in zip(grads, expected[1]):
        torch.testing.assert_close(g.float(), e, rtol=2e-2, atol=2e-2)


def test_cpu_tensors_run_the_reference():
    hidden, weight, target, bias = _case(bias=True)
    out = linear_cross_entropy_bias(hidden, weight, target, bias, reduction="sum")
    torch.testing.assert_close(
        out, F.cross_entropy(F.linear(hidden, weight, bias), target, reduction="sum")
    )


# --- torch.compile -------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_compiled_fullgraph_forward_and_backward(reduction):
    hidden, weight, target, _ = _case(n=19, seed=2)

    def f(h, w, t):
        loss = linear_cross_entropy(torch.tanh(h), w, t, reduction=reduction, chunk_size=8)
        return loss.sum() * 2

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="pjrt", fullgraph=True)
    hp, wp = hidden.to("pjrt").requires_grad_(), weight.to("pjrt").requires_grad_()
    loss = compiled(hp, wp, target.to("pjrt"))
    loss.backward()
    hc, wc = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    expected = F.cross_entropy(torch.tanh(hc) @ wc.T, target, reduction=reduction).sum() * 2
    expected.backward()
    torch.testing.assert_close(loss.detach().cpu(), expected.detach())
    torch.testing.assert_close(hp.grad.cpu(), hc.grad)
    torch.testing.assert_close(wp.grad.cpu(), wc.grad)


# --- memory: a chunk's logits, never all N x V --------------------------------------------


def _temp_bytes(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_compiled_programs_never_hold_the_full_logits():
    """Lowered and compiled only (nothing runs): N x V logits would be 256 MiB."""
    n, v, d = 2048, 32768, 64
    spec = jax.ShapeDtypeStruct
    args = (spec((n, d), jnp.float32), spec((v, d), jnp.float32), spec((n,), jnp.int32))
    full = n * v * 4
    forward = _temp_bytes(lambda h, w, t: chunked_linear_cross_entropy(h, w, t), *args)
    backward = _temp_bytes(
        lambda h, w, t, g: chunked_linear_cross_entropy_grads(h, w, t, None, g),
        *args,
        spec((), jnp.float32),
    )
    reference = _temp_bytes(jax.value_and_grad(linear_cross_entropy_reference, (0, 1)), *args)
    # a chunk of 128 rows' logits is 16 MiB; the backward adds d_weight's float32 sum (8 MiB)
    assert forward < full / 8, forward
    assert backward < full / 8, backward
    assert reference >= full, reference  # (the reference does hold them: the test can tell)


# --- bad input ------------------------------------------------------------------------------


def test_target_out_of_range_raises_pytorchs_error_at_the_next_sync():
    hidden, weight, target, _ = _case(n=8, v=10)
    target[2] = 10
    loss = linear_cross_entropy(hidden.to("pjrt"), weight.to("pjrt"), target.to("pjrt"))
    with pytest.raises(IndexError, match="Target 10 is out of bounds"):
        loss.cpu()
    with pytest.raises(IndexError, match="Target 10 is out of bounds"):
        F.cross_entropy(hidden @ weight.T, target)  # (CPU PyTorch's own)


@pytest.mark.parametrize(
    "change, kw, error, match",
    [
        ("transpose_weight", {}, ValueError, r"different sizes D .*pass weight, not weight.T"),
        (
            "short_target",
            {},
            ValueError,
            r"Expected input batch_size \(8\) to match target batch_size \(7\)",
        ),
        ("float_target", {}, TypeError, "target must hold integer class indices"),
        ("none", {"reduction": "avg"}, ValueError, "avg is not a valid value for reduction"),
        (
            "none",
            {"chunk_size": 0},
            ValueError,
            "chunk_size is a number of rows and must be positive",
        ),
    ],
)
def test_bad_input_names_what_was_wrong(change, kw, error, match):
    hidden, weight, target, _ = _case(n=8, d=4, v=10)
    if change == "transpose_weight":
        weight = weight.T.contiguous()
    elif change == "short_target":
        target = target[:7]
    elif change == "float_target":
        target = target.float()
    with pytest.raises(error, match=match):  # (the kernel's own error, as it is)
        linear_cross_entropy(hidden.to("pjrt"), weight.to("pjrt"), target.to("pjrt"), **kw)


def test_bias_of_the_wrong_size_names_its_shape():
    hidden, weight, target, _ = _case(n=8, d=4, v=10)
    with pytest.raises(ValueError, match=r"bias must have shape \[V\] = \[10\]"):
        linear_cross_entropy_bias(
            hidden.to("pjrt"), weight.to("pjrt"), target.to("pjrt"), torch.zeros(9, device="pjrt")
        )
