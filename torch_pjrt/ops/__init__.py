"""ATen -> JAX lowerings, one registry (``registry.py``), files by op family."""

from __future__ import annotations

import logging

import torch

from torch_pjrt.device import guard
from torch_pjrt.ops import (  # noqa: F401  (each module registers its lowerings)
    activation,
    arithmetic,
    autocast,
    comparison,
    convolution,
    creation,
    decompositions,
    embedding,
    factorizations,
    fft,
    foreach,
    histogram,
    indexing,
    interpolation,
    linalg,
    loss,
    memory,  # noqa: F401  (registers the primitives)
    normalization,
    optim,
    pooling,
    random,
    recurrent,
    reduction,
    registry,
    scatter,
    segments,
    shape,
    sorting,
    special,
    unary,
    variants,
    views,
)
from torch_pjrt.ops import fallback as pjrt_fallback

log = logging.getLogger("torch_pjrt")

_lib: torch.library.Library | None = None
_fallback_lib: torch.library.Library | None = None


def _has_kernel(op, key: str) -> bool:
    """Whether ``op`` has a kernel registered for ``key`` (``PrivateUse1``) or for a
    composite key that serves it (CompositeImplicitAutograd's are checked apart).

    NOTE: not the dispatcher's computed table, which counts backend fallbacks too: once
    ours is registered, every op would have a PrivateUse1 kernel."""
    name, has = op.name(), torch._C._dispatch_has_kernel_for_dispatch_key
    keys = (key, "CompositeExplicitAutogradNonFunctional", "CompositeExplicitAutograd")
    return any(has(name, k) for k in keys)


def _impl(lib, op, fn) -> None:
    lib.impl(
        op._schema.name.split("::")[1]
        + ("." + op._overloadname if op._overloadname != "default" else ""),
        fn,
        "PrivateUse1",
    )


def _no_quantized(op, *args, **kwargs):
    """The boxed fallback of the ``QuantizedPrivateUse1`` key: every op that would make or
    take a quantized pjrt tensor."""
    raise NotImplementedError(
        f"torch_pjrt: quantized tensors (qint8, quint8, qint32, ...) are not supported on "
        f"pjrt ({op.name()} was asked to make or read one); quantize on the CPU, or keep "
        "the tensors in a floating dtype (bfloat16, float8 on chips that have it)"
    )


def install() -> None:
    """Register every kernel on the PrivateUse1 key (once per process)."""
    global _lib, _fallback_lib
    if _lib is not None:
        return
    lib = torch.library.Library("aten", "IMPL")
    done = set()
    in_cpp = views.IN_CPP if guard.native()[0] else frozenset()
    for op, fn in registry._RAW.items():
        if op not in in_cpp:  # (registered by the C++ library: device/guard.cpp)
            _impl(lib, op, fn)
        done.add(op)
    registry._TABLE.update(foreach.derive(registry._TABLE))
    kernels = {}
    for op, lowering in registry._TABLE.items():
        kernels[op] = kernel = registry.Kernel(op, lowering)
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
            # NOTE: a backend kernel would take such an op out of autograd (its
            # derivative is its decomposition's): eagerly the dispatcher decomposes it,
            # and the lowering serves compiled graphs (registry.graph_lookup) only
            continue
        _impl(lib, op, kernel)
        done.add(op)
    for op, kernel in kernels.items():
        variant = variants.inplace_variant(op)
        if variant is not None and variant not in done:
            _impl(lib, variant, variants.InplaceKernel(kernel, variant))
            done.add(variant)
        for variant, outs in variants.out_variants(op):
            if variant not in done:
                _impl(lib, variant, variants.OutKernel(kernel, variant, outs))
                done.add(variant)
    for op, fn in decompositions.kernels(done, _has_kernel):
        _impl(lib, op, fn)
        done.add(op)
    memory.register_host_pinning(lib)
    memory.register_storage_resize()
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(pjrt_fallback.boxed, "PrivateUse1")
    fallback.fallback(_no_quantized, "QuantizedPrivateUse1")
    autocast.install(lib, fallback)
    _lib, _fallback_lib = lib, fallback
