"""``F.scaled_dot_product_attention`` on pjrt tensors: the flash kernel or XLA, per chip.

PyTorch's SDPA composite asks the device type which backend runs a call
(``_fused_sdp_choice_stub``, C++). pjrt's C++ extension (``device/guard.cpp``) answers
OVERRIDEABLE for the calls this module's kernel takes (no dropout; 3-D or 4-D float32,
float16 or bfloat16 tensors; equal heads, or grouped-query heads with ``enable_gqa``)
and MATH, PyTorch's own composite, for the others. So a call reaches
``aten::_scaled_dot_product_fused_attention_overrideable`` by PyTorch's own route,
eagerly and under ``torch.compile`` alike, and its backward is
``aten::_scaled_dot_product_fused_attention_overrideable_backward``, PyTorch's
derivative of it. pjrt's kernels of the two (:func:`forward`, :func:`backward`; the
same functions are ``torch.compile``'s decompositions of them) take one of two paths:

- ``"kernel"``: the Pallas flash kernel (``pjrt::flash_attention_forward``, which
  returns the log-sum-exp too, and ``flash_attention_dense``'s backward): blocked, the
  score matrix never materialized;
- ``"xla"``: attention written in PyTorch ops (scaled ``q @ k^T``, the mask, a
  softmax kept as its log-sum-exp, ``@ v``; the backward from the log-sum-exp), which
  pjrt lowers to XLA ops as any others, in float32 for half-precision inputs as
  PyTorch's math does.

The kernel takes calls without ``attn_mask`` on 4-D ``[batch, heads, seq, head_dim]``
tensors with ``k`` and ``v`` of one shape (``is_causal``, ``scale`` and grouped-query
attention are its own); other calls take the XLA path whatever the setting. Which path
a call that the kernel takes goes to is the setting ``torch_pjrt.config(attention=...)``
(``TORCH_PJRT_ATTENTION``):

- ``"auto"`` (default): the kernel on accelerators when the score matrix is at least
  ``_KERNEL_MIN_SCORES`` elements a head (below that XLA's fused path costs less than
  the kernel's blocks); XLA on the CPU platform, where the kernel runs interpreted;
- ``"kernel"``: the kernel (on the CPU too: interpreted, for tests);
- ``"xla"``: XLA always.

Each call of the overrideable op counts its path in ``torch_pjrt.metrics`` (table
``attention_paths``; calls PyTorch's math takes are not counted). Under
``torch.compile`` the choice is made while the graph is traced. Without the C++
extension (no compiler) PyTorch's math runs every call. See docs/kernels.md,
"F.scaled_dot_product_attention on pjrt".

Hugging Face models: ``attn_implementation="pjrt"`` (:func:`hf_attention`,
registered with transformers' ``AttentionInterface`` and ``AttentionMaskInterface`` when
transformers' modules load: ``runtime.imports.after_import``; nothing of transformers is
imported for it) runs the kernel for the calls with no mask, with the model's
sliding window and logit soft-cap, and transformers' SDPA attention for the others.
"""

from __future__ import annotations

import contextlib
import math

import torch

from torch_pjrt.config import settings
from torch_pjrt.runtime import events as metrics
from torch_pjrt.runtime.imports import after_import
from torch_pjrt.runtime.platform import current_platform

__all__ = ["backward", "choose", "decompositions", "forward", "hf_attention", "install"]

_aten = torch.ops.aten
_OVERRIDEABLE = _aten._scaled_dot_product_fused_attention_overrideable.default
_OVERRIDEABLE_BACKWARD = _aten._scaled_dot_product_fused_attention_overrideable_backward.default
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
# NOTE: the auto rule's size: 512 x 512 scores a head; a first cut, to be measured on
# each chip (docs/kernels.md): the kernel's win is memory and bandwidth, which short
# sequences do not need
_KERNEL_MIN_SCORES = 512 * 512


def _unsupported(q, k, v, attn_mask, dropout_p, enable_gqa) -> str | None:
    """Why the kernel cannot take this call, or None."""
    if attn_mask is not None:
        return "an attn_mask"
    if dropout_p:
        return "dropout"
    if not (q.dim() == k.dim() == v.dim() == 4):
        return "not 4-D [batch, heads, seq, head_dim]"
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        return "shapes the kernel does not take"
    if q.shape[1] != k.shape[1] and not (enable_gqa and q.shape[1] % k.shape[1] == 0):
        return "heads that differ without enable_gqa"
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in _FLOATS:
        return f"dtype {q.dtype}"
    return None


