"""Decode attention over a paged KV cache: ``torch.ops.pjrt.paged_attention``.

One new query token per sequence attends to that sequence's cached keys and values,
which live in fixed-size blocks ("pages") of a shared cache, as in vLLM's PagedAttention.
The conventions are vLLM's, so a serving backend can hand its tensors over as they are:

- ``q``: ``[B, Hq, D]``, one token per sequence.
- ``k_pages``, ``v_pages``: ``[num_blocks, block_size, Hkv, D]``, the layout of vLLM's
  GPU (FlashAttention) KV cache, one tensor each for keys and values.
- ``block_tables``: ``[B, max_blocks]`` integers; entry ``[b, i]`` is the physical block
  holding tokens ``i * block_size ... (i + 1) * block_size - 1`` of sequence ``b``.
  Entries past a sequence's last block are never read by the kernels (the reference
  gathers and masks them), so any in-range padding (vLLM pads with 0) does.
- ``context_lens``: ``[B]`` integers, the tokens of each sequence, the new one included
  (its key and value are written to the cache before this call, as vLLM does).
- GQA: ``Hq % Hkv == 0``; query head ``h`` reads KV head ``h // (Hq // Hkv)``.
- ``scale`` defaults to ``D ** -0.5``; ``softcap`` caps the scaled logits as
  ``softcap * tanh(logits / softcap)`` (Gemma 2). A sequence of length 0 gives zeros (JAX's
  TPU kernel's too in interpret mode; not checked on a chip).
- Output ``[B, Hq, D]`` in ``q``'s dtype; the softmax accumulates in float32.

Forward only: decoding needs no gradient, so asking for one raises an error (the op's
backward says so) instead of differentiating a Pallas kernel JAX cannot differentiate.

Paths (``impl=``, static):

- ``"reference"``: :func:`paged_attention_reference`, plain ``jax.numpy``: gather each
  sequence's pages through its block table, mask, softmax, weighted sum.
- ``"pallas"``: on the CPU platform, :func:`paged_attention_pallas` (our kernel) with
  ``interpret=True``; on GPU the same kernel compiled by Triton: one program per
  (sequence, KV head), looping over the sequence's blocks with an online softmax, block
  ids read from the block table (an input); not yet run on a GPU. On TPU, JAX's own
  ``jax.experimental.pallas.ops.tpu.paged_attention`` (:func:`paged_attention_tpu`),
  which DMAs pages from HBM; our kernel maps a head's whole cache as one block, which
  Mosaic would have to fit in VMEM.
- ``"auto"``: ``"pallas"`` on TPU and GPU, the reference elsewhere (the CPU included:
  interpreting a kernel is slower than XLA's own code for the reference).

``torch.ops.pjrt.paged_attention_kv`` (:func:`paged_attention_kv`) is the same attention
over one cache of keys and values side by side, ``kv_pages [num_blocks, Hkv, block_size,
D + Dv]``, the layout of pjrt's vLLM backend (``torch_pjrt/serving/vllm/attention.py``:
one write stores a token's key and value); it also returns each query's log-sum-exp, so
that the caller can merge attention over keys not in the cache. Its Pallas kernel is
the same loop (:func:`_online_softmax`); it has no TPU kernel (``"auto"``: Pallas on GPU
only).

JAX's GPU kernel (``jax.experimental.pallas.ops.gpu.paged_attention``) is not used: it
wants ``[Hkv, num_blocks, block_size, D]`` pages, and converting vLLM's layout would
copy the whole cache on every decode step. JAX's TPU kernel wants that layout too, and
is given a transposed copy.
TODO(#20): keep a TPU cache head-major so that copy goes away.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import torch
from jax.experimental import pallas as pl

from torch_pjrt.kernels.decorator import kernel
from torch_pjrt.runtime.platform import GPU_PLATFORMS, current_platform

__all__ = [
    "paged_attention",
    "paged_attention_kv",
    "paged_attention_kv_pallas",
    "paged_attention_kv_reference",
    "paged_attention_pallas",
    "paged_attention_reference",
    "paged_attention_tpu",
]

_IMPLS = ("auto", "pallas", "reference")


def _check_heads_and_tables(name, q, hkv, block_tables, context_lens) -> None:
    """The rules both layouts share: grouped-query heads, one block-table row and one
    length per query."""
    batch, hq = q.shape[0], q.shape[1]
    if hq % hkv != 0:
        raise ValueError(
            f"{name}: the query heads ({hq}) must be a multiple of the KV heads ({hkv}) "
            "for grouped-query attention"
        )
    if len(block_tables.shape) != 2 or block_tables.shape[0] != batch:
        raise ValueError(
            f"{name}: expected block_tables of shape [B, max_blocks] with B={batch} "
            f"(q's batch), got {list(block_tables.shape)}"
        )
    if tuple(context_lens.shape) != (batch,):
        raise ValueError(
            f"{name}: expected context_lens of shape [{batch}] (q's batch), "
            f"got {list(context_lens.shape)}"
        )


def _check_shapes(q, k_pages, v_pages, block_tables, context_lens) -> None:
    """The shape rules, for JAX arrays and torch tensors alike."""
    name = "paged_attention"
    if len(q.shape) != 3:
        raise ValueError(f"{name}: expected q of shape [B, Hq, D], got {list(q.shape)}")
    if len(k_pages.shape) != 4:
        raise ValueError(
            f"{name}: expected k_pages of shape [num_blocks, block_size, Hkv, D], "
            f"got {list(k_pages.shape)}"
        )
    if tuple(v_pages.shape) != tuple(k_pages.shape):
        raise ValueError(
            f"{name}: expected v_pages of k_pages' shape {list(k_pages.shape)}, "
            f"got {list(v_pages.shape)}"
        )
    d = q.shape[2]
    hkv, dk = k_pages.shape[2], k_pages.shape[3]
    if dk != d:
        raise ValueError(f"{name}: q has head size {d} but k_pages has {dk}; they must match")
    _check_heads_and_tables(name, q, hkv, block_tables, context_lens)


def _check_impl(impl: str) -> None:
    if impl not in _IMPLS:
        raise ValueError(f"paged_attention: impl must be one of {_IMPLS}, got {impl!r}")


def _indices(x, what: str):
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"paged_attention: expected integer {what}, got {x.dtype}")
    return x.astype(jnp.int32)


def _softcapped(logits, softcap):
    return logits if softcap is None else softcap * jnp.tanh(logits / softcap)


# --- the reference ---------------------------------------------------------------------


def _attend(q, k, v, context_lens, *, scale: float, softcap=None):
    """Each query ``q [B, Hq, D]`` over its sequence's keys and values made contiguous
    (``k [B, T, Hkv, D]``, ``v [B, T, Hkv, Dv]``), the first ``context_lens[b]`` valid:
    ``(out [B, Hq, Dv], lse [B, Hq])`` in float32, the log-sum-exp of the scaled (and
    capped) scores, -inf for an empty sequence, whose output is zeros."""
    batch, hq, d = q.shape
    hkv = k.shape[2]
    qg = q.reshape(batch, hkv, hq // hkv, d).astype(jnp.float32)
    logits = jnp.einsum("bhgd,bthd->bhgt", qg, k.astype(jnp.float32), precision="highest")
    logits = _softcapped(logits * scale, softcap)
    valid = (jnp.arange(k.shape[1]) < context_lens[:, None])[:, None, None, :]
    logits = jnp.where(valid, logits, -jnp.inf)
    top = jnp.max(logits, axis=-1, keepdims=True)
    weights = jnp.where(valid, jnp.exp(logits - jnp.where(valid, top, 0.0)), 0.0)
    total = weights.sum(-1, keepdims=True)
    out = jnp.einsum("bhgt,bthd->bhgd", weights, v.astype(jnp.float32), precision="highest")
    out = out / jnp.where(total == 0, 1.0, total)
    lse = jnp.where(total == 0, -jnp.inf, top + jnp.log(total))[..., 0]
    return out.reshape(batch, hq, -1), lse.reshape(batch, hq)


@functools.partial(jax.jit, static_argnames=("scale", "softcap"))
def paged_attention_reference(
    q, k_pages, v_pages, block_tables, context_lens, *, scale: float, softcap=None
):
    """Paged decode attention in plain ``jax.numpy``: the kernels' ground truth.

    Example:
        >>> out = paged_attention_reference(q, k_pages, v_pages, tables, lens, scale=0.125)
    """
    batch, _, d = q.shape
    hkv = k_pages.shape[2]
    k = k_pages[block_tables].reshape(batch, -1, hkv, d)  # [B, T, Hkv, D]
    v = v_pages[block_tables].reshape(batch, -1, hkv, v_pages.shape[-1])
    out, _ = _attend(q, k, v, context_lens, scale=scale, softcap=softcap)
    return out.astype(q.dtype)


# --- our Pallas kernel -----------------------------------------------------------------


def _online_softmax(q, length, table, load, *, scale, softcap, block_size, dv):
    """An online softmax of queries ``q`` ``[G, D]`` over a sequence's blocks:
    ``(top, total, acc)``, the running maximum and sum of each query's weights and the
    weighted sum of values ``[G, Dv]``. ``load(block)`` gives a block's keys and values
    ``([block_size, D], [block_size, Dv])``; ``table`` is the sequence's row of the
    block table, ``length`` its tokens. Products are broadcast-multiply-sums, not dots:
    decode is bound by reading the cache, and this way no group size or block size is
    too small for a dot."""
    q = q.astype(jnp.float32) * scale
    group = q.shape[0]

    def step(i, carry):
        top, total, acc = carry
        k, v = load(table[i])
        k, v = k.astype(jnp.float32), v.astype(jnp.float32)
        logits = _softcapped(jnp.sum(q[:, None, :] * k[None], axis=-1), softcap)  # [G, bs]
        position = i * block_size + jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1)
        valid = position < length
        logits = jnp.where(valid, logits, -jnp.inf)
        new_top = jnp.maximum(top, jnp.max(logits, axis=-1))  # finite: a block has a token
        weights = jnp.where(valid, jnp.exp(logits - new_top[:, None]), 0.0)
        rescale = jnp.exp(top - new_top)
        total = rescale * total + weights.sum(-1)
        acc = rescale[:, None] * acc + jnp.sum(weights[:, :, None] * v[None], axis=1)
        return new_top, total, acc

    init = (
        jnp.full((group,), -jnp.inf, jnp.float32),
        jnp.zeros((group,), jnp.float32),
        jnp.zeros((group, dv), jnp.float32),
    )
    # (a length past the block table reads no further than the table, as the reference)
    n_blocks = jnp.minimum((length + block_size - 1) // block_size, table.shape[0])
    return jax.lax.fori_loop(0, n_blocks, step, init)


def _normalized(total, acc):
    return acc / jnp.where(total == 0, 1.0, total)[:, None]  # (an empty sequence: zeros)


def _paged_attention_body(tables_ref, lens_ref, q_ref, k_ref, v_ref, o_ref, **statics):
    """One (sequence, KV head) of vLLM's layout: ``q_ref`` is the head group's queries
    ``[G, D]``, ``k_ref``/``v_ref`` that KV head's whole cache ``[num_blocks,
    block_size, D]``, ``tables_ref`` the sequence's row of the block table."""
    _, total, acc = _online_softmax(
        q_ref[...],
        lens_ref[0],
        tables_ref,
        lambda block: (k_ref[block], v_ref[block]),
        dv=v_ref.shape[-1],
        **statics,
    )
    o_ref[...] = _normalized(total, acc).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("scale", "softcap", "interpret"))
