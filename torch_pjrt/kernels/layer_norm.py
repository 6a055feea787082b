"""LayerNorm over the last dimension: a Pallas kernel, its Pallas backward, and the
plain-JAX reference they are tested against.

``torch.ops.pjrt.layer_norm(x, weight=None, bias=None, *, eps=1e-5, impl="auto")``
matches ``torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)``,
forward and backward (dx, dweight, dbias); CPU tensors run that PyTorch function.
bfloat16 and float16 inputs are computed in float32, as PyTorch does; the result has
x's dtype.

``impl`` chooses the implementation:

- ``"auto"``, by platform. CPU: the reference (XLA fuses it into one loop; the kernel
  would only be interpreted there). GPU (cuda, rocm): JAX's Triton kernel,
  ``jax.experimental.pallas.ops.gpu.layer_norm``. Other accelerators (TPU): our kernel,
  compiled for the chip.
- ``"pallas"``: our kernel, interpreted on the CPU platform (how the tests run it).
  Its row blocks are sized for TPU (multiples of 8 rows, whole rows): on GPUs, where
  Triton wants power-of-two blocks, ``"auto"`` takes JAX's kernel instead.
- ``"reference"``: the plain-JAX reference, differentiated by ``jax.vjp``.

The kernel blocks rows: each grid step normalizes a block of whole rows; the backward
recomputes each row's mean and 1/std (the op saves no statistics) and writes dx and
one partial dweight and dbias per block, summed after the call.

NOTE: ``torch_pjrt.kernel`` cannot give a backward an optional tensor (its derivative's
schema makes every tensor required), so one kernel per combination does the work
(``pjrt::layer_norm_weight_bias``, ``_weight``, ``_bias``, ``_plain``) and
``pjrt::layer_norm`` is a ``CompositeImplicitAutograd`` op calling one of them: eager
autograd, Dynamo and AOTAutograd all see the kernel it picked.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax.experimental import pallas as pl

from torch_pjrt.kernels.decorator import kernel as pjrt_kernel
from torch_pjrt.runtime.platform import GPU_PLATFORMS, current_platform

__all__ = ["layer_norm", "layer_norm_reference"]

IMPLS = ("auto", "pallas", "reference")
_BLOCK_BYTES = 1 << 19  # float32 bytes of x per grid step (TPU VMEM holds several)


def layer_norm_reference(x, weight=None, bias=None, *, eps: float = 1e-5):
    """Plain JAX, in float32: what the kernel is tested against."""
    xf = x.astype(jnp.float32)
    centered = xf - jnp.mean(xf, axis=-1, keepdims=True)
    y = centered * jax.lax.rsqrt(jnp.mean(centered * centered, axis=-1, keepdims=True) + eps)
    if weight is not None:
        y = y * weight.astype(jnp.float32)
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return y.astype(x.dtype)


# --- the Pallas kernel ---------------------------------------------------------------


def _normalized(x, eps):
    """x's rows normalized, and their 1/std."""
    centered = x - jnp.mean(x, axis=-1, keepdims=True)
    rstd = jax.lax.rsqrt(jnp.mean(centered * centered, axis=-1, keepdims=True) + eps)
    return centered * rstd, rstd


def _forward_body(x_ref, *refs, eps, weighted, biased):
    refs = list(refs)
    w_ref = refs.pop(0) if weighted else None
    b_ref = refs.pop(0) if biased else None
    (o_ref,) = refs
    y, _ = _normalized(x_ref[...].astype(jnp.float32), eps)
    if weighted:
        y = y * w_ref[...].astype(jnp.float32)
    if biased:
        y = y + b_ref[...].astype(jnp.float32)
    o_ref[...] = y.astype(o_ref.dtype)


def _backward_body(x_ref, *refs, eps, n_rows, block_rows, weighted, biased):
    refs = list(refs)
    w_ref = refs.pop(0) if weighted else None
    g_ref, dx_ref = refs[:2]
    partial_refs = refs[2:]  # dweight's, then dbias's, as given
    g = g_ref[...].astype(jnp.float32)
    xhat, rstd = _normalized(x_ref[...].astype(jnp.float32), eps)
    dy = g * w_ref[...].astype(jnp.float32) if weighted else g
    dx = dy - jnp.mean(dy, axis=-1, keepdims=True)
    dx = rstd * (dx - xhat * jnp.mean(dy * xhat, axis=-1, keepdims=True))
    dx_ref[...] = dx.astype(dx_ref.dtype)
    if partial_refs:
        # the last block may run past the rows: its extra rows hold garbage
        row = pl.program_id(0) * block_rows + jax.lax.broadcasted_iota(jnp.int32, g.shape, 0)
        inside = row < n_rows
        parts = ([g * xhat] if weighted else []) + ([g] if biased else [])
        for ref, part in zip(partial_refs, parts):
            ref[...] = jnp.sum(jnp.where(inside, part, 0.0), axis=0, keepdims=True)


