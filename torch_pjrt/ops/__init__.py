"""ATen -> JAX lowerings, one registry (``registry.py``), files by op family."""

from __future__ import annotations

import logging
import warnings

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from torch_pjrt.config import settings
from torch_pjrt.diagnostics import metrics
from torch_pjrt.ops import (  # noqa: F401  (each module registers its lowerings)
    autocast,
    creation,
    decompositions,
    elementwise,
    fft,
    foreach,
    graph,
    indexing,
    linalg,
    memory,  # noqa: F401  (registers the primitives)
    nn,
    nn_extra,
    optim,
    random,
    reduction,
    registry,
    sampling,
    shape,
    special,
)

log = logging.getLogger("torch_pjrt")

_lib: torch.library.Library | None = None
_fallback_lib: torch.library.Library | None = None
_warned: set[str] = set()


def _has_kernel(op, key: str) -> bool:
    return torch._C._dispatch_has_computed_kernel_for_dispatch_key(op.name(), key)


def _impl(lib, op, fn) -> None:
    lib.impl(
        op._schema.name.split("::")[1]
        + ("." + op._overloadname if op._overloadname != "default" else ""),
        fn,
        "PrivateUse1",
    )


def install() -> None:
    """Register every kernel on the PrivateUse1 key (once per process)."""
    global _lib, _fallback_lib
    if _lib is not None:
        return
    lib = torch.library.Library("aten", "IMPL")
    done = set()
    for op, fn in registry._RAW.items():
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
        variant = registry.inplace_variant(op)
        if variant is not None and variant not in done:
            _impl(lib, variant, registry.InplaceKernel(kernel))
            done.add(variant)
        for variant, outs in registry.out_variants(op):
            if variant not in done:
                _impl(lib, variant, registry.OutKernel(kernel, outs))
                done.add(variant)
    for op, fn in decompositions.kernels(done, _has_kernel):
        _impl(lib, op, fn)
        done.add(op)
    memory.register_host_pinning(lib)
    memory.register_storage_resize()
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(_cpu_fallback, "PrivateUse1")
    autocast.install(lib, fallback)
    _lib, _fallback_lib = lib, fallback


def _first_pjrt_index(flat) -> int:
    for x in flat:
        if isinstance(x, torch.Tensor) and x.device.type == "pjrt":
            return x.device.index or 0
    return 0


def _write_back(orig, new) -> None:
    if isinstance(orig, torch.Tensor) and orig.device.type == "pjrt":
        if orig.shape != new.shape:
            orig.resize_(new.shape)
        orig.copy_(new)


def _cpu_fallback(op, *args, **kwargs):
    """Run an op with no lowering on the CPU: a safety net, counted and warned once."""
    if settings.fallback == "error":
        raise registry.LoweringMissing(op)
    name = str(op)
    metrics.fallback(name)
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"torch_pjrt: '{name}' has no pjrt lowering and runs on the CPU (slow: copies to "
            "the host and back). Set TORCH_PJRT_FALLBACK=error to make this an error.",
            stacklevel=3,
        )
    flat, spec = tree_flatten((args, kwargs))
    index = _first_pjrt_index(flat)
    on_cpu = [
        x.cpu() if isinstance(x, torch.Tensor) and x.device.type == "pjrt" else x for x in flat
    ]
    cpu_args, cpu_kwargs = tree_unflatten(on_cpu, spec)
    result = op(*cpu_args, **cpu_kwargs)
    # write back every argument the op mutates (tensor lists element by element:
    # _fused_adamw_, _foreach_*_)
    schema_args = op._schema.arguments
    for i, a in enumerate(schema_args):
        if a.alias_info is not None and a.alias_info.is_write:
            orig = args[i] if i < len(args) else kwargs.get(a.name)
            new = cpu_args[i] if i < len(cpu_args) else cpu_kwargs.get(a.name)
            if isinstance(orig, (list, tuple)):
                for o, n in zip(orig, new):
                    _write_back(o, n)
            else:
                _write_back(orig, new)
    returns = op._schema.returns
    results = result if isinstance(result, tuple) else (result,)
    out = []
    for r_schema, r in zip(returns, results):
        alias = r_schema.alias_info
        if alias is not None and alias.is_write:
            # return the mutated pjrt argument itself
            for i, a in enumerate(schema_args):
                if a.alias_info is not None and a.alias_info.before_set == alias.before_set:
                    out.append(args[i] if i < len(args) else kwargs.get(a.name))
                    break
            continue
        if isinstance(r, torch.Tensor):
            out.append(r.to(f"pjrt:{index}"))
        elif isinstance(r, (list, tuple)):
            out.append(
                type(r)(x.to(f"pjrt:{index}") if isinstance(x, torch.Tensor) else x for x in r)
            )
        else:
            out.append(r)
    if not isinstance(result, tuple):
        return out[0] if out else result
    return tuple(out)
