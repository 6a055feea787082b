"""The kernel library's norms, ``pjrt::rms_norm`` and ``pjrt::layer_norm``.

The Pallas kernels (interpreted on the CPU platform) are checked against their plain-JAX
references, forward and backward, over several row blocks; the ops on pjrt tensors
against CPU PyTorch (``F.rms_norm``, ``F.layer_norm``) in every mode, through autograd
and under ``torch.compile``; bad parameters raise PyTorch's kind of error.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from torch_pjrt.kernels import layer_norm as ln
from torch_pjrt.kernels import rms_norm as rms


def _torch_rms_norm(x, weight=None, bias=None, *, eps=1e-6):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _torch_layer_norm(x, weight=None, bias=None, *, eps=1e-5):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def _op_rms_norm(x, weight=None, bias=None, **kw):
    return rms.rms_norm(x, weight, **kw)


def _jax_rms(fn):
    """An rms_norm function of JAX arrays, with layer_norm's (x, weight, bias)."""
    return lambda x, weight=None, bias=None, **kw: fn(x, weight, **kw)


class Norm:
    """One norm: its op, CPU PyTorch's function, its kernel and JAX reference."""

    def __init__(self, module, name, op, torch_fn, pallas, pallas_backward, reference, has_bias):
        self.name, self.op, self.torch_fn = name, op, torch_fn
        self.pallas, self.pallas_backward = pallas, pallas_backward
        self.reference, self.has_bias = reference, has_bias
        self.module = module

    def __repr__(self):
        return self.name


RMS = Norm(
    rms,
    "rms_norm",
    _op_rms_norm,
    _torch_rms_norm,
    _jax_rms(rms.rms_norm_pallas),
    lambda x, w, b, g, **kw: (*rms.rms_norm_pallas_backward(x, w, g, **kw), None),
    _jax_rms(rms.rms_norm_reference),
    has_bias=False,
)
LN = Norm(
    ln,
    "layer_norm",
    ln.layer_norm,
    _torch_layer_norm,
    ln.layer_norm_pallas,
    ln.layer_norm_pallas_backward,
    ln.layer_norm_reference,
    has_bias=True,
)
# (norm, weight given, bias given)
CASES = [
    (RMS, True, False),
    (RMS, False, False),
    (LN, True, True),
    (LN, True, False),
    (LN, False, True),
    (LN, False, False),
]
TOLERANCE = {torch.float32: {}, torch.bfloat16: {"atol": 5e-2, "rtol": 5e-2}}


@pytest.fixture(autouse=True)
def _no_cpu_fallback():
    """Nothing in these tests may leave the device: an op without a lowering raises."""
    with torch_pjrt.config(fallback="error"):
        yield