def _block_rows(n: int, d: int) -> int:
    """All the rows when few, else a multiple of 8 (TPU sublanes) within _BLOCK_BYTES."""
    cap = max(8, _BLOCK_BYTES // (4 * d) // 8 * 8)
    return n if n <= cap else cap


def _specs(n: int, d: int):
    bn = _block_rows(n, d)
    rows = pl.BlockSpec((bn, d), lambda i: (i, 0))
    whole = pl.BlockSpec((1, d), lambda i: (0, 0))
    return bn, (pl.cdiv(n, bn),), rows, whole


def layer_norm_pallas(x, weight=None, bias=None, *, eps: float = 1e-5):
    """The forward kernel, on x viewed as rows of its last dim."""
    d = x.shape[-1]
    rows_of_x = x.reshape(-1, d)
    _, grid, rows, whole = _specs(rows_of_x.shape[0], d)
    params = [p.reshape(1, d) for p in (weight, bias) if p is not None]
    out = pl.pallas_call(
        lambda *refs: _forward_body(
            *refs, eps=eps, weighted=weight is not None, biased=bias is not None
        ),
        grid=grid,
        in_specs=[rows] + [whole] * len(params),
        out_specs=rows,
        out_shape=jax.ShapeDtypeStruct(rows_of_x.shape, x.dtype),
        interpret=current_platform() == "cpu",
    )(rows_of_x, *params)
    return out.reshape(x.shape)


def layer_norm_pallas_backward(x, weight, bias, grad, *, eps: float = 1e-5):
    """The backward kernel: (dx, dweight, dbias), None for a parameter not given."""
    d = x.shape[-1]
    rows_of_x = x.reshape(-1, d)
    n = rows_of_x.shape[0]
    bn, grid, rows, whole = _specs(n, d)
    weighted, biased = weight is not None, bias is not None
    n_partials = weighted + biased  # one of each per block
    partial = pl.BlockSpec((pl.squeezed, 1, d), lambda i: (i, 0, 0))
    outs = pl.pallas_call(
        lambda *refs: _backward_body(
            *refs, eps=eps, n_rows=n, block_rows=bn, weighted=weighted, biased=biased
        ),
        grid=grid,
        in_specs=[rows] + ([whole] if weighted else []) + [rows],
        out_specs=[rows] + [partial] * n_partials,
        out_shape=[jax.ShapeDtypeStruct(rows_of_x.shape, x.dtype)]
        + [jax.ShapeDtypeStruct((grid[0], 1, d), jnp.float32)] * n_partials,
        interpret=current_platform() == "cpu",
    )(rows_of_x, *([weight.reshape(1, d)] if weighted else []), grad.reshape(-1, d))
    partials = iter(outs[1:])
    dw = next(partials).sum(axis=(0, 1)).astype(weight.dtype) if weighted else None
    db = next(partials).sum(axis=(0, 1)).astype(bias.dtype) if biased else None
    return outs[0].reshape(x.shape), dw, db


# --- choosing the implementation -----------------------------------------------------


def _path(impl: str, x) -> str:
    if impl not in IMPLS:
        raise ValueError(f"layer_norm: impl must be one of {IMPLS}, got {impl!r}")
    if impl == "reference" or x.size == 0:
        return "reference"
    if impl == "pallas":
        return "pallas"
    platform = current_platform()
    if platform == "cpu":
        return "reference"
    return "triton" if platform in GPU_PLATFORMS else "pallas"


def _triton(x, weight, bias, *, eps):
    """JAX's GPU kernel: it takes a weight and a bias, and x of rank 3."""
    from jax.experimental.pallas.ops.gpu import layer_norm as gpu

    d = x.shape[-1]
    w = jnp.ones((d,), x.dtype) if weight is None else weight
    b = jnp.zeros((d,), w.dtype) if bias is None else bias
    return gpu.layer_norm(x.reshape(1, -1, d), w, b, eps=eps).reshape(x.shape)


_FORWARD = {"reference": layer_norm_reference, "pallas": layer_norm_pallas, "triton": _triton}


def _forward(x, weight, bias, *, eps, impl):
    return _FORWARD[_path(impl, x)](x, weight, bias, eps=eps)


def _backward(x, weight, bias, grad, *, eps, impl):
    """(dx, dweight, dbias), None for a parameter not given."""
    path = _path(impl, x)
    if path == "pallas":
        return layer_norm_pallas_backward(x, weight, bias, grad, eps=eps)
    fn = _FORWARD[path]
    given = [p is not None for p in (weight, bias)]

    def of(x, *params):
        found = iter(params)
        return fn(x, *[next(found) if g else None for g in given], eps=eps)

    grads = iter(jax.vjp(of, x, *[p for p in (weight, bias) if p is not None])[1](grad))
    dx = next(grads)
    return dx, *[next(grads) if g else None for g in given]


# --- the ops -------------------------------------------------------------------------


def _check(x, weight, bias) -> None:
    """PyTorch's checks, on torch tensors and JAX arrays alike."""
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != (x.shape[-1],):
            raise RuntimeError(
                f"layer_norm: expected {name} of shape [{x.shape[-1]}] (the size of the "
                f"last dimension of x, of shape {list(x.shape)}), but got {name} of shape "
                f"{list(p.shape)}. Pass a {name} of x.shape[-1] elements, or None."
            )


def _variant(suffix: str, weighted: bool, biased: bool):
    """The kernel for one combination of weight and bias; its tensors come first."""
    params = ["Tensor weight"] * weighted + ["Tensor bias"] * biased

    def split(tensors):
        """(x, weight or None, bias or None) from the variant's tensors."""
        x, *rest = tensors
        return x, rest.pop(0) if weighted else None, rest.pop(0) if biased else None

    def fn(*tensors, eps, impl):
        x, w, b = split(tensors)
        _check(x, w, b)
        return _forward(x, w, b, eps=eps, impl=impl)

    def backward(*tensors, eps, impl):
        x, w, b = split(tensors[:-1])
        dx, dw, db = _backward(x, w, b, tensors[-1], eps=eps, impl=impl)
        return dx, *([dw] if weighted else []), *([db] if biased else [])

    def reference(*tensors, eps=1e-5, impl="auto"):
        x, w, b = split(tensors)
        _check(x, w, b)
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)

    return pjrt_kernel(
        f"pjrt::layer_norm_{suffix}",
        fn,
        schema=f'({", ".join(["Tensor x", *params])}, *, float eps=1e-05, str impl="auto") '
        "-> Tensor",
        backward=backward,
        reference=reference,
    )


