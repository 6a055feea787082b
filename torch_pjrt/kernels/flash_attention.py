"""Flash attention on pjrt tensors: a Pallas kernel, forward and backward, and its reference.

``torch.ops.pjrt.flash_attention(q, k, v, *, kv_lengths=None, causal=False, scale=None,
window=None, softcap=None, impl="auto", block_q=128, block_k=128)`` takes tensors in
``F.scaled_dot_product_attention``'s layout, ``[batch, heads, seq, head_dim]``, with
grouped-query attention (``k`` and ``v`` may have fewer heads, dividing ``q``'s).

- ``kv_lengths``: an integer tensor ``[batch]``; query rows see keys ``j < kv_lengths[b]``
  (right padding). A row that sees no key at all gives zeros, not NaN.
- ``causal``: query ``i`` sees keys ``j <= i``, positions counted from the start of both
  sequences (``is_causal``'s top-left alignment).
- ``window`` (with ``causal``): query ``i`` sees keys in ``(i - window, i]``.
- ``softcap``: logits ``s`` become ``softcap * tanh(s / softcap)`` (after ``scale``,
  which defaults to ``1 / sqrt(head_dim)``).

It is a ``CompositeImplicitAutograd`` op that checks its inputs and calls one of two
kernels made by ``torch_pjrt.kernel``: ``pjrt::flash_attention_dense`` and, with
``kv_lengths``, ``pjrt::flash_attention_varlen``. Being an operator, not a Python
function, it is one node for Dynamo (``fullgraph=True`` works).

``impl`` picks the path, the same on every chip:

- ``"pallas"``: the Pallas kernel below, blocked over ``block_q`` queries and ``block_k``
  keys with the online softmax; the forward saves the log-sum-exp, from which two
  backward kernels compute ``dq`` and ``dk, dv`` (summed over each group's query heads).
  Interpreted on the CPU platform, compiled for the chip elsewhere.
- ``"reference"``: plain ``jax.numpy`` materializing the ``[Sq, Sk]`` scores (the XLA
  path; its gradient is ``jax.vjp``).
- ``"auto"``: ``"reference"`` on the CPU platform, where the interpreted kernel only
  costs time, and ``"pallas"`` on accelerators.

CPU tensors run a PyTorch formula of the same semantics.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import torch
from jax import lax
from jax.experimental import pallas as pl

from torch_pjrt.kernels.decorator import kernel as pjrt_kernel
from torch_pjrt.runtime.platform import current_platform

__all__ = ["attention_reference", "flash_attention"]

_IMPLS = ("auto", "pallas", "reference")


def _visible(qpos, kpos, kv_len, *, causal: bool, window: int | None):
    """Which keys each query sees. Operators only: it serves JAX arrays (kernel and
    reference) and torch tensors (the CPU formula) alike."""
    seen = kpos < kv_len
    if causal:
        seen = seen & (kpos <= qpos)
    if window is not None:
        seen = seen & (kpos > qpos - window)
    return seen


# --- the reference: the XLA path ----------------------------------------------------------


def attention_reference(
    q, k, v, kv_lengths=None, *, causal=False, scale=None, window=None, softcap=None
):
    """Attention in plain ``jax.numpy``, scores materialized: what the kernel computes.

    Args:
        q: ``[B, Hq, Sq, D]``; k, v: ``[B, Hkv, Sk, D]`` with ``Hq % Hkv == 0``.
        kv_lengths: ``[B]`` integers, the valid key length of each batch row, or None.
        causal, scale, window, softcap: as :data:`flash_attention`.

    Returns:
        ``[B, Hq, Sq, D]`` in ``q``'s dtype.

    Example:
        >>> q = jnp.ones((1, 2, 8, 16))
        >>> attention_reference(q, q, q, causal=True).shape
        (1, 2, 8, 16)
    """
    _, hq, sq, d = q.shape
    sk = k.shape[2]
    group = hq // k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qf = q.astype(jnp.float32)
    kf, vf = (jnp.repeat(x.astype(jnp.float32), group, axis=1) for x in (k, v))
    s = jnp.einsum("bhqd,bhkd->bhqk", qf, kf) * scale
    if softcap is not None:
        s = softcap * jnp.tanh(s / softcap)
    kv_len = sk if kv_lengths is None else kv_lengths.astype(jnp.int32)[:, None, None, None]
    qpos = jnp.arange(sq)[:, None]
    kpos = jnp.arange(sk)[None, :]
    seen = _visible(qpos, kpos, kv_len, causal=causal, window=window)
    s = jnp.where(seen, s, -jnp.inf)
    m = lax.stop_gradient(s.max(-1, keepdims=True))
    p = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0))
    total = p.sum(-1, keepdims=True)
    out = jnp.einsum("bhqk,bhkd->bhqd", p, vf) / jnp.where(total == 0, 1.0, total)
    return out.astype(q.dtype)


def _torch_reference(
    q, k, v, kv_lengths=None, *, causal=False, scale=1.0, window=None, softcap=None, **_
):
    """The CPU tensors' path: :func:`attention_reference` written in PyTorch."""
    group = q.shape[1] // k.shape[1]
    qf = q.float()
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    s = qf @ kf.transpose(-1, -2) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    sq, sk = q.shape[2], k.shape[2]
    kv_len = sk if kv_lengths is None else kv_lengths[:, None, None, None]
    qpos = torch.arange(sq, device=q.device)[:, None]
    kpos = torch.arange(sk, device=q.device)[None, :]
    seen = _visible(qpos, kpos, kv_len, causal=causal, window=window)
    s = s.masked_fill(~seen, float("-inf"))
    m = s.amax(-1, keepdim=True).detach()
    p = torch.exp(s - torch.where(torch.isfinite(m), m, 0.0))
    total = p.sum(-1, keepdim=True)
    return ((p @ vf) / torch.where(total == 0, 1.0, total)).to(q.dtype)