def _inputs(shape, weighted, biased, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    d = shape[-1]
    x = torch.randn(*shape, generator=g).to(dtype)
    w = (1 + 0.5 * torch.randn(d, generator=g)).to(dtype) if weighted else None
    b = torch.randn(d, generator=g).to(dtype) if biased else None
    return x, w, b


def _grads(fn, x, w, b, grad):
    """Output and gradients of fn(x, w, b) (None for a parameter not given)."""
    leaves = [t.detach().requires_grad_() if t is not None else None for t in (x, w, b)]
    out = fn(*leaves)
    wanted = [t for t in leaves if t is not None]
    found = iter(torch.autograd.grad(out, wanted, grad))
    return out.detach(), [next(found) if t is not None else None for t in leaves]


# --- the kernel against its reference, in JAX --------------------------------------------


# each norm with all its parameters in float32 and bfloat16 (computed in float32), and without
# (the ops' tests below run the kernel with every combination of parameters)
KERNEL_CASES = [(*CASES[i], dtype) for i in (0, 2) for dtype in (jnp.float32, jnp.bfloat16)]
KERNEL_CASES += [(*CASES[1], jnp.float32), (*CASES[5], jnp.float32)]


@pytest.mark.parametrize(("norm", "weighted", "biased", "dtype"), KERNEL_CASES, ids=repr)
def test_pallas_matches_the_reference(norm, weighted, biased, dtype, monkeypatch):
    monkeypatch.setattr(norm.module, "_BLOCK_BYTES", 8 * 32 * 4)  # blocks of 8 rows, 21 rows
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((3, 7, 32)), dtype)
    w = jnp.asarray(1 + 0.5 * rng.standard_normal(32), dtype) if weighted else None
    b = jnp.asarray(rng.standard_normal(32), dtype) if biased else None
    g = jnp.asarray(rng.standard_normal((3, 7, 32)), dtype)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == jnp.float32 else {"atol": 3e-2, "rtol": 3e-2}

    out = norm.pallas(x, w, b)
    assert out.dtype == dtype
    np.testing.assert_allclose(np.float32(out), np.float32(norm.reference(x, w, b)), **tol)
    given = [p for p in (w, b) if p is not None]

    def of(x, *params):
        found = iter(params)
        return norm.reference(x, *[next(found) if p is not None else None for p in (w, b)])

    expected = iter(jax.vjp(of, x, *given)[1](g))
    for got, p in zip(norm.pallas_backward(x, w, b, g), (x, w, b)):
        if p is None:
            assert got is None
            continue
        assert got.dtype == p.dtype and got.shape == p.shape
        np.testing.assert_allclose(np.float32(got), np.float32(next(expected)), **tol)


# --- the op on pjrt tensors against CPU PyTorch -------------------------------------------


# the reference path (auto, on the CPU platform) in both dtypes for every case; the
# interpreted kernel in float32 for every case, in bfloat16 with all parameters
OP_CASES = [(*c, dtype, "auto") for c in CASES for dtype in (torch.float32, torch.bfloat16)]
OP_CASES += [(*c, torch.float32, "pallas") for c in CASES]
OP_CASES += [
    (RMS, True, False, torch.bfloat16, "pallas"),
    (LN, True, True, torch.bfloat16, "pallas"),
]


@pytest.mark.parametrize(("norm", "weighted", "biased", "dtype", "impl"), OP_CASES, ids=repr)
def test_op_matches_cpu_pytorch(norm, weighted, biased, dtype, impl):
    x, w, b = _inputs((2, 5, 32), weighted, biased, dtype)
    grad = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(1)).to(dtype)
    expected, expected_grads = _grads(norm.torch_fn, x, w, b, grad)

    def on_device(x, w, b):
        return norm.op(x, w, b, impl=impl) if norm.has_bias else norm.op(x, w, impl=impl)

    moved = [t.to("pjrt") if t is not None else None for t in (x, w, b)]
    out, grads = _grads(on_device, *moved, grad.to("pjrt"))
    assert out.device.type == "pjrt" and out.dtype == dtype
    torch.testing.assert_close(out.cpu(), expected, **TOLERANCE[dtype])
    for got, want in zip(grads, expected_grads):
        assert (got is None) == (want is None)
        if want is not None:
            torch.testing.assert_close(got.cpu(), want, **TOLERANCE[dtype])


@pytest.mark.parametrize("mode", ["debug", "eager", "fused"])
@pytest.mark.parametrize("norm", [RMS, LN], ids=repr)
def test_every_mode(norm, mode):
    x, w, b = _inputs((4, 16), True, norm.has_bias)
    args = [t.to("pjrt") for t in (x, w, b) if t is not None]
    with torch_pjrt.mode(mode):
        out = (norm.op(*args, impl="pallas") * 2).cpu()
    torch.testing.assert_close(out, norm.torch_fn(x, w, b) * 2)


