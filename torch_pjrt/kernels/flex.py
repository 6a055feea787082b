"""FlexAttention (``torch.nn.attention.flex_attention``) on pjrt tensors.

torch 2.13 admits FlexAttention's inputs on a fixed list of device types
(``flex_attention._validate_device``: cuda, cpu, xpu, hpu, mps) and refuses the others
before anything runs; nothing else in FlexAttention depends on the device. Its pieces
all run on pjrt as they are: ``create_block_mask`` is ordinary tensor code, the
``flex_attention`` higher-order op has a dense implementation (``score_mod`` vmapped
over the score matrix, a masked softmax; PyTorch's own, which CPU PyTorch runs) and a
dense backward, and under ``torch.compile(backend="pjrt")`` both are traced into the
graph's XLA program (``compile/hops.py``).

So the one change is the least a device check allows: when that module loads
(``runtime.imports.after_import``; importing torch_pjrt imports nothing of it), its
``_validate_device``, which ``flex_attention`` looks up at each call and Dynamo at each
trace, is wrapped so that pjrt inputs pass; every other device goes to PyTorch's own
check unchanged. pjrt takes the backward too (torch refuses it on the CPU only because
its CPU kernel has none). The score matrix is materialized (``[batch, heads, q, kv]``
in float32), as the XLA path of SDPA does; the block mask's sparsity is not used to
skip work yet. See docs/kernels.md, "FlexAttention".
"""

from __future__ import annotations

import functools

from torch_pjrt.runtime.imports import after_import

__all__ = ["install"]


def _admit_pjrt(module) -> None:
    check = module._validate_device
    if getattr(check, "_pjrt", False):
        return

    @functools.wraps(check)
    def _validate_device(query, key, value):
        if query.device.type == "pjrt":
            return None  # q, k and v are on one device: FlexAttention has checked that
        return check(query, key, value)

    _validate_device._pjrt = True
    # torch_pjrt is on Dynamo's skip list; this check is traced like the code around it
    # (else ``fullgraph=True`` would fail on it). The module loaded Dynamo already.
    import torch._dynamo

    module._validate_device = torch._dynamo.dont_skip_tracing(_validate_device)


def install() -> None:
    """Let FlexAttention take pjrt tensors once its module loads; idempotent."""
    after_import("torch.nn.attention.flex_attention", _admit_pjrt)
