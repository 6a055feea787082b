"""RMSNorm over the last dimension: a Pallas kernel, its Pallas backward, and the
plain-JAX reference they are tested against.

``torch.ops.pjrt.rms_norm(x, weight=None, *, eps=1e-6, impl="auto")`` matches
``torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)``, forward and backward
(dx, dweight); CPU tensors run that PyTorch function. bfloat16 and float16 inputs are
computed in float32, as PyTorch does; the result has x's dtype.

``impl`` chooses the implementation:

- ``"auto"``, by platform. CPU: the reference (XLA fuses it into one loop; the kernel
  would only be interpreted there). GPU (cuda, rocm): JAX's Triton kernel,
  ``jax.experimental.pallas.ops.gpu.rms_norm``. Other accelerators (TPU): our kernel,
  compiled for the chip.
- ``"pallas"``: our kernel, interpreted on the CPU platform (how the tests run it).
  Its row blocks are sized for TPU (multiples of 8 rows, whole rows): on GPUs, where
  Triton wants power-of-two blocks, ``"auto"`` takes JAX's kernel instead.
- ``"reference"``: the plain-JAX reference, differentiated by ``jax.vjp``.

The kernel blocks rows: each grid step normalizes a block of whole rows; the backward
recomputes each row's 1/rms (the op saves no statistics) and writes dx and one partial
dweight per block, summed after the call.

NOTE: ``torch_pjrt.kernel`` cannot give a backward an optional tensor (its derivative's
schema makes every tensor required), so two kernels do the work,
``pjrt::rms_norm_weighted(x, weight)`` and ``pjrt::rms_norm_unweighted(x)``, and
``pjrt::rms_norm`` is a ``CompositeImplicitAutograd`` op calling one of them: eager
autograd, Dynamo and AOTAutograd all see the kernel it picked.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax.experimental import pallas as pl

from torch_pjrt.kernels.decorator import kernel as pjrt_kernel
from torch_pjrt.runtime.platform import GPU_PLATFORMS, current_platform

__all__ = ["rms_norm", "rms_norm_reference"]

IMPLS = ("auto", "pallas", "reference")
_BLOCK_BYTES = 1 << 19  # float32 bytes of x per grid step (TPU VMEM holds several)


def rms_norm_reference(x, weight=None, *, eps: float = 1e-6):
    """Plain JAX, in float32: what the kernel is tested against."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    if weight is not None:
        y = y * weight.astype(jnp.float32)
    return y.astype(x.dtype)


# --- the Pallas kernel ---------------------------------------------------------------


def _forward_body(x_ref, *refs, eps):
    *w_ref, o_ref = refs
    x = x_ref[...].astype(jnp.float32)
    y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    if w_ref:
        y = y * w_ref[0][...].astype(jnp.float32)
    o_ref[...] = y.astype(o_ref.dtype)


def _backward_body(x_ref, *refs, eps, n_rows, block_rows, weighted):
    if weighted:
        w_ref, g_ref, dx_ref, dw_ref = refs
    else:
        g_ref, dx_ref = refs
    x = x_ref[...].astype(jnp.float32)
    g = g_ref[...].astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    xhat = x * r
    dy = g * w_ref[...].astype(jnp.float32) if weighted else g
    dx = r * (dy - xhat * jnp.mean(dy * xhat, axis=-1, keepdims=True))
    dx_ref[...] = dx.astype(dx_ref.dtype)
    if weighted:
        # the last block may run past the rows: its extra rows hold garbage
        row = pl.program_id(0) * block_rows + jax.lax.broadcasted_iota(jnp.int32, g.shape, 0)
        dw_ref[...] = jnp.sum(jnp.where(row < n_rows, g * xhat, 0.0), axis=0, keepdims=True)