def paged_attention_pallas(
    q,
    k_pages,
    v_pages,
    block_tables,
    context_lens,
    *,
    scale: float,
    softcap=None,
    interpret: bool = False,
):
    """Our Pallas kernel on vLLM's layout; ``interpret=True`` runs it on any platform.

    Example:
        >>> out = paged_attention_pallas(q, k_pages, v_pages, tables, lens, scale=0.125,
        ...                              interpret=True)
    """
    batch, hq, d = q.shape
    num_blocks, block_size, hkv, _ = k_pages.shape
    group = hq // hkv
    max_blocks = block_tables.shape[1]
    body = functools.partial(
        _paged_attention_body, scale=scale, softcap=softcap, block_size=block_size
    )
    heads = pl.BlockSpec((None, None, group, d), lambda b, h: (b, h, 0, 0))
    cache = pl.BlockSpec((num_blocks, block_size, None, d), lambda b, h: (0, 0, h, 0))
    out = pl.pallas_call(
        body,
        grid=(batch, hkv),
        in_specs=[
            pl.BlockSpec((None, max_blocks), lambda b, h: (b, 0)),
            pl.BlockSpec((1,), lambda b, h: (b,)),
            heads,
            cache,
            cache,
        ],
        out_specs=heads,
        out_shape=jax.ShapeDtypeStruct((batch, hkv, group, d), q.dtype),
        interpret=interpret,
        name="paged_attention",
    )(block_tables, context_lens, q.reshape(batch, hkv, group, d), k_pages, v_pages)
    return out.reshape(batch, hq, d)


