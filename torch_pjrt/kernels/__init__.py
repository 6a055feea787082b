"""Kernels: JAX and Pallas functions as PyTorch operators on pjrt tensors, and a library.

:func:`kernel` (``torch_pjrt.kernel``) makes a function of JAX arrays a real PyTorch
operator (``torch.library``) whose lowering is the function: it runs in every mode,
is one node under ``torch.compile(backend="pjrt")`` and is differentiable. See
docs/kernels.md.

The library (``torch.ops.pjrt.*``, one kernel per module with its reference beside it):
:func:`flash_attention`, :func:`paged_attention` and :func:`paged_attention_kv` (decode
over a paged KV cache, two layouts),
:func:`rms_norm`, :func:`layer_norm`, :func:`rotary_embedding`,
:func:`linear_cross_entropy` (no full logits), :func:`grouped_matmul` (mixture of
experts). Each takes ``impl=``: ``"auto"`` chooses per platform (the XLA reference on
the CPU, a Pallas kernel on accelerators), or force ``"pallas"`` / ``"reference"``. The
operators are defined when first used from here (``torch_pjrt.kernels.rms_norm``), or
all at once by :func:`load_library` (for code that calls ``torch.ops.pjrt.*`` directly).

Example:
    >>> @torch_pjrt.kernel("mylib::scale_add")
    ... def scale_add(x, bias, *, scale: float = 1.0):
    ...     return x * scale + bias
"""

from __future__ import annotations

import importlib

from torch_pjrt.kernels.decorator import KernelError, KernelOp, definition, infer_schema, kernel

# the library's modules, imported on first use (each defines its operators then: importing
# torch_pjrt defines none of them)
_LIBRARY = {
    "flash_attention": "flash_attention",
    "grouped_matmul": "grouped_matmul",
    "layer_norm": "layer_norm",
    "linear_cross_entropy": "linear_cross_entropy",
    "linear_cross_entropy_bias": "linear_cross_entropy",
    "paged_attention": "paged_attention",
    "paged_attention_kv": "paged_attention",
    "rms_norm": "rms_norm",
    "rotary_embedding": "rotary",
}

__all__ = ["KernelError", "KernelOp", "definition", "infer_schema", "kernel", *sorted(_LIBRARY)]


def __getattr__(name: str):
    module = _LIBRARY.get(name)
    if module is None:
        raise AttributeError(f"module 'torch_pjrt.kernels' has no attribute '{name}'")
    return getattr(importlib.import_module(f"torch_pjrt.kernels.{module}"), name)


def load_library() -> None:
    """Define every operator of the library (``torch.ops.pjrt.*``) now."""
    for module in set(_LIBRARY.values()):
        importlib.import_module(f"torch_pjrt.kernels.{module}")