# --- the Pallas kernels ---------------------------------------------------------------------


def _dot(a, b, contract):
    """a . b over the given dims of each, accumulated in float32."""
    dims = ((contract[0],), (contract[1],)), ((), ())
    return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _logits(q, k, *, scale, softcap):
    """A block's logits, and tanh(logits / softcap) for the backward (None without cap)."""
    s = _dot(q, k, (1, 1)) * scale
    if softcap is None:
        return s, None
    t = jnp.tanh(s / softcap)
    return softcap * t, t


def _block_mask(q_start, k_start, bq, bk, kv_len, *, causal, window):
    qpos = q_start + lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
    kpos = k_start + lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
    return _visible(qpos, kpos, kv_len, causal=causal, window=window)


def _key_blocks(q_start, bq, bk, n_k, kv_len, *, causal, window):
    """[lo, hi): the key blocks a query block sees; the others are skipped."""
    hi = jnp.minimum(n_k, (kv_len + bk - 1) // bk)
    if causal:
        hi = jnp.minimum(hi, (q_start + bq + bk - 1) // bk)
    lo = 0 if window is None else jnp.maximum(0, (q_start - window + 1) // bk)
    return lo, hi


def _query_blocks(k_start, bk, bq, n_q, kv_len, *, causal, window):
    """[lo, hi): the query blocks that see a key block (none if it is all padding)."""
    lo = k_start // bq if causal else 0
    hi = n_q if window is None else jnp.minimum(n_q, (k_start + bk + window - 2) // bq + 1)
    return lo, jnp.where(k_start < kv_len, hi, lo)


def _forward_kernel(
    len_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, block_k, causal, window, scale, softcap
):
    bq = q_ref.shape[0]
    q_start = pl.program_id(2) * bq
    kv_len = len_ref[0]
    q = q_ref[...]

    def body(j, carry):
        acc, m, total = carry
        k_start = j * block_k
        k = k_ref[pl.ds(k_start, block_k), :]
        v = v_ref[pl.ds(k_start, block_k), :]
        s, _ = _logits(q, k, scale=scale, softcap=softcap)
        seen = _block_mask(q_start, k_start, bq, block_k, kv_len, causal=causal, window=window)
        s = jnp.where(seen, s, -jnp.inf)
        m_new = jnp.maximum(m, s.max(-1))
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # (no key seen yet: no NaN)
        alpha = jnp.exp(m - m_safe)
        p = jnp.exp(s - m_safe[:, None])
        acc = alpha[:, None] * acc + _dot(p.astype(v.dtype), v, (1, 0))
        return acc, m_new, alpha * total + p.sum(-1)

    n_k = k_ref.shape[0] // block_k
    lo, hi = _key_blocks(q_start, bq, block_k, n_k, kv_len, causal=causal, window=window)
    init = (
        jnp.zeros(q_ref.shape, jnp.float32),
        jnp.full((bq,), -jnp.inf, jnp.float32),
        jnp.zeros((bq,), jnp.float32),
    )
    acc, m, total = lax.fori_loop(lo, hi, body, init)
    empty = total == 0.0
    o_ref[...] = (acc / jnp.where(empty, 1.0, total)[:, None]).astype(o_ref.dtype)
    # +inf for a row that sees no key: the backward's exp(s - lse) is then 0 there
    lse_ref[...] = jnp.where(empty, jnp.inf, m + jnp.log(total))


def _probabilities_and_dlogits(q, k, v, do, lse, delta, mask, *, scale, softcap):
    """p and d(loss)/d(q.k * scale) of one block, from the saved log-sum-exp."""
    s, t = _logits(q, k, scale=scale, softcap=softcap)
    p = jnp.where(mask, jnp.exp(s - lse[:, None]), 0.0)
    ds = p * (_dot(do, v, (1, 1)) - delta[:, None])
    return p, ds if t is None else ds * (1.0 - t * t)


def _dkdv_kernel(
    len_ref,
    q_ref,
    k_ref,
    v_ref,
    do_ref,
    lse_ref,
    delta_ref,
    dk_ref,
    dv_ref,
    *,
    block_q,
    causal,
    window,
    scale,
    softcap,
):
    bk = k_ref.shape[0]
    k_start = pl.program_id(2) * bk
    kv_len = len_ref[0]
    k, v = k_ref[...], v_ref[...]

    def body(i, carry):
        dk, dv = carry
        rows = pl.ds(i * block_q, block_q)
        q, do = q_ref[rows, :], do_ref[rows, :]
        mask = _block_mask(i * block_q, k_start, block_q, bk, kv_len, causal=causal, window=window)
        lse, delta = lse_ref[rows], delta_ref[rows]
        p, ds = _probabilities_and_dlogits(
            q, k, v, do, lse, delta, mask, scale=scale, softcap=softcap
        )
        dv = dv + _dot(p.astype(do.dtype), do, (0, 0))
        dk = dk + _dot(ds.astype(q.dtype), q, (0, 0))
        return dk, dv

    n_q = q_ref.shape[0] // block_q
    lo, hi = _query_blocks(k_start, bk, block_q, n_q, kv_len, causal=causal, window=window)
    zeros = jnp.zeros(k_ref.shape, jnp.float32)
    dk, dv = lax.fori_loop(lo, hi, body, (zeros, zeros))
    dk_ref[...] = dk * scale
    dv_ref[...] = dv


def _dq_kernel(
    len_ref,
    q_ref,
    k_ref,
    v_ref,
    do_ref,
    lse_ref,
    delta_ref,
    dq_ref,
    *,
    block_k,
    causal,
    window,
    scale,
    softcap,
):
    bq = q_ref.shape[0]
    q_start = pl.program_id(2) * bq
    kv_len = len_ref[0]
    q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]

    def body(j, dq):
        cols = pl.ds(j * block_k, block_k)
        k, v = k_ref[cols, :], v_ref[cols, :]
        mask = _block_mask(q_start, j * block_k, bq, block_k, kv_len, causal=causal, window=window)
        _, ds = _probabilities_and_dlogits(
            q, k, v, do, lse, delta, mask, scale=scale, softcap=softcap
        )
        return dq + _dot(ds.astype(k.dtype), k, (1, 0))

    n_k = k_ref.shape[0] // block_k
    lo, hi = _key_blocks(q_start, bq, block_k, n_k, kv_len, causal=causal, window=window)
    dq = lax.fori_loop(lo, hi, body, jnp.zeros(q_ref.shape, jnp.float32))
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


class _Plan:
    """Shapes, blocks and BlockSpecs shared by the three kernels. Sequences are padded to
    whole blocks (padded keys lie beyond every kv length, padded queries are sliced off)."""

    def __init__(self, q, k, lengths, *, causal, scale, window, softcap, block_q, block_k):
        self.b, self.hq, self.sq, self.d = q.shape
        self.hkv, self.sk = k.shape[1], k.shape[2]
        self.bq, self.bk = min(block_q, self.sq), min(block_k, self.sk)
        self.sq_pad = -(-self.sq // self.bq) * self.bq
        self.sk_pad = -(-self.sk // self.bk) * self.bk
        if lengths is None:
            self.lengths = jnp.full((self.b,), self.sk, jnp.int32)
        else:
            self.lengths = jnp.clip(lengths.astype(jnp.int32), 0, self.sk)
        self.features = {"causal": causal, "window": window, "scale": scale, "softcap": softcap}
        self.interpret = current_platform() == "cpu"

    def pad(self, x, seq):
        return jnp.pad(x, [(0, 0)] * 2 + [(0, seq - x.shape[2])] + [(0, 0)] * (x.ndim - 3))

    def spec(self, rows, *, kv=False, whole=False):
        """Blocks of [rows, D] of a [B, H, S, D] array, for grid (b, h, i): block i along
        the sequence, or all of it (whole); kv arrays are indexed by each head's group."""
        group = self.hq // self.hkv

        def index(b, h, i):
            return b, h // group if kv else h, 0 if whole else i, 0

        return pl.BlockSpec((None, None, rows, self.d), index)

    def row_spec(self, rows, *, whole=False):
        """Blocks of [rows] of a [B, H, S] array (lse, delta)."""
        return pl.BlockSpec((None, None, rows), lambda b, h, i: (b, h, 0 if whole else i))

    def length_spec(self):
        return pl.BlockSpec((1,), lambda b, h, i: (b,))

    def call(self, kernel, grid, in_specs, out_specs, out_shape, name):
        return pl.pallas_call(
            kernel,
            grid=grid,
            in_specs=in_specs,
            out_specs=out_specs,
            out_shape=out_shape,
            interpret=self.interpret,
            name=name,
        )


def _pallas_forward(plan: _Plan, q, k, v):
    """(out, lse) over the padded sequences: [B, Hq, Sq_pad, D] and [B, Hq, Sq_pad]."""
    q = plan.pad(q, plan.sq_pad)
    k, v = plan.pad(k, plan.sk_pad), plan.pad(v, plan.sk_pad)
    kernel = functools.partial(_forward_kernel, block_k=plan.bk, **plan.features)
    grid = (plan.b, plan.hq, plan.sq_pad // plan.bq)
    return plan.call(
        kernel,
        grid,
        [
            plan.length_spec(),
            plan.spec(plan.bq),
            plan.spec(plan.sk_pad, kv=True, whole=True),
            plan.spec(plan.sk_pad, kv=True, whole=True),
        ],
        [plan.spec(plan.bq), plan.row_spec(plan.bq)],
        [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(q.shape[:3], jnp.float32)],
        "flash_attention_forward",
    )(plan.lengths, q, k, v)


def _pallas_backward(plan: _Plan, q, k, v, grad):
    """dq, dk, dv: the forward is run again for its output and log-sum-exp (the kernel
    decorator hands a backward the inputs, not the forward's results)."""
    out, lse = _pallas_forward(plan, q, k, v)
    q, do = plan.pad(q, plan.sq_pad), plan.pad(grad, plan.sq_pad)
    kp, vp = plan.pad(k, plan.sk_pad), plan.pad(v, plan.sk_pad)
    delta = jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32), axis=-1)
    args = (plan.lengths, q, kp, vp, do, lse, delta)
    full_q, full_rows = plan.spec(plan.sq_pad, whole=True), plan.row_spec(plan.sq_pad, whole=True)

    dkdv_shape = jax.ShapeDtypeStruct((plan.b, plan.hq, plan.sk_pad, plan.d), jnp.float32)
    dk, dv = plan.call(
        functools.partial(_dkdv_kernel, block_q=plan.bq, **plan.features),
        (plan.b, plan.hq, plan.sk_pad // plan.bk),
        [
            plan.length_spec(),
            full_q,
            plan.spec(plan.bk, kv=True),
            plan.spec(plan.bk, kv=True),
            full_q,
            full_rows,
            full_rows,
        ],
        [plan.spec(plan.bk), plan.spec(plan.bk)],
        [dkdv_shape, dkdv_shape],
        "flash_attention_dkdv",
    )(*args)

    dq = plan.call(
        functools.partial(_dq_kernel, block_k=plan.bk, **plan.features),
        (plan.b, plan.hq, plan.sq_pad // plan.bq),
        [
            plan.length_spec(),
            plan.spec(plan.bq),
            plan.spec(plan.sk_pad, kv=True, whole=True),
            plan.spec(plan.sk_pad, kv=True, whole=True),
            plan.spec(plan.bq),
            plan.row_spec(plan.bq),
            plan.row_spec(plan.bq),
        ],
        plan.spec(plan.bq),
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        "flash_attention_dq",
    )(*args)

    def per_kv_head(x):  # GQA: each group's query heads add into their kv head
        x = x.reshape(plan.b, plan.hkv, plan.hq // plan.hkv, plan.sk_pad, plan.d).sum(2)
        return x[:, :, : plan.sk].astype(k.dtype)

    return dq[:, :, : plan.sq], per_kv_head(dk), per_kv_head(dv)


# --- the ops ----------------------------------------------------------------------------------


def _use_pallas(impl: str) -> bool:
    return impl == "pallas" or (impl == "auto" and current_platform() != "cpu")


def _attention(q, k, v, lengths, *, impl, block_q, block_k, **features):
    if not _use_pallas(impl):
        return attention_reference(q, k, v, lengths, **features)
    plan = _Plan(q, k, lengths, block_q=block_q, block_k=block_k, **features)
    out, _ = _pallas_forward(plan, q, k, v)
    return out[:, :, : plan.sq]


def _attention_backward(q, k, v, lengths, grad, *, impl, block_q, block_k, **features):
    if not _use_pallas(impl):
        _, pullback = jax.vjp(lambda *a: attention_reference(*a, lengths, **features), q, k, v)
        return pullback(grad)
    plan = _Plan(q, k, lengths, block_q=block_q, block_k=block_k, **features)
    return _pallas_backward(plan, q, k, v, grad)


def _forward_with_lse(q, k, v, *, causal, scale, block_q, block_k):
    """The Pallas forward's output and log-sum-exp ([B, Hq, Sq], float32; +inf for a row
    that sees no key): F.scaled_dot_product_attention's overrideable backend
    (``kernels/attention.py``), whose backward takes the log-sum-exp."""
    plan = _Plan(
        q, k, None, causal=causal, scale=scale, window=None, softcap=None,
        block_q=block_q, block_k=block_k,
    )  # fmt: skip
    out, lse = _pallas_forward(plan, q, k, v)
    return out[:, :, : plan.sq], lse[:, :, : plan.sq]


# NOTE: called below autograd only (the overrideable backend's own backward runs
# flash_attention_dense_backward), so its derivative, jax.vjp of pallas_call, never runs
flash_attention_forward = pjrt_kernel(
    "pjrt::flash_attention_forward",
    _forward_with_lse,
    schema=(
        "(Tensor q, Tensor k, Tensor v, *, bool causal=False, float scale=1.0, "
        "int block_q=128, int block_k=128) -> (Tensor, Tensor)"
    ),
)

_STATICS = (
    'bool causal=False, float scale=1.0, int? window=None, float? softcap=None, str impl="auto", '
    "int block_q=128, int block_k=128"
)

flash_attention_dense = pjrt_kernel(
    "pjrt::flash_attention_dense",
    lambda q, k, v, **statics: _attention(q, k, v, None, **statics),
    schema=f"(Tensor q, Tensor k, Tensor v, *, {_STATICS}) -> Tensor",
    backward=lambda q, k, v, grad, **statics: _attention_backward(q, k, v, None, grad, **statics),
    reference=_torch_reference,
)

flash_attention_varlen = pjrt_kernel(
    "pjrt::flash_attention_varlen",
    _attention,
    schema=f"(Tensor q, Tensor k, Tensor v, Tensor lengths, *, {_STATICS}) -> Tensor",
    backward=lambda q, k, v, lengths, grad, **statics: (
        *_attention_backward(q, k, v, lengths, grad, **statics),
        None,
    ),
    reference=_torch_reference,
)


def _check(q, k, v, kv_lengths, causal, window, softcap, impl) -> None:
    """PyTorch-style errors for what the kernels cannot take."""
    name = "flash_attention"
    for label, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4:
            raise ValueError(
                f"{name}: expected {label} to be 4-D [batch, heads, seq, head_dim] "
                f"(scaled_dot_product_attention's layout), got {label}.shape={tuple(x.shape)}"
            )
    if k.shape != v.shape:
        raise ValueError(
            f"{name}: expected k and v of the same shape, got k.shape={tuple(k.shape)} "
            f"and v.shape={tuple(v.shape)}"
        )
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"{name}: expected q and k to agree in batch and head_dim, got "
            f"q.shape={tuple(q.shape)} and k.shape={tuple(k.shape)}"
        )
    if q.shape[1] % k.shape[1] != 0:
        raise ValueError(
            f"{name}: the number of query heads ({q.shape[1]}) must be a multiple of the "
            f"number of key/value heads ({k.shape[1]}) for grouped-query attention"
        )
    if not (q.dtype == k.dtype == v.dtype) or not q.is_floating_point():
        raise ValueError(
            f"{name}: expected q, k and v of one floating dtype, got {q.dtype}, {k.dtype} "
            f"and {v.dtype}"
        )
    if kv_lengths is not None and (
        kv_lengths.dim() != 1
        or kv_lengths.shape[0] != q.shape[0]
        or kv_lengths.is_floating_point()
        or kv_lengths.is_complex()
    ):
        raise ValueError(
            f"{name}: expected kv_lengths to be an integer tensor of shape [batch] = "
            f"[{q.shape[0]}], got {kv_lengths.dtype} of shape {tuple(kv_lengths.shape)}"
        )
    if window is not None and (not causal or window < 1):
        raise ValueError(
            f"{name}: window={window} needs causal=True and window >= 1 (query i sees "
            "keys in (i - window, i])"
        )
    if softcap is not None and softcap <= 0:
        raise ValueError(f"{name}: softcap must be positive, got {softcap}")
    if impl not in _IMPLS:
        raise ValueError(f"{name}: impl must be one of {', '.join(_IMPLS)}; got {impl!r}")


def _flash_attention(
    q,
    k,
    v,
    *,
    kv_lengths=None,
    causal=False,
    scale=None,
    window=None,
    softcap=None,
    impl="auto",
    block_q=128,
    block_k=128,
):
    """Attention over ``[batch, heads, seq, head_dim]`` tensors, by a Pallas kernel or XLA.

    Args:
        q: ``[B, Hq, Sq, D]``.
        k, v: ``[B, Hkv, Sk, D]``, ``Hq`` a multiple of ``Hkv`` (grouped-query attention).
        kv_lengths: an integer tensor ``[B]``: batch row ``b`` sees keys ``j < kv_lengths[b]``.
        causal: query ``i`` sees keys ``j <= i``.
        scale: the logits' factor; ``1 / sqrt(D)`` by default.
        window: with ``causal``, query ``i`` sees keys in ``(i - window, i]``.
        softcap: logits ``s`` become ``softcap * tanh(s / softcap)``.
        impl: ``"pallas"``, ``"reference"`` (XLA) or ``"auto"`` (the reference on the CPU
            platform, the kernel on accelerators).
        block_q, block_k: the kernel's query and key block sizes.

    Returns:
        ``[B, Hq, Sq, D]``; a row that sees no key is zeros.

    Example:
        >>> q = torch.randn(1, 4, 16, 32, device="pjrt")
        >>> kv = torch.randn(1, 2, 16, 32, device="pjrt")
        >>> torch.ops.pjrt.flash_attention(q, kv, kv, causal=True).shape
        torch.Size([1, 4, 16, 32])
    """
    _check(q, k, v, kv_lengths, causal, window, softcap, impl)
    statics = {
        "causal": causal,
        "scale": 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale,
        "window": window,
        "softcap": softcap,
        "impl": impl,
        "block_q": block_q,
        "block_k": block_k,
    }
    if kv_lengths is None:
        return flash_attention_dense(q, k, v, **statics)
    return flash_attention_varlen(q, k, v, kv_lengths, **statics)


_lib = torch.library.Library("pjrt", "FRAGMENT")
_lib.define(
    "flash_attention(Tensor q, Tensor k, Tensor v, *, Tensor? kv_lengths=None, "
    "bool causal=False, float? scale=None, int? window=None, float? softcap=None, "
    'str impl="auto", int block_q=128, int block_k=128) -> Tensor'
)
# NOTE: composite, so autograd, fake tensors and AOTAutograd see the kernel it calls
_lib.impl("flash_attention", _flash_attention, "CompositeImplicitAutograd")

flash_attention = torch.ops.pjrt.flash_attention
flash_attention.__doc__ = _flash_attention.__doc__
