"""``F.scaled_dot_product_attention`` on pjrt tensors: the flash kernel or XLA, per chip.

PyTorch chooses SDPA's backend in C++ (``_fused_sdp_choice``), which a backend written
in Python cannot extend. pjrt gives ``aten::scaled_dot_product_attention`` a kernel of
its own for the pjrt dispatch keys (autograd and below, so ``no_grad`` and
``inference_mode`` too), which takes one of two paths:

- ``"kernel"``: ``torch.ops.pjrt.flash_attention`` with ``impl="pallas"`` (blocked, the
  score matrix never materialized; its own backward);
- ``"xla"``: PyTorch's own composite (the math path: scaled ``q @ k^T``, the mask,
  ``_safe_softmax``, dropout, ``@ v``), which pjrt lowers to XLA ops as any others.

The kernel takes calls without ``attn_mask`` and dropout (``is_causal``, ``scale`` and
grouped-query attention are its own), on 4-D ``[batch, heads, seq, head_dim]`` tensors of
one floating dtype with ``k`` and ``v`` of one shape; other calls take the XLA path
whatever the setting. Which path a call that the kernel takes goes to is the setting
``torch_pjrt.config(attention=...)`` (``TORCH_PJRT_ATTENTION``):

- ``"auto"`` (default): the kernel on accelerators when the score matrix is at least
  ``_KERNEL_MIN_SCORES`` elements a head (below that XLA's fused path costs less than
  the kernel's blocks); XLA on the CPU platform, where the kernel runs interpreted;
- ``"kernel"``: the kernel (on the CPU too: interpreted, for tests);
- ``"xla"``: XLA always.

Each call counts its path in ``torch_pjrt.metrics`` (table ``attention_paths``). Under
``torch.compile`` the choice is made while Dynamo traces, and the graph holds the
kernel's op or the math path's ops. See docs/kernels.md, "F.scaled_dot_product_attention on pjrt".

Hugging Face models: ``attn_implementation="pjrt"`` (:func:`hf_attention`,
registered with transformers' ``AttentionInterface`` and ``AttentionMaskInterface`` when
transformers' modules load: ``runtime.imports.after_import``; nothing of transformers is
imported for it) runs the kernel for the calls with no mask, with the model's
sliding window and logit soft-cap, and transformers' SDPA attention for the others.
"""

from __future__ import annotations

import contextlib

import torch

from torch_pjrt.config import settings
from torch_pjrt.runtime import events as metrics
from torch_pjrt.runtime.imports import after_import
from torch_pjrt.runtime.platform import current_platform

__all__ = ["choose", "hf_attention", "install"]

_SDPA = torch.ops.aten.scaled_dot_product_attention.default
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


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
    scale, enable_gqa = kwargs.get("scale"), kwargs.get("enable_gqa", False)
    path, _ = choose(query, key, value, attn_mask, dropout_p, enable_gqa)
    metrics.tally("attention_paths", path)
    if path == "xla":
        return _SDPA.decompose(query, key, value, attn_mask, dropout_p, is_causal, **kwargs)
    from torch_pjrt.kernels.flash_attention import flash_attention

    return flash_attention(query, key, value, causal=is_causal, scale=scale, impl="pallas")


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
    """``aten::scaled_dot_product_attention`` without its pjrt kernel for the duration
    (``torch_pjrt.export`` decomposes it to PyTorch's math: an exported program takes no
    kernel decision of its own)."""
    global _lib
    lib, _lib = _lib, None
    if lib is not None:
        lib._destroy()
    try:
        yield
    finally:
        if lib is not None:
            install()


def install() -> None:
    """Give ``aten::scaled_dot_product_attention`` its pjrt kernel, and register
    ``"pjrt"`` with transformers when its modules load; idempotent."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    for key in ("PrivateUse1", "AutogradPrivateUse1"):
        _lib.impl("scaled_dot_product_attention", _sdpa, key)
    after_import("transformers.modeling_utils", _register_attention)
    after_import("transformers.masking_utils", _register_mask)