layer_norm_weight_bias = _variant("weight_bias", True, True)
layer_norm_weight = _variant("weight", True, False)
layer_norm_bias = _variant("bias", False, True)
layer_norm_plain = _variant("plain", False, False)

_lib = torch.library.Library("pjrt", "FRAGMENT")
_lib.define(
    "layer_norm(Tensor x, Tensor? weight=None, Tensor? bias=None, *, float eps=1e-05, "
    'str impl="auto") -> Tensor'
)


def _layer_norm(x, weight=None, bias=None, *, eps=1e-5, impl="auto"):
    if weight is not None and bias is not None:
        return layer_norm_weight_bias(x, weight, bias, eps=eps, impl=impl)
    if weight is not None:
        return layer_norm_weight(x, weight, eps=eps, impl=impl)
    if bias is not None:
        return layer_norm_bias(x, bias, eps=eps, impl=impl)
    return layer_norm_plain(x, eps=eps, impl=impl)


_lib.impl("layer_norm", _layer_norm, "CompositeImplicitAutograd")

layer_norm = torch.ops.pjrt.layer_norm
layer_norm.__doc__ = """LayerNorm over the last dim of ``x``: ``torch.nn.functional.layer_norm(x,
(x.shape[-1],), weight, bias, eps)`` as one op (a Pallas kernel on accelerators).

Args:
    x: the input, of any shape; normalized over its last dim.
    weight: None, or the scale, of shape ``[x.shape[-1]]``.
    bias: None, or the shift, of shape ``[x.shape[-1]]``.
    eps: added to the variance.
    impl: ``"auto"``, ``"pallas"`` or ``"reference"`` (see the module's docstring).

Returns:
    A tensor of x's shape and dtype.

Example:
    >>> x = torch.randn(2, 8, 64, device="pjrt")
    >>> layer_norm(x, torch.ones(64, device="pjrt"), torch.zeros(64, device="pjrt")).shape
    torch.Size([2, 8, 64])
"""
