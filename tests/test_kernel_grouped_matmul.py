"""pjrt::grouped_matmul: each group of lhs's rows times its own rhs matrix (MoE).

Checked against CPU PyTorch and the plain JAX reference, forward and backward (d_lhs,
d_rhs), with empty groups, on both paths: ragged_dot and megablox (JAX's Pallas TPU
kernels, in interpret mode on the CPU); in every mode, under torch.compile, and that bad
group sizes and shapes say what was wrong.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_pjrt
from torch_pjrt.kernels.grouped_matmul import grouped_matmul, grouped_matmul_reference

SIZES = [0, 7, 0, 13, 12]  # empty groups first, between and (below) last; M = 32


@pytest.fixture(autouse=True)
def _no_cpu_fallback():
    """Nothing in these tests may leave the device: an op without a lowering raises."""
    with torch_pjrt.config(fallback="error"):
        yield


def _case(sizes=SIZES, k=24, n=40, *, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = sum(sizes)
    lhs = torch.randn(m, k, generator=g)
    rhs = torch.randn(len(sizes), k, n, generator=g)
    return lhs, rhs, torch.tensor(sizes), torch.randn(m, n, generator=g)


def _expected(lhs, rhs, sizes, grad):
    """A loop over the groups in CPU PyTorch: the output and (d_lhs, d_rhs)."""
    lhs, rhs = lhs.clone().requires_grad_(), rhs.clone().requires_grad_()
    out = torch.cat([rows @ w for rows, w in zip(lhs.split(sizes.tolist()), rhs)])
    return out.detach(), torch.autograd.grad(out, (lhs, rhs), grad)


def _on_pjrt(lhs, rhs, sizes, grad, **kw):
    lhs, rhs = lhs.to("pjrt").requires_grad_(), rhs.to("pjrt").requires_grad_()
    out = grouped_matmul(lhs, rhs, sizes.to("pjrt"), **kw)
    grads = torch.autograd.grad(out, (lhs, rhs), grad.to("pjrt"))
    return out.detach().cpu(), [g.cpu() for g in grads]


def _check(got, expected):
    torch.testing.assert_close(got[0], expected[0])
    for g, e in zip(got[1], expected[1]):
        torch.testing.assert_close(g, e)


# --- values and gradients ---------------------------------------------------------------


@pytest.mark.parametrize("impl", ["auto", "ragged_dot", "megablox"])
def test_matches_cpu_forward_and_backward(impl):
    lhs, rhs, sizes, grad = _case(SIZES + [0])
    _check(_on_pjrt(lhs, rhs, sizes, grad, impl=impl), _expected(lhs, rhs, sizes, grad))


@pytest.mark.parametrize("mode", ["debug", "eager", "fused"])
def test_every_mode(mode):
    lhs, rhs, sizes, grad = _case([3, 0, 5], k=8, n=6, seed=1)
    with torch_pjrt.mode(mode):
        got = _on_pjrt(lhs, rhs, sizes, grad)
    _check(got, _expected(lhs, rhs, sizes, grad))


def test_ragged_dot_matches_the_jax_reference():
    lhs, rhs, sizes, grad = (jnp.asarray(t.numpy()) for t in _case())

    @jax.jit
    def both(lhs, rhs, grad):
        def ragged(a, b):
            return jax.lax.ragged_dot(a, b, sizes.astype(jnp.int32))

        def reference(a, b):
            return grouped_matmul_reference(a, b, sizes)

        out, pullback = jax.vjp(ragged, lhs, rhs)
        ref, ref_pullback = jax.vjp(reference, lhs, rhs)
        return (out, *pullback(grad)), (ref, *ref_pullback(grad))

    got, expected = both(lhs, rhs, grad)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-4)


def test_bfloat16():
    lhs, rhs, sizes, grad = _case([5, 11], k=8, n=4)
    lhs, rhs, grad = lhs.bfloat16(), rhs.bfloat16(), grad.bfloat16()
    out, grads = _on_pjrt(lhs, rhs, sizes, grad, impl="ragged_dot")
    assert out.dtype == grads[0].dtype == grads[1].dtype == torch.bfloat16
    expected = _expected(lhs.float(), rhs.float(), sizes, grad.float())
    torch.testing.assert_close(out.float(), expected[0], rtol=2e-2, atol=5e-2)


def test_cpu_tensors_run_the_reference():
    lhs, rhs, sizes, grad = _case()
    expected, _ = _expected(lhs, rhs, sizes, grad)
    torch.testing.assert_close(grouped_matmul(lhs, rhs, sizes), expected)


def test_compiled_fullgraph_forward_and_backward():
    lhs, rhs, sizes, grad = _case([4, 0, 6, 2], k=8, n=8, seed=2)

    def f(a, b, s):
        return grouped_matmul(torch.relu(a), b, s) * 3

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="pjrt", fullgraph=True)
    lp, rp = lhs.to("pjrt").requires_grad_(), rhs.to("pjrt").requires_grad_()
    out = compiled(lp, rp, sizes.to("pjrt"))
    out.backward(grad.to("pjrt"))
    lc, rc = lhs.clone().requires_grad_(), rhs.clone().requires_grad_()
    expected = torch.cat([x @ w for x, w in zip(torch.relu(lc).split(sizes.tolist()), rc)]) * 3
    expected.backward(grad)
    torch.testing.assert_close(out.detach().cpu(), expected.detach())
    torch.testing.assert_close(lp.grad.cpu(), lc.grad)
    torch.testing.assert_close(rp.grad.cpu(), rc.grad)


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sizes, match",
    [
        ([3, 0, 4], "group_sizes sum to 7, but lhs has 8 rows"),
        ([3, 0, 6], "group_sizes sum to 9, but lhs has 8 rows"),
        ([9, -1, 0], "group_sizes must be non-negative, got -1"),
    ],
)
def test_bad_group_sizes_raise_at_the_next_sync(sizes, match):
    lhs, rhs, _, _ = _case([8, 0, 0], k=4, n=4)
    out = grouped_matmul(lhs.to("pjrt"), rhs.to("pjrt"), torch.tensor(sizes, device="pjrt"))
    with pytest.raises(RuntimeError, match=match):
        out.cpu()
    with pytest.raises(RuntimeError, match="group_sizes"):  # the CPU reference says so too
        grouped_matmul(lhs, rhs, torch.tensor(sizes))


@pytest.mark.parametrize(
    "change, kw, error, match",
    [
        ("k", {}, ValueError, r"cannot be multiplied: lhs has K=4 columns, rhs\[g\] K=5 rows"),
        ("groups", {}, ValueError, "group_sizes has 2 groups but rhs has 3"),
        ("float_sizes", {}, TypeError, "group_sizes must be integers"),
        ("rows", {"impl": "megablox"}, ValueError, "needs M .* a multiple of 8, got 7"),
        ("none", {"impl": "pallas"}, ValueError, "impl must be one of"),
    ],
)
def test_bad_input_names_what_was_wrong(change, kw, error, match):
    lhs, rhs, sizes, _ = _case([3, 0, 5], k=4, n=4)
    if change == "k":
        rhs = torch.randn(3, 5, 4)
    elif change == "groups":
        sizes = torch.tensor([3, 5])
    elif change == "float_sizes":
        sizes = sizes.float()
    elif change == "rows":
        lhs, sizes = lhs[:7], torch.tensor([3, 0, 4])
    with pytest.raises(error, match=match) as info:  # (the kernel's own error, as it is)
        grouped_matmul(lhs.to("pjrt"), rhs.to("pjrt"), sizes.to("pjrt"), **kw)
    assert "pjrt kernel pjrt::grouped_matmul" in "".join(getattr(info.value, "__notes__", []))
