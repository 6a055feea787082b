"""Rotary position embedding: a Pallas kernel, its Pallas backward, and the plain-JAX
reference they are tested against.

``torch.ops.pjrt.rotary_embedding(x, cos, sin, *, interleaved=False, impl="auto")``
returns ``x * cos + rotate(x) * sin`` for ``x`` of shape ``[B, H, S, D]`` (batch,
heads, sequence, head dim: Hugging Face's layout for queries and keys) and ``cos``,
``sin`` of shape ``[S, D]`` or ``[B, S, D]`` (broadcast over the heads, as Hugging
Face's ``position_embeddings`` are, with ``unsqueeze_dim=1``):

- ``interleaved=False``: ``rotate`` is Hugging Face Llama's ``rotate_half``
  (``cat(-x2, x1)`` of the two halves of the head dim), ``cos = cat(freqs, freqs)``
  along the last dim: ``apply_rotary_pos_emb`` exactly.
- ``interleaved=True``: GPT-J's pairs ``(x[2i], x[2i+1])``, rotated by
  ``cos = repeat_interleave(freqs, 2)`` along the last dim.

The result has x's dtype; bfloat16 and float16 inputs are computed in float32. The
backward gives dx from a Pallas kernel (the rotation's transpose is minus itself:
``dx = g * cos - rotate(g * sin)``) and the true gradients of cos and sin, reduced
over the heads (and batch) by XLA, so a trainable or computed cos, sin also learn;
where nothing uses them, XLA drops that reduction from a compiled backward.

``impl`` chooses the implementation: ``"auto"`` is the reference on the CPU platform
(XLA fuses it into one loop; the kernel would only be interpreted there) and on GPUs
for a head dim that is not a power of two (Triton's blocks are), our kernel, compiled
for the chip, elsewhere; ``"pallas"`` is our kernel (interpreted on the CPU
platform, how the tests run it); ``"reference"`` the plain-JAX reference, differentiated
by ``jax.vjp``.

The kernel's grid is (batch, head, block of positions). ``rotate_half`` reads the two
halves of each row; the interleaved pairs are rotated by a matmul with a signed
permutation (lane-strided reads are not portable across Pallas backends).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax.experimental import pallas as pl

from torch_pjrt.kernels.decorator import kernel as pjrt_kernel
from torch_pjrt.runtime.platform import GPU_PLATFORMS, current_platform

__all__ = ["rotary_embedding", "rotary_embedding_reference"]

IMPLS = ("auto", "pallas", "reference")
_BLOCK_BYTES = 1 << 18  # float32 bytes of x per grid step
_EXACT = jax.lax.Precision.HIGHEST  # (the signed permutation's matmul must not round x)


def _rotate(x, interleaved: bool):
    """rotate_half (Llama) or rotate_every_two (GPT-J) along the last dim."""
    if interleaved:
        pairs = x.reshape(*x.shape[:-1], -1, 2)
        return jnp.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(x.shape)
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def _per_batch(t):
    """cos or sin as [1 or B, S, D]."""
    return t[None] if t.ndim == 2 else t


def rotary_embedding_reference(x, cos, sin, *, interleaved: bool = False):
    """Plain JAX, in float32: what the kernel is tested against."""
    xf = x.astype(jnp.float32)
    c = _per_batch(cos).astype(jnp.float32)[:, None]
    s = _per_batch(sin).astype(jnp.float32)[:, None]
    return (xf * c + _rotate(xf, interleaved) * s).astype(x.dtype)


# --- the Pallas kernel ---------------------------------------------------------------


def _half_body(x_ref, c_ref, s_ref, o_ref, *, sign: float):
    """Forward (sign 1): x * cos + rotate_half(x) * sin; its transpose (sign -1):
    x * cos - rotate_half(x * sin). Written out on the halves, the transpose only
    swaps which half of sin multiplies which half of x."""
    h = x_ref.shape[-1] // 2
    x1, x2 = x_ref[:, :h].astype(jnp.float32), x_ref[:, h:].astype(jnp.float32)
    c1, c2 = c_ref[:, :h].astype(jnp.float32), c_ref[:, h:].astype(jnp.float32)
    s1, s2 = s_ref[:, :h].astype(jnp.float32), s_ref[:, h:].astype(jnp.float32)
    s_lo, s_hi = (s1, s2) if sign > 0 else (s2, s1)
    o_ref[:, :h] = (x1 * c1 - sign * x2 * s_lo).astype(o_ref.dtype)
    o_ref[:, h:] = (x2 * c2 + sign * x1 * s_hi).astype(o_ref.dtype)


def _pairs_body(x_ref, c_ref, s_ref, p_ref, o_ref, *, sign: float):
    """The same for interleaved pairs: rotate(v) is v @ p, p a signed permutation."""
    x = x_ref[...].astype(jnp.float32)
    s = s_ref[...].astype(jnp.float32)
    p = p_ref[...]

    def rotate(v):
        return jnp.dot(v, p, precision=_EXACT, preferred_element_type=jnp.float32)

    rotated = rotate(x) * s if sign > 0 else -rotate(x * s)
    o_ref[...] = (x * c_ref[...].astype(jnp.float32) + rotated).astype(o_ref.dtype)


def _pair_rotation(d: int):
    """p with v @ p == rotate_every_two(v): p[2i, 2i+1] = 1, p[2i+1, 2i] = -1."""
    i = jnp.arange(0, d, 2)
    return jnp.zeros((d, d), jnp.float32).at[i, i + 1].set(1.0).at[i + 1, i].set(-1.0)


def _call(x, cos, sin, *, interleaved: bool, sign: float):
    """The kernel: x * cos + rotate(x) * sin (sign 1) or its transpose (sign -1)."""
    b, h, s, d = x.shape
    cos, sin = _per_batch(cos), _per_batch(sin)
    cap = max(8, _BLOCK_BYTES // (4 * d) // 8 * 8)
    if current_platform() in GPU_PLATFORMS:  # Triton's blocks are powers of two (masked at the end)
        bs = min(pl.next_power_of_2(s), 1 << (cap.bit_length() - 1))
    else:  # all positions, or a multiple of 8 (TPU sublanes)
        bs = s if s <= cap else cap
    per_batch = cos.shape[0] != 1
    rows = pl.BlockSpec((pl.squeezed, pl.squeezed, bs, d), lambda i, j, k: (i, j, k, 0))
    table = pl.BlockSpec((pl.squeezed, bs, d), lambda i, j, k: (i if per_batch else 0, k, 0))
    args, in_specs = [x, cos, sin], [rows, table, table]
    if interleaved:
        args.append(_pair_rotation(d))
        in_specs.append(pl.BlockSpec((d, d), lambda i, j, k: (0, 0)))
    body = _pairs_body if interleaved else _half_body
    return pl.pallas_call(
        lambda *refs: body(*refs, sign=sign),
        grid=(b, h, pl.cdiv(s, bs)),
        in_specs=in_specs,
        out_specs=rows,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=current_platform() == "cpu",
    )(*args)


def rotary_embedding_pallas(x, cos, sin, *, interleaved: bool = False):
    """The forward kernel."""
    return _call(x, cos, sin, interleaved=interleaved, sign=1.0)


def rotary_embedding_pallas_backward(x, cos, sin, grad, *, interleaved: bool = False):
    """(dx, dcos, dsin): dx from the kernel, dcos and dsin reduced by XLA."""
    dx = _call(grad, cos, sin, interleaved=interleaved, sign=-1.0).astype(x.dtype)
    g, xf = grad.astype(jnp.float32), x.astype(jnp.float32)
    over = (1,) if cos.ndim == 3 and cos.shape[0] == x.shape[0] else (0, 1)
    dcos = jnp.sum(g * xf, axis=over).reshape(cos.shape).astype(cos.dtype)
    dsin = jnp.sum(g * _rotate(xf, interleaved), axis=over).reshape(sin.shape)
    return dx, dcos, dsin.astype(sin.dtype)


# --- the op --------------------------------------------------------------------------


def _path(impl: str, x) -> str:
    if impl not in IMPLS:
        raise ValueError(f"rotary_embedding: impl must be one of {IMPLS}, got {impl!r}")
    if impl != "auto":
        return impl
    platform, d = current_platform(), x.shape[-1]
    if platform == "cpu" or x.size == 0 or (platform in GPU_PLATFORMS and d & (d - 1)):
        return "reference"  # (Triton needs a power-of-two head dim)
    return "pallas"


def _check(x, cos, sin) -> None:
    """PyTorch-style checks, on torch tensors and JAX arrays alike."""
    if x.ndim != 4 or x.shape[-1] % 2:
        raise RuntimeError(
            f"rotary_embedding: expected x of shape [batch, heads, seq, head_dim] with an "
            f"even head_dim, but got x of shape {list(x.shape)}. Transpose [B, S, H, D] "
            "inputs to [B, H, S, D] first."
        )
    b, _, s, d = x.shape
    for name, t in (("cos", cos), ("sin", sin)):
        if tuple(t.shape) not in ((s, d), (b, s, d), (1, s, d)):
            raise RuntimeError(
                f"rotary_embedding: expected {name} of shape [{s}, {d}] or [{b}, {s}, {d}] "
                f"([seq, head_dim] or [batch, seq, head_dim] of x, of shape "
                f"{list(x.shape)}), but got {name} of shape {list(t.shape)}."
            )
    if tuple(cos.shape) != tuple(sin.shape):
        raise RuntimeError(
            f"rotary_embedding: expected cos and sin of the same shape, but got cos of "
            f"shape {list(cos.shape)} and sin of shape {list(sin.shape)}."
        )


def _rotary_backward(x, cos, sin, grad, *, interleaved, impl):
    if _path(impl, x) == "pallas":
        return rotary_embedding_pallas_backward(x, cos, sin, grad, interleaved=interleaved)
    _, pullback = jax.vjp(
        lambda x, c, s: rotary_embedding_reference(x, c, s, interleaved=interleaved),
        x,
        cos,
        sin,
    )
    return pullback(grad)


def _torch_rotate(x, interleaved: bool):
    if interleaved:
        pairs = x.unflatten(-1, (-1, 2))
        return torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def _torch_reference(x, cos, sin, *, interleaved=False, impl="auto"):
    _check(x, cos, sin)
    c = (cos[None] if cos.ndim == 2 else cos).unsqueeze(1).float()
    s = (sin[None] if sin.ndim == 2 else sin).unsqueeze(1).float()
    xf = x.float()
    return (xf * c + _torch_rotate(xf, interleaved) * s).to(x.dtype)


def _rotary_embedding(x, cos, sin, *, interleaved: bool = False, impl: str = "auto"):
    """Rotary position embedding of ``x`` (``[B, H, S, D]``) by ``cos``, ``sin``
    (``[S, D]`` or ``[B, S, D]``), as one op: a Pallas kernel on accelerators.

    Args:
        x: queries or keys, ``[batch, heads, seq, head_dim]``.
        cos: ``[seq, head_dim]`` or ``[batch, seq, head_dim]``, laid out for the
            rotation: the frequencies repeated (``interleaved=False``) or each one twice.
        sin: as cos.
        interleaved: GPT-J's pairs (True) or Llama's halves (False).
        impl: ``"auto"``, ``"pallas"`` or ``"reference"`` (see the module's docstring).

    Returns:
        ``x * cos + rotate(x) * sin``, of x's shape and dtype.

    Example:
        >>> x = torch.randn(1, 4, 16, 64, device="pjrt")
        >>> cos, sin = torch.ones(16, 64, device="pjrt"), torch.zeros(16, 64, device="pjrt")
        >>> torch.equal(rotary_embedding(x, cos, sin).cpu(), x.cpu())
        True
    """
    _check(x, cos, sin)
    if _path(impl, x) == "pallas":
        return rotary_embedding_pallas(x, cos, sin, interleaved=interleaved)
    return rotary_embedding_reference(x, cos, sin, interleaved=interleaved)


rotary_embedding = pjrt_kernel(
    "pjrt::rotary_embedding",
    _rotary_embedding,
    backward=_rotary_backward,
    reference=_torch_reference,
)
rotary_embedding.__doc__ = _rotary_embedding.__doc__