@pytest.mark.parametrize("norm", [RMS, LN], ids=repr)
def test_cpu_tensors_run_pytorch(norm):
    x, w, b = _inputs((3, 16), True, norm.has_bias)
    args = [t for t in (x, w, b) if t is not None]
    torch.testing.assert_close(norm.op(*args), norm.torch_fn(x, w, b))
    grad = torch.randn(3, 16)
    _, got = _grads(norm.op, x, w, b, grad)
    _, want = _grads(norm.torch_fn, x, w, b, grad)
    for g, e in zip(got, want):
        if e is not None:
            torch.testing.assert_close(g, e)


# --- torch.compile -----------------------------------------------------------------------


@pytest.mark.parametrize(("norm", "weighted", "biased"), [CASES[1], CASES[2]], ids=repr)
def test_compiled_forward_and_backward(norm, weighted, biased, programs):
    x, w, b = _inputs((2, 3, 16), weighted, biased)
    grad = torch.randn(2, 3, 16)
    impl = functools.partial(norm.op, impl="pallas")

    def fn(x, w, b):
        return (impl(x, w, b) if norm.has_bias else impl(x, w)).sin()

    compiled = torch.compile(fn, backend="pjrt", fullgraph=True)
    moved = [t.to("pjrt") if t is not None else None for t in (x, w, b)]
    out, grads = _grads(compiled, *moved, grad.to("pjrt"))
    expected, expected_grads = _grads(lambda *a: norm.torch_fn(*a).sin(), x, w, b, grad)
    torch.testing.assert_close(out.cpu(), expected)
    for got, want in zip(grads, expected_grads):
        if want is not None:
            torch.testing.assert_close(got.cpu(), want)
    assert programs == ["forward", "backward"]  # the kernels are in the graphs' programs


def test_compiled_inference_is_one_program(programs):
    x, w, b = _inputs((4, 16), True, True)
    compiled = torch.compile(
        lambda x, w, b: rms.rms_norm(ln.layer_norm(x, w, b), w) * 2,
        backend="pjrt",
        fullgraph=True,
    )
    out = compiled(x.to("pjrt"), w.to("pjrt"), b.to("pjrt"))
    torch.testing.assert_close(out.cpu(), _torch_rms_norm(_torch_layer_norm(x, w, b), w) * 2)
    assert programs == ["inference"]


# --- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["pjrt", "cpu"])
@pytest.mark.parametrize("norm", [RMS, LN], ids=repr)
def test_weight_of_the_wrong_shape(norm, device):
    x = torch.randn(4, 8, device=device)
    with pytest.raises(
        RuntimeError, match=r"expected weight of shape \[8\].*got weight of shape \[7\]"
    ):
        norm.op(x, torch.ones(7, device=device)).cpu()


@pytest.mark.parametrize("device", ["pjrt", "cpu"])
def test_bias_of_the_wrong_shape(device):
    x = torch.randn(4, 8, device=device)
    with pytest.raises(
        RuntimeError, match=r"expected bias of shape \[8\].*got bias of shape \[2, 4\]"
    ):
        ln.layer_norm(x, None, torch.ones(2, 4, device=device)).cpu()


@pytest.mark.parametrize("norm", [RMS, LN], ids=repr)
def test_unknown_impl(norm):
    with pytest.raises(ValueError, match=r"impl must be one of .*got 'triton'"):
        norm.op(torch.randn(2, 8, device="pjrt"), impl="triton").cpu()


def test_schemas():
    assert str(rms.rms_norm.default._schema) == (
        "pjrt::rms_norm(Tensor x, Tensor? weight=None, *, float eps=9.9999999999999995e-07, "
        'str impl="auto") -> Tensor'
    )
    assert str(ln.layer_norm.default._schema).startswith(
        "pjrt::layer_norm(Tensor x, Tensor? weight=None, Tensor? bias=None, *, float eps="
    )
    assert rms.rms_norm is torch.ops.pjrt.rms_norm
    assert torch_pjrt.kernels.definition("pjrt::layer_norm_weight_bias").backward_op is not None