def _block_rows(n: int, d: int) -> int:
    """All the rows when few, else a multiple of 8 (TPU sublanes) within _BLOCK_BYTES."""
    cap = max(8, _BLOCK_BYTES // (4 * d) // 8 * 8)
    return n if n <= cap else cap


def _specs(n: int, d: int):
    bn = _block_rows(n, d)
    rows = pl.BlockSpec((bn, d), lambda i: (i, 0))
    whole = pl.BlockSpec((1, d), lambda i: (0, 0))
    return bn, (pl.cdiv(n, bn),), rows, whole


def rms_norm_pallas(x, weight=None, *, eps: float = 1e-6):
    """The forward kernel, on x viewed as rows of its last dim."""
    d = x.shape[-1]
    rows_of_x = x.reshape(-1, d)
    _, grid, rows, whole = _specs(rows_of_x.shape[0], d)
    args = [rows_of_x] + ([] if weight is None else [weight.reshape(1, d)])
    out = pl.pallas_call(
        lambda *refs: _forward_body(*refs, eps=eps),
        grid=grid,
        in_specs=[rows] + [whole] * (len(args) - 1),
        out_specs=rows,
        out_shape=jax.ShapeDtypeStruct(rows_of_x.shape, x.dtype),
        interpret=current_platform() == "cpu",
    )(*args)
    return out.reshape(x.shape)


def rms_norm_pallas_backward(x, weight, grad, *, eps: float = 1e-6):
    """The backward kernel: (dx, dweight), dweight None without a weight."""
    d = x.shape[-1]
    rows_of_x = x.reshape(-1, d)
    n = rows_of_x.shape[0]
    bn, grid, rows, whole = _specs(n, d)
    weighted = weight is not None
    args = [rows_of_x] + ([weight.reshape(1, d)] if weighted else []) + [grad.reshape(-1, d)]
    out_specs = [rows]
    out_shape = [jax.ShapeDtypeStruct(rows_of_x.shape, x.dtype)]
    if weighted:  # one partial dweight per block
        out_specs.append(pl.BlockSpec((pl.squeezed, 1, d), lambda i: (i, 0, 0)))
        out_shape.append(jax.ShapeDtypeStruct((grid[0], 1, d), jnp.float32))
    outs = pl.pallas_call(
        lambda *refs: _backward_body(*refs, eps=eps, n_rows=n, block_rows=bn, weighted=weighted),
        grid=grid,
        in_specs=[rows] + ([whole] if weighted else []) + [rows],
        out_specs=out_specs,
        out_shape=out_shape,
        interpret=current_platform() == "cpu",
    )(*args)
    dx = outs[0].reshape(x.shape)
    return dx, (outs[1].sum(axis=(0, 1)).astype(weight.dtype) if weighted else None)


# --- choosing the implementation -----------------------------------------------------


def _path(impl: str, x) -> str:
    if impl not in IMPLS:
        raise ValueError(f"rms_norm: impl must be one of {IMPLS}, got {impl!r}")
    if impl == "reference" or x.size == 0:
        return "reference"
    if impl == "pallas":
        return "pallas"
    platform = current_platform()
    if platform == "cpu":
        return "reference"
    return "triton" if platform in GPU_PLATFORMS else "pallas"


def _triton(x, weight, *, eps):
    """JAX's GPU kernel: it takes a weight and a bias, and x of rank 3."""
    from jax.experimental.pallas.ops.gpu import rms_norm as gpu

    d = x.shape[-1]
    w = jnp.ones((d,), x.dtype) if weight is None else weight
    out = gpu.rms_norm(x.reshape(1, -1, d), w, jnp.zeros((d,), w.dtype), eps=eps)
    return out.reshape(x.shape)


_FORWARD = {"reference": rms_norm_reference, "pallas": rms_norm_pallas, "triton": _triton}


def _forward(x, weight, *, eps, impl):
    return _FORWARD[_path(impl, x)](x, weight, eps=eps)


def _backward(x, weight, grad, *, eps, impl):
    path = _path(impl, x)
    if path == "pallas":
        return rms_norm_pallas_backward(x, weight, grad, eps=eps)
    fn = _FORWARD[path]
    if weight is None:
        (dx,) = jax.vjp(lambda x: fn(x, None, eps=eps), x)[1](grad)
        return dx, None
    return jax.vjp(lambda x, w: fn(x, w, eps=eps), x, weight)[1](grad)


# --- the ops -------------------------------------------------------------------------


def _check(x, weight) -> None:
    """PyTorch's checks, on torch tensors and JAX arrays alike."""
    if weight is not None and tuple(weight.shape) != (x.shape[-1],):
        raise RuntimeError(
            f"rms_norm: expected weight of shape [{x.shape[-1]}] (the size of the last "
            f"dimension of x, of shape {list(x.shape)}), but got weight of shape "
            f"{list(weight.shape)}. Pass a weight of x.shape[-1] elements, or None."
        )


def _torch_reference(x, weight, *, eps, impl):
    _check(x, weight)
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


def _weighted(x, weight, *, eps: float = 1e-6, impl: str = "auto"):
    _check(x, weight)
    return _forward(x, weight, eps=eps, impl=impl)


def _unweighted(x, *, eps: float = 1e-6, impl: str = "auto"):
    return _forward(x, None, eps=eps, impl=impl)


rms_norm_weighted = pjrt_kernel(
    "pjrt::rms_norm_weighted",
    _weighted,
    backward=lambda x, w, g, *, eps, impl: _backward(x, w, g, eps=eps, impl=impl),
    reference=lambda x, w, *, eps=1e-6, impl="auto": _torch_reference(x, w, eps=eps, impl=impl),
)
rms_norm_unweighted = pjrt_kernel(
    "pjrt::rms_norm_unweighted",
    _unweighted,
    backward=lambda x, g, *, eps, impl: _backward(x, None, g, eps=eps, impl=impl)[0],
    reference=lambda x, *, eps=1e-6, impl="auto": _torch_reference(x, None, eps=eps, impl=impl),
)

_lib = torch.library.Library("pjrt", "FRAGMENT")
_lib.define(
    'rms_norm(Tensor x, Tensor? weight=None, *, float eps=1e-06, str impl="auto") -> Tensor'
)


def _rms_norm(x, weight=None, *, eps=1e-6, impl="auto"):
    if weight is None:
        return rms_norm_unweighted(x, eps=eps, impl=impl)
    return rms_norm_weighted(x, weight, eps=eps, impl=impl)


_lib.impl("rms_norm", _rms_norm, "CompositeImplicitAutograd")

rms_norm = torch.ops.pjrt.rms_norm
rms_norm.__doc__ = """RMSNorm over the last dim of ``x``: ``torch.nn.functional.rms_norm(x,
(x.shape[-1],), weight, eps)`` as one op (a Pallas kernel on accelerators).

Args:
    x: the input, of any shape; normalized over its last dim.
    weight: None, or the scale, of shape ``[x.shape[-1]]``.
    eps: added to the mean square.
    impl: ``"auto"``, ``"pallas"`` or ``"reference"`` (see the module's docstring).

Returns:
    A tensor of x's shape and dtype.

Example:
    >>> x = torch.randn(2, 8, 64, device="pjrt")
    >>> rms_norm(x, torch.ones(64, device="pjrt"), eps=1e-6).shape
    torch.Size([2, 8, 64])
"""
