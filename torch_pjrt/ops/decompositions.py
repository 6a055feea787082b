"""PyTorch's own decompositions, used for ops without a direct lowering.

An op gets its decomposition as its pjrt kernel when it has no lowering, no raw
kernel, and no kernel PyTorch already runs for PrivateUse1 (CompositeExplicitAutograd
ops decompose by themselves). Exclusions are listed with their reason.
"""

from __future__ import annotations

import torch
from torch._decomp import core_aten_decompositions

from torch_pjrt.ops import registry

# op -> why its decomposition is not used on pjrt
EXCLUDED: dict = {}


def _decomp_kernel(op, fn):
    def kernel(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception:
            # arguments PyTorch refuses: its error in the CPU's words (the decomposition's
            # own check may word it otherwise: "torch.Size([8, 8, 1])" for "[8, 8, 1]")
            error = registry.meta_error(op, args, kwargs)
            if error is None:
                raise
            raise error from None

    return kernel


def kernels(done, has_kernel):
    """(op, kernel) pairs for ops that decompose on pjrt."""
    for op, fn in core_aten_decompositions().items():
        if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
            continue
        if op in done or op in EXCLUDED or fn.__module__.startswith("torch._refs"):
            # NOTE: _refs decompositions end in prims, whose eager impls call aten again
            continue
        if has_kernel(op, "PrivateUse1") or torch._C._dispatch_has_kernel_for_dispatch_key(
            op.name(), "CompositeImplicitAutograd"
        ):
            continue
        yield op, _decomp_kernel(op, fn)
