"""JAX interop: ``torch_pjrt.to_jax`` / ``from_jax`` hand data over without a device
copy (the same buffer on both sides), keep the aliasing rule of docs/device_api.md, and
let a JAX function with its own VJP sit inside a PyTorch training step (gradients
checked against the same step on the CPU); DLPack for pjrt tensors: JAX and NumPy take
them without a copy, and torch's own DLPack round trip gives a tensor sharing the
storage."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_pjrt


def _pointer(a: jax.Array) -> int:
    return a.addressable_shards[0].data.unsafe_buffer_pointer()


def test_to_jax_is_the_tensors_buffer():
    t = torch.arange(12.0, device="pjrt").reshape(3, 4) * 2
    a = torch_pjrt.to_jax(t)
    assert isinstance(a, jax.Array) and a.shape == (3, 4) and a.dtype == jnp.float32
    assert _pointer(a) == _pointer(torch_pjrt.to_jax(t))  # no copy either time
    np.testing.assert_array_equal(np.asarray(a), (torch.arange(12.0).reshape(3, 4) * 2).numpy())
    # a view is gathered into an array of its own (its value, not the storage's)
    np.testing.assert_array_equal(np.asarray(torch_pjrt.to_jax(t[:, 1])), [2.0, 10.0, 18.0])
    # the handed-over array keeps its value; the write is in the tensor
    t.add_(1)
    assert float(a[0, 0]) == 0.0 and t[0, 0].item() == 1.0


def test_from_jax_holds_the_array():
    b = jnp.full((2, 3), 2.0, dtype=jnp.bfloat16)
    u = torch_pjrt.from_jax(b)
    assert u.device == torch.device("pjrt", 0) and u.dtype == torch.bfloat16
    assert u.shape == (2, 3) and _pointer(torch_pjrt.to_jax(u)) == _pointer(b)
    u.mul_(3)
    assert torch.equal(u.cpu(), torch.full((2, 3), 6.0, dtype=torch.bfloat16))
    assert float(b[0, 0]) == 2.0  # JAX's array is as it was, and still alive
    on_second = jax.device_put(jnp.arange(3), torch_pjrt.runtime.devices()[1])
    assert torch_pjrt.from_jax(on_second).device == torch.device("pjrt", 1)


def test_a_jax_function_inside_a_training_step():
    class JaxGelu(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y, ctx.vjp = jax.vjp(jax.nn.gelu, torch_pjrt.to_jax(x.detach()))
            return torch_pjrt.from_jax(y)

        @staticmethod
        def backward(ctx, grad):
            (dx,) = ctx.vjp(torch_pjrt.to_jax(grad))
            return torch_pjrt.from_jax(dx)

    def step(device, gelu):
        torch.manual_seed(0)
        first, second = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)
        model = torch.nn.ModuleList([first, second]).to(device)
        x = torch.randn(4, 8).to(device)
        loss = second(gelu(first(x))).square().mean()
        loss.backward()
        return loss.detach().cpu(), [p.grad.cpu() for p in model.parameters()]

    got_loss, got = step("pjrt", JaxGelu.apply)
    want_loss, want = step("cpu", lambda x: torch.nn.functional.gelu(x, approximate="tanh"))
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-6)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_dlpack():
    t = torch.arange(6.0, device="pjrt").reshape(2, 3) + 0
    # JAX and NumPy (the CPU platform's buffers are host memory) take it as it is
    a = jnp.from_dlpack(t)
    assert _pointer(a) == _pointer(torch_pjrt.to_jax(t))
    np.testing.assert_array_equal(np.from_dlpack(t), np.arange(6.0).reshape(2, 3))
    # torch's own round trip: a pjrt tensor sharing the storage
    shared = torch.utils.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(t))
    assert shared.device == t.device
    shared.mul_(10)
    assert torch.equal(t.cpu(), torch.arange(6.0).reshape(2, 3) * 10)
    again = torch.from_dlpack(t)
    again.add_(1)
    assert torch.equal(t.cpu(), torch.arange(6.0).reshape(2, 3) * 10 + 1)
    assert torch.from_dlpack(torch.ones(2)).device.type == "cpu"  # (others: PyTorch's)


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda: torch_pjrt.to_jax(torch.ones(2)), RuntimeError, "expected a tensor on a pjrt"),
        (
            lambda: torch_pjrt.to_jax(torch.ones(2, device="pjrt", requires_grad=True)),
            RuntimeError,
            "requires grad",
        ),
        (lambda: torch_pjrt.to_jax([1.0]), TypeError, "expected a torch.Tensor"),
        (lambda: torch_pjrt.from_jax(np.ones(2)), TypeError, "expected a jax.Array"),
        (
            lambda: jax.jit(lambda a: torch_pjrt.from_jax(a))(jnp.ones(2)),
            TypeError,
            "tracer",
        ),
        (
            lambda: torch.utils.dlpack.to_dlpack(torch.arange(4.0, device="pjrt")[1:]),
            RuntimeError,
            "storage offset 1",
        ),
        (
            lambda: torch.ones(2, device="pjrt", requires_grad=True).__dlpack__(),
            BufferError,
            "require gradient",
        ),
    ],
)
def test_bad_handovers(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_a_deleted_array_is_refused():
    a = jnp.ones(3)
    a.delete()
    with pytest.raises(RuntimeError, match="has been deleted"):
        torch_pjrt.from_jax(a)


def test_storages_made_by_pytorch():
    """``torch.UntypedStorage(n, device="pjrt")`` (PyTorch's own constructor, through the
    C++ allocator) is a storage torch_pjrt adopts on first use; it used to kill the
    process."""
    storage = torch.UntypedStorage(16, device="pjrt")
    assert storage.device.type == "pjrt" and storage.nbytes() == 16
    t = torch.tensor([], device="pjrt").set_(storage)
    assert torch.equal(t.cpu(), torch.zeros(4))
    t.fill_(3.0)
    assert storage.cpu().tolist() == list(torch.full((4,), 3.0).view(torch.uint8).tolist())
    typed = torch.TypedStorage(3, device="pjrt", dtype=torch.float32)
    assert typed.tolist() == [0.0, 0.0, 0.0]
