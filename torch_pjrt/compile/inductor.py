"""``torch.compile`` with its default backend (inductor) on pjrt tensors.

Inductor generates Triton or C++ code for the devices it knows and has no code generator
for pjrt: a graph over pjrt tensors fails inside it (``KeyError: 'pjrt'``, or "Torch not
compiled with CUDA enabled" for FlexAttention). Code written for CUDA calls
``torch.compile(fn)`` with no backend all the time: transformers and TorchTitan compile
``flex_attention`` so, and models compile themselves. So that such code runs unchanged,
a graph that takes or makes pjrt tensors goes to the pjrt backend instead
(``compile/compiler.py``), with the mode the call asked for where the pjrt backend has
it (``"reduce-overhead"``: inductor's CUDA graphs option); inductor's own options
(``options=``) do not apply to it and are not read. Graphs without pjrt tensors are
inductor's, untouched.

The hook is the one entry point both ways of calling inductor go through,
``torch._inductor.compile_fx.compile_fx`` (``torch.compile``'s wrapper and Dynamo's
``"inductor"`` backend look it up at each compilation), wrapped when that module loads
(``runtime.imports.after_import``; nothing of inductor is imported for it). Each graph
taken over is counted in ``torch_pjrt.metrics`` (``inductor_graphs_on_pjrt``).
"""

from __future__ import annotations

import functools

import torch
from torch.utils._pytree import tree_leaves

from torch_pjrt.runtime import events as metrics
from torch_pjrt.runtime.imports import after_import

__all__ = ["install"]


def _pjrt(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "pjrt"


def _on_pjrt(gm, example_inputs) -> bool:
    """Whether a graph works on pjrt tensors: takes one, or makes one (``create_block_mask``
    takes sizes only and builds its masks with ``device="pjrt"``)."""
    if any(_pjrt(x) for x in example_inputs):
        return True
    for node in getattr(getattr(gm, "graph", None), "nodes", ()):
        value = node.meta.get("example_value", node.meta.get("val"))
        if any(_pjrt(v) for v in tree_leaves(value)):
            return True
    return False


def _wrap(module) -> None:
    compile_fx = module.compile_fx
    if getattr(compile_fx, "_pjrt", False):
        return

    @functools.wraps(compile_fx)
    def wrapped(model_, example_inputs_, *args, **kwargs):
        if not _on_pjrt(model_, example_inputs_):
            return compile_fx(model_, example_inputs_, *args, **kwargs)
        from torch_pjrt.compile.compiler import backend

        metrics.count("inductor_graphs_on_pjrt")
        patches = kwargs.get("config_patches") or {}
        mode = "reduce-overhead" if patches.get("triton.cudagraphs") else None
        return backend(model_, example_inputs_, mode=mode)

    wrapped._pjrt = True
    module.compile_fx = wrapped


def install() -> None:
    """Send inductor's graphs over pjrt tensors to the pjrt backend; idempotent."""
    after_import("torch._inductor.compile_fx", _wrap)
