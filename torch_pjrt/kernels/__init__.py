"""Kernels: JAX and Pallas functions as PyTorch operators on pjrt tensors.

:func:`kernel` (``torch_pjrt.kernel``) makes a function of JAX arrays a real PyTorch
operator (``torch.library``) whose lowering is the function: it runs in every mode,
is one node under ``torch.compile(backend="pjrt")`` and is differentiable. See
docs/kernels.md.

Example:
    >>> @torch_pjrt.kernel("mylib::scale_add")
    ... def scale_add(x, bias, *, scale: float = 1.0):
    ...     return x * scale + bias
"""

from __future__ import annotations

from torch_pjrt.kernels.decorator import KernelError, KernelOp, definition, infer_schema, kernel

__all__ = ["KernelError", "KernelOp", "definition", "infer_schema", "kernel"]
