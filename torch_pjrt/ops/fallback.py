"""The fallback policy: what an op pjrt cannot lower does, and its one error class.

An op reaches here two ways: it has no lowering (PyTorch's boxed fallback on the
PrivateUse1 key calls :func:`boxed`), or its lowering *declines* these arguments (it
raises :func:`declined` while it traces, e.g. ``linalg.ldl_factor`` of a complex
Hermitian input; the kernel calls :func:`run`). Both take the same road:

- ``fallback="cpu"`` (the default): the op runs on the CPU, warned once per op and
  counted in ``metrics`` (``fallbacks``);
- ``fallback="error"`` (``TORCH_PJRT_FALLBACK=error``): :class:`LoweringMissing`;
- strict mode: ``StrictModeError``, raised by the strict-mode listener on the
  ``fallback`` event.
"""

from __future__ import annotations

import warnings

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from torch_pjrt.config import settings
from torch_pjrt.modes import fused
from torch_pjrt.runtime import events as metrics

__all__ = ["LoweringMissing", "boxed", "declined", "run"]


class LoweringMissing(NotImplementedError):
    """An ATen op reached the pjrt device and pjrt cannot lower it: it has no lowering
    (``reason`` None), or its lowering declines these arguments (``reason`` says why).

    Raised, rather than running the op on the CPU, when ``TORCH_PJRT_FALLBACK=error``;
    a lowering raises one made by :func:`declined` to hand its op to the fallback.
    """

    def __init__(self, op=None, reason: str | None = None):
        self.op = op
        self.reason = reason
        super().__init__(self._message())

    def _message(self) -> str:
        op = self.op
        if op is None:
            return f"pjrt: the lowering declines these arguments: {self.reason}"
        what = (
            "has no pjrt lowering"
            if self.reason is None
            else f"has a pjrt lowering that does not support these arguments ({self.reason})"
        )
        return (
            f"The operator '{op}' {what}, and TORCH_PJRT_FALLBACK=error forbids running it "
            f"on the CPU.\n  schema: {op._schema}\nUnset TORCH_PJRT_FALLBACK (or set it to "
            "'cpu') to run it on the CPU, and please report the op to the torch_pjrt issue "
            "tracker."
        )


def declined(reason: str) -> LoweringMissing:
    """The error a lowering raises for arguments it does not support: the op then takes
    the fallback road (the CPU by default), never reported as a torch_pjrt bug.

    Example:
        >>> if hermitian and jnp.iscomplexobj(self):
        ...     raise declined("hermitian=True on complex input")
    """
    return LoweringMissing(None, reason)


_warned: set[str] = set()


def run(op, args: tuple, kwargs: dict, reason: str | None = None):
    """Run ``op`` by the fallback policy (on the CPU, or raise; see the module doc)."""
    if settings.fallback == "error":
        raise LoweringMissing(op, reason)
    name = str(op)
    if fused.capturing:
        why = "has no pjrt lowering" if reason is None else f"is not lowered for {reason}"
        fused.capture_refuse(None, f"calls {name}, which {why} and would run on the CPU")
    metrics.fallback(name)
    if name not in _warned:
        _warned.add(name)
        why = "has no pjrt lowering" if reason is None else f"is not lowered for {reason}"
        warnings.warn(
            f"torch_pjrt: '{name}' {why} and runs on the CPU (slow: copies to the host and "
            "back). Set TORCH_PJRT_FALLBACK=error to make this an error.",
            stacklevel=4,
        )
    return _on_cpu(op, args, kwargs)


def boxed(op, *args, **kwargs):
    """PyTorch's boxed fallback on the PrivateUse1 key: ops with no pjrt kernel."""
    return run(op, args, kwargs)


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


def _on_cpu(op, args, kwargs):
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