def choose(q, k, v, attn_mask=None, dropout_p=0.0, enable_gqa=False) -> tuple[str, str]:
    """The path of an SDPA call on pjrt tensors, ``"kernel"`` or ``"xla"``, and why."""
    wanted = settings.attention
    if wanted == "xla":
        return "xla", "attention='xla'"
    why_not = _unsupported(q, k, v, attn_mask, dropout_p, enable_gqa)
    if why_not is not None:
        return "xla", why_not
    if wanted == "kernel":
        return "kernel", "attention='kernel'"
    if current_platform() == "cpu":
        return "xla", "the CPU platform"
    if q.shape[2] * k.shape[2] < _KERNEL_MIN_SCORES:
        return "xla", "a short sequence"
    return "kernel", "an accelerator"


def _scale(query, scale) -> float:
    return 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale


def _path(query, key, value, attn_bias) -> str:
    # (the C++ choice sent only calls without dropout, heads equal or grouped)
    return choose(query, key, value, attn_bias, 0.0, enable_gqa=True)[0]


def _scores(query, key, value, attn_bias, is_causal, scale):
    """The XLA path's scaled, masked logits ``[..., Sq, Sk]`` and ``q``, ``k``, ``v`` in
    the accumulation dtype (float32 for half precision), ``k``'s and ``v``'s heads
    repeated for grouped-query attention."""
    acc = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    q, k, v = (x.to(acc) for x in (query, key, value))
    group = query.shape[-3] // key.shape[-3]
    if group != 1:
        k, v = (x.repeat_interleave(group, dim=-3) for x in (k, v))
    s = (q @ k.transpose(-2, -1)) * scale
    if attn_bias is not None:
        s = s.masked_fill(~attn_bias, -math.inf) if attn_bias.dtype == torch.bool else s + attn_bias
    if is_causal:  # (top-left: query i sees keys j <= i, as PyTorch's math)
        seen = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~seen, -math.inf)
    return s, q, k, v


def forward(
    query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False,
    return_debug_mask=False, *, scale=None,
):  # fmt: skip
    """pjrt's ``_scaled_dot_product_fused_attention_overrideable``: the output and the
    log-sum-exp of each query row (float32, +inf for a row that sees no key), by the
    kernel or XLA; no dropout (PyTorch's math takes those calls)."""
    if dropout_p:
        raise NotImplementedError(
            "_scaled_dot_product_fused_attention_overrideable on pjrt runs without dropout "
            f"(got dropout_p={dropout_p}); F.scaled_dot_product_attention sends calls with "
            "dropout to PyTorch's math backend, which pjrt runs"
        )
    scale = _scale(query, scale)
    path = _path(query, key, value, attn_bias)
    metrics.tally("attention_paths", path)
    if path == "kernel":
        from torch_pjrt.kernels.flash_attention import flash_attention_forward

        out, lse = flash_attention_forward(query, key, value, causal=is_causal, scale=scale)
    else:
        s, _, _, v = _scores(query, key, value, attn_bias, is_causal, scale)
        top = s.amax(-1, keepdim=True)
        top = torch.where(torch.isfinite(top), top, 0.0)  # (a row that sees no key)
        p = torch.exp(s - top)
        total = p.sum(-1, keepdim=True)
        out = ((p @ v) / torch.where(total == 0, 1.0, total)).to(query.dtype)
        lse = torch.where(total == 0, math.inf, total.log() + top).squeeze(-1).float()
    return out, lse, None, None, query.shape[-2], key.shape[-2], None, None, None