# --- JAX's TPU kernel ------------------------------------------------------------------


def _pages_per_compute_block(max_blocks: int, block_size: int) -> int:
    """The most pages (a divisor of max_blocks, as JAX's kernel needs) in ~512 tokens."""
    fits = [n for n in range(1, max_blocks + 1) if max_blocks % n == 0]
    return max([n for n in fits if n * block_size <= 512] or [1])


def paged_attention_tpu(
    q, k_pages, v_pages, block_tables, context_lens, *, scale: float, softcap=None
):
    """JAX's TPU paged attention on vLLM's layout (pages transposed to head-major).

    JAX's kernel takes no scale: the query is scaled instead, which also puts the
    softcap on the scaled logits, as vLLM's is. Run it on the CPU platform under
    ``jax.experimental.pallas.tpu.force_tpu_interpret_mode()``.
    """
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention as tpu

    max_blocks = block_tables.shape[1]
    out = tpu(
        (q.astype(jnp.float32) * scale).astype(q.dtype),
        jnp.transpose(k_pages, (2, 0, 1, 3)),
        jnp.transpose(v_pages, (2, 0, 1, 3)),
        context_lens,
        block_tables,
        attn_logits_soft_cap=softcap,
        pages_per_compute_block=_pages_per_compute_block(max_blocks, k_pages.shape[1]),
    )
    return out.astype(q.dtype)