def backward(
    grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q,
    cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None,
):  # fmt: skip
    """pjrt's ``_scaled_dot_product_fused_attention_overrideable_backward``: the
    gradients of ``q``, ``k``, ``v`` and the bias (each as ``grad_input_mask`` asks), by
    the kernel's backward or from the log-sum-exp in PyTorch ops."""
    scale = _scale(query, scale)
    want_q, want_k, want_v, want_bias = grad_input_mask
    if _path(query, key, value, attn_bias) == "kernel":
        from torch_pjrt.kernels import flash_attention  # noqa: F401  (defines the op)

        dq, dk, dv = torch.ops.pjrt.flash_attention_dense_backward(
            query, key, value, grad_out, causal=is_causal, scale=scale, impl="pallas"
        )
        return dq, dk, dv, None
    s, q, k, v = _scores(query, key, value, attn_bias, is_causal, scale)
    p = torch.exp(s - logsumexp.to(s.dtype).unsqueeze(-1))
    do = grad_out.to(s.dtype)
    dv = p.transpose(-2, -1) @ do if want_v else None
    dp = do @ v.transpose(-2, -1)
    ds = p * (dp - (do * out.to(s.dtype)).sum(-1, keepdim=True))
    dq = (ds @ k) * scale if want_q else None
    dk = (ds.transpose(-2, -1) @ q) * scale if want_k else None
    group = query.shape[-3] // key.shape[-3]
    if group != 1:  # each kv head's gradient sums its group's query heads
        dk, dv = (
            None if g is None else g.unflatten(-3, (key.shape[-3], group)).sum(-3) for g in (dk, dv)
        )
    dbias = None
    if want_bias and attn_bias is not None and attn_bias.is_floating_point():
        dbias = ds.sum_to_size(attn_bias.shape).to(attn_bias.dtype)
    cast = lambda g, x: None if g is None else g.to(x.dtype)  # noqa: E731
    return cast(dq, query), cast(dk, key), cast(dv, value), dbias


def decompositions() -> dict:
    """The overrideable ops as ``torch.compile`` traces them (``compile/compiler.py``):
    the graph holds the ops each path runs."""
    return {_OVERRIDEABLE: forward, _OVERRIDEABLE_BACKWARD: backward}


# --- Hugging Face: attn_implementation="pjrt" -------------------------------------

HF_NAME = "pjrt"  # (a name with "flash" in it is taken for a FlashAttention package)
_IMPL_OF = {"auto": "auto", "kernel": "pallas", "xla": "reference"}


def hf_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs,
):
    """transformers' attention function ``"pjrt"``: ``[batch, heads, seq, dim]`` in,
    ``([batch, seq, heads, dim], None)`` out. With no ``attention_mask`` (transformers
    leaves it out when a batch has no padding) and no dropout it is
    ``torch.ops.pjrt.flash_attention`` (causal as transformers' SDPA attention decides:
    the module's ``is_causal`` for more than one query), the model's ``sliding_window``
    and ``softcap`` included, its ``impl`` following ``torch_pjrt.config(attention=...)``
    (``"auto"``: XLA's reference on the CPU, the kernel on accelerators). Other calls, and
    tensors not on pjrt, go to transformers' SDPA attention."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    is_causal = kwargs.get("is_causal")
    causal = bool(
        query.shape[2] > 1
        and (getattr(module, "is_causal", True) if is_causal is None else is_causal)
    )
    dropout = dropout if getattr(module, "training", False) else 0.0
    if (
        attention_mask is not None
        or dropout
        or query.device.type != "pjrt"
        or (sliding_window is not None and not causal)
    ):
        if softcap is not None:
            raise ValueError(
                f"attn_implementation='{HF_NAME}' runs a logit soft-cap only without an "
                "attention mask (a batch with padding has one): use "
                "attn_implementation='eager' for this model's padded batches"
            )
        return sdpa_attention_forward(  # (F.scaled_dot_product_attention counts its path)
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    from torch_pjrt.kernels.flash_attention import flash_attention

    metrics.tally("attention_paths", "kernel")
    out = flash_attention(
        query,
        key,
        value,
        causal=causal,
        scale=scaling,
        window=sliding_window,
        softcap=softcap,
        impl=_IMPL_OF[settings.attention],
    )
    return out.transpose(1, 2).contiguous(), None


def _register_attention(module) -> None:
    module.AttentionInterface.register(HF_NAME, hf_attention)


def _register_mask(module) -> None:
    module.AttentionMaskInterface.register(HF_NAME, module.sdpa_mask)


_lib = None


@contextlib.contextmanager
def unregistered():
    """SDPA without the overrideable backend for the duration: every call takes PyTorch's
    math (``torch_pjrt.export`` decomposes to it: an exported program takes no kernel
    decision of its own)."""
    from torch_pjrt.device import guard

    guard.set_sdpa_overrideable(False)
    try:
        yield
    finally:
        guard.set_sdpa_overrideable(True)


def install() -> None:
    """Give the overrideable SDPA ops their pjrt kernels (the C++ extension's choice
    sends calls to them), and register ``"pjrt"`` with transformers when its modules
    load; idempotent."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    _lib.impl(_OVERRIDEABLE.name().split("::")[1], forward, "PrivateUse1")
    _lib.impl(_OVERRIDEABLE_BACKWARD.name().split("::")[1], backward, "PrivateUse1")
    after_import("transformers.modeling_utils", _register_attention)
    after_import("transformers.masking_utils", _register_mask)