# --- the op ----------------------------------------------------------------------------


def _no_gradient(*args, **statics):
    raise NotImplementedError(
        "pjrt::paged_attention is forward only (decode attention needs no "
        "gradient); detach its inputs, or use torch.nn.functional.scaled_dot_product_"
        "attention on contiguous keys and values to train"
    )


def _attend_torch(q, k, v, context_lens, *, scale: float, softcap=None):
    """:func:`_attend` in PyTorch (for CPU tensors): ``(out, lse)``."""
    batch, hq, d = q.shape
    hkv = k.shape[2]
    qg = q.reshape(batch, hkv, hq // hkv, d).float()
    logits = torch.einsum("bhgd,bthd->bhgt", qg, k.float()) * scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    valid = (torch.arange(k.shape[1]) < context_lens[:, None])[:, None, None, :]
    logits = logits.masked_fill(~valid, -math.inf)
    lse = torch.logsumexp(logits, dim=-1)  # (-inf for an empty sequence)
    weights = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # (an empty sequence: zeros)
    out = torch.einsum("bhgt,bthd->bhgd", weights, v.float())
    return out.reshape(batch, hq, -1), lse.reshape(batch, hq)


def _check_integer(*named) -> None:
    """Block tables and lengths on the CPU must be integer tensors (``(tensor, what)``)."""
    for x, what in named:
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise TypeError(f"paged_attention: expected integer {what}, got {x.dtype}")


def _reference_torch(
    q, k_pages, v_pages, block_tables, context_lens, *, scale=None, softcap=None, impl="auto"
):
    """The op on CPU tensors: the reference in PyTorch."""
    _check_shapes(q, k_pages, v_pages, block_tables, context_lens)
    _check_impl(impl)
    _check_integer((block_tables, "block_tables"), (context_lens, "context_lens"))
    batch, _, d = q.shape
    hkv = k_pages.shape[2]
    scale = d**-0.5 if scale is None else scale
    tables = block_tables.long()
    k = k_pages[tables].reshape(batch, -1, hkv, d)
    v = v_pages[tables].reshape(batch, -1, hkv, v_pages.shape[-1])
    out, _ = _attend_torch(q, k, v, context_lens, scale=scale, softcap=softcap)
    return out.to(q.dtype)


def _prepared(q, block_tables, context_lens, scale, impl) -> tuple:
    """The ops' arguments as the paths take them: ``(block_tables, context_lens, scale)``
    (int32 indices, the default scale), ``impl`` checked."""
    _check_impl(impl)
    block_tables = _indices(block_tables, "block_tables")
    context_lens = _indices(context_lens, "context_lens")
    return block_tables, context_lens, q.shape[-1] ** -0.5 if scale is None else scale


def _chosen(name: str, impl: str, reference, kernels: dict, where: str):
    """The function of ``impl`` on the current platform: ``reference``, or the Pallas
    kernel ``kernels`` holds for the platform (key ``"gpu"`` for every GPU platform;
    ``where`` says which have one). ``"auto"``: the kernel on accelerators, the
    reference elsewhere (interpreting a kernel on the CPU is slower than XLA's code)."""
    platform = current_platform()
    found = kernels.get("gpu" if platform in GPU_PLATFORMS else platform)
    if impl == "auto":
        impl = "pallas" if found is not None and platform != "cpu" else "reference"
    if impl == "reference":
        return reference
    if found is None:
        raise NotImplementedError(
            f"{name}: impl='pallas' has no kernel for the {platform!r} platform ({where}); "
            "use impl='auto' or impl='reference'"
        )
    return found


@kernel("pjrt::paged_attention", backward=_no_gradient, reference=_reference_torch)
def paged_attention(
    q,
    k_pages,
    v_pages,
    block_tables,
    context_lens,
    *,
    scale: float | None = None,
    softcap: float | None = None,
    impl: str = "auto",
):
    """Decode attention of ``q [B, Hq, D]`` over paged ``k_pages``/``v_pages``
    ``[num_blocks, block_size, Hkv, D]``, with vLLM's ``block_tables [B, max_blocks]`` and
    ``context_lens [B]``: ``[B, Hq, D]`` (see the module docstring).

    Example:
        >>> out = torch.ops.pjrt.paged_attention(q, k_pages, v_pages, tables, lens)
    """
    _check_shapes(q, k_pages, v_pages, block_tables, context_lens)
    block_tables, context_lens, scale = _prepared(q, block_tables, context_lens, scale, impl)
    kernels = {
        "tpu": paged_attention_tpu,
        "gpu": paged_attention_pallas,
        "cpu": functools.partial(paged_attention_pallas, interpret=True),
    }
    where = "TPU, GPU and, interpreted, the CPU"
    run = _chosen("paged_attention", impl, paged_attention_reference, kernels, where)
    return run(q, k_pages, v_pages, block_tables, context_lens, scale=scale, softcap=softcap)


# --- keys and values side by side: pjrt's vLLM cache -------------------------------------


def _check_shapes_kv(q, kv_pages, block_tables, context_lens) -> None:
    """The shape rules of :func:`paged_attention_kv`, for JAX arrays and torch tensors."""
    name = "paged_attention_kv"
    if len(q.shape) != 3:
        raise ValueError(f"{name}: expected q of shape [B, Hq, D], got {list(q.shape)}")
    if len(kv_pages.shape) != 4 or kv_pages.shape[3] <= q.shape[2]:
        raise ValueError(
            f"{name}: expected kv_pages of shape [num_blocks, Hkv, block_size, D + Dv] "
            f"(keys then values; D={q.shape[2]} is q's head size), got {list(kv_pages.shape)}"
        )
    _check_heads_and_tables(name, q, kv_pages.shape[1], block_tables, context_lens)


@functools.partial(jax.jit, static_argnames=("scale", "softcap"))
def paged_attention_kv_reference(q, kv_pages, block_tables, context_lens, *, scale, softcap=None):
    """:func:`paged_attention_kv` in plain ``jax.numpy``: ``(out, lse)``, the ground truth.

    Example:
        >>> out, lse = paged_attention_kv_reference(q, kv, tables, lens, scale=0.125)
    """
    batch, _, d = q.shape
    hkv, width = kv_pages.shape[1], kv_pages.shape[3]
    kv = jnp.swapaxes(kv_pages[block_tables], 2, 3).reshape(batch, -1, hkv, width)
    out, lse = _attend(q, kv[..., :d], kv[..., d:], context_lens, scale=scale, softcap=softcap)
    return out.astype(q.dtype), lse


def _paged_attention_kv_body(tables_ref, lens_ref, q_ref, kv_ref, o_ref, lse_ref, **statics):
    """One (sequence, KV head) of the side-by-side layout: ``kv_ref`` is the head's whole
    cache ``[num_blocks, block_size, D + Dv]``; also writes the log-sum-exp."""
    d = q_ref.shape[-1]
    top, total, acc = _online_softmax(
        q_ref[...],
        lens_ref[0],
        tables_ref,
        lambda block: (kv_ref[block, :, :d], kv_ref[block, :, d:]),
        dv=kv_ref.shape[-1] - d,
        **statics,
    )
    o_ref[...] = _normalized(total, acc).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(total == 0, -jnp.inf, top + jnp.log(total))


@functools.partial(jax.jit, static_argnames=("scale", "softcap", "interpret"))
def paged_attention_kv_pallas(
    q, kv_pages, block_tables, context_lens, *, scale: float, softcap=None, interpret=False
):
    """Our Pallas kernel on the side-by-side layout: ``(out, lse)``; ``interpret=True``
    runs it on any platform.

    Example:
        >>> out, lse = paged_attention_kv_pallas(q, kv, tables, lens, scale=0.125,
        ...                                      interpret=True)
    """
    batch, hq, d = q.shape
    num_blocks, hkv, block_size, width = kv_pages.shape
    group, dv = hq // hkv, width - d
    body = functools.partial(
        _paged_attention_kv_body, scale=scale, softcap=softcap, block_size=block_size
    )
    out, lse = pl.pallas_call(
        body,
        grid=(batch, hkv),
        in_specs=[
            pl.BlockSpec((None, block_tables.shape[1]), lambda b, h: (b, 0)),
            pl.BlockSpec((1,), lambda b, h: (b,)),
            pl.BlockSpec((None, None, group, d), lambda b, h: (b, h, 0, 0)),
            pl.BlockSpec((num_blocks, None, block_size, width), lambda b, h: (0, h, 0, 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, None, group, dv), lambda b, h: (b, h, 0, 0)),
            pl.BlockSpec((None, None, group), lambda b, h: (b, h, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((batch, hkv, group, dv), q.dtype),
            jax.ShapeDtypeStruct((batch, hkv, group), jnp.float32),
        ],
        interpret=interpret,
        name="paged_attention_kv",
    )(block_tables, context_lens, q.reshape(batch, hkv, group, d), kv_pages)
    return out.reshape(batch, hq, dv), lse.reshape(batch, hq)


def _reference_kv_torch(
    q, kv_pages, block_tables, context_lens, *, scale=None, softcap=None, impl="auto"
):
    """:func:`paged_attention_kv` on CPU tensors: the reference in PyTorch."""
    _check_shapes_kv(q, kv_pages, block_tables, context_lens)
    _check_impl(impl)
    _check_integer((block_tables, "block_tables"), (context_lens, "context_lens"))
    batch, _, d = q.shape
    hkv, width = kv_pages.shape[1], kv_pages.shape[3]
    scale = d**-0.5 if scale is None else scale
    kv = kv_pages[block_tables.long()].transpose(2, 3).reshape(batch, -1, hkv, width)
    out, lse = _attend_torch(
        q, kv[..., :d], kv[..., d:], context_lens, scale=scale, softcap=softcap
    )
    return out.to(q.dtype), lse


@kernel("pjrt::paged_attention_kv", backward=_no_gradient, reference=_reference_kv_torch)
def paged_attention_kv(
    q,
    kv_pages,
    block_tables,
    context_lens,
    *,
    scale: float | None = None,
    softcap: float | None = None,
    impl: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode attention over a paged cache of keys and values side by side: ``kv_pages
    [num_blocks, Hkv, block_size, D + Dv]`` (keys ``[..., :D]``, D being ``q``'s head
    size, values after them), as pjrt's vLLM backend keeps its cache so that one write
    stores a token's key and value. Returns ``(out [B, Hq, Dv], lse [B, Hq])``: the
    output in ``q``'s dtype and the float32 log-sum-exp of each query's scaled (capped)
    scores, -inf for an empty context, with which a caller merges attention over keys
    outside the cache (a step's own, not yet written). Otherwise as
    :func:`paged_attention`. ``impl="auto"``: our Pallas kernel on GPU, the reference
    elsewhere; TPU has no kernel for this layout (JAX's wants head-major pages).

    Example:
        >>> out, lse = torch.ops.pjrt.paged_attention_kv(q, kv_cache, tables, lens)
    """
    _check_shapes_kv(q, kv_pages, block_tables, context_lens)
    block_tables, context_lens, scale = _prepared(q, block_tables, context_lens, scale, impl)
    kernels = {
        "gpu": paged_attention_kv_pallas,
        "cpu": functools.partial(paged_attention_kv_pallas, interpret=True),
    }
    where = "GPU and, interpreted, the CPU"
    run = _chosen("paged_attention_kv", impl, paged_attention_kv_reference, kernels, where)
    return run(q, kv_pages, block_tables, context_lens, scale=scale, softcap=softcap)
