"""In-place and ``out=`` variants, derived from the functional op's schema and run by its
kernel (``registry.Kernel``): ``add_`` and ``add.out`` compute ``add``, then store the
result into ``self`` or ``out``."""

from __future__ import annotations

import warnings

import jax
import torch
from torch._ops import OpOverload

from torch_pjrt.device.tensor import replace, write
from torch_pjrt.ops import fallback
from torch_pjrt.ops._helpers import dtype_name
from torch_pjrt.ops.fallback import LoweringMissing
from torch_pjrt.ops.registry import Kernel
from torch_pjrt.runtime.transfer import torch_dtype

aten = torch.ops.aten


def _check_cast(result_dtype: torch.dtype, out: torch.Tensor) -> None:
    if not torch.can_cast(result_dtype, out.dtype):
        raise RuntimeError(
            f"result type {dtype_name(result_dtype)} can't be cast to the desired output type "
            f"{dtype_name(out.dtype)}"
        )


def _store(out: torch.Tensor, value: jax.Array, inplace: bool, warn: bool = True) -> None:
    if replace(out, value, owned=True):  # same shape and dtype, the whole storage
        return
    shape = tuple(value.shape)
    if tuple(out.shape) != shape:
        if inplace:
            raise RuntimeError(
                f"output with shape {list(out.shape)} doesn't match the broadcast shape "
                f"{list(shape)}"
            )
        resize_output(out, shape, warn)
    _check_cast(torch_dtype(value.dtype), out)
    write(out, value, owned=True)


def resize_output(out: torch.Tensor, shape, warn: bool = True) -> None:
    """Resize an ``out=`` tensor as PyTorch does, warning (if ``warn``) when it had
    elements."""
    if tuple(out.shape) == tuple(shape):
        return
    if warn and out.numel() != 0:
        warnings.warn(
            f"An output with one or more elements was resized since it had shape "
            f"{list(out.shape)}, which does not match the required output shape {list(shape)}. "
            "This behavior is deprecated, and in a future PyTorch release outputs will not be "
            "resized unless they have zero elements. You can explicitly reuse an out tensor t "
            "by resizing it, inplace, to zero elements with t.resize_(0).",
            UserWarning,
            stacklevel=3,
        )
    out.resize_(shape)


class InplaceKernel:
    """``op_(self, ...)`` from the functional op's lowering: compute, then write self."""

    def __init__(self, functional: Kernel, op: OpOverload):
        self.functional = functional
        self.op = op

    def __call__(self, *args, **kwargs):
        try:
            out, _ = self.functional.compute(args, kwargs)
        except LoweringMissing as exc:  # the lowering declines these arguments
            return fallback.run(self.op, args, kwargs, exc.reason)
        self_ = args[0] if args else kwargs["self"]
        if isinstance(self_, (list, tuple)):  # _foreach_*_: returns nothing
            for t, value in zip(self_, out):
                _store(t, value, inplace=True)
            return None
        _store(self_, out, inplace=True)
        return self_


# NOTE: with ``out=`` and no ``dtype``, PyTorch runs these in the out tensor's dtype
# (an int64 out sums the inputs cast to int64), not in the result type cast afterwards
_DTYPE_FROM_OUT = frozenset(
    {"aten::sum", "aten::prod", "aten::nansum", "aten::cumsum", "aten::cumprod"}
)
# NOTE: cat (and stack and _chunk_cat, which PyTorch builds on it) refuses an out dtype
# with a TypeError of its own, not TensorIterator's RuntimeError
_CAT_LIKE = frozenset({"aten::cat", "aten::stack", "aten::_chunk_cat"})
# NOTE: PyTorch's kernels for these resize a wrong-shaped out without the warning
_SILENT_RESIZE = frozenset({"aten::addbmm", "aten::log_sigmoid_forward"})


class OutKernel:
    """``op.out(..., out=...)`` from the functional op's lowering."""

    def __init__(self, functional: Kernel, op: OpOverload, out_names: list[str]):
        self.functional = functional
        self.op = op
        self.out_names = out_names
        name = functional.op._schema.name
        dtype_from_out = name in _DTYPE_FROM_OUT
        self.dtype_index = functional.sig.index.get("dtype") if dtype_from_out else None
        self.cat_like = name in _CAT_LIKE
        self.warn_on_resize = name not in _SILENT_RESIZE

    def __call__(self, *args, **kwargs):
        given = dict(kwargs)
        outs = [kwargs.pop(name) for name in self.out_names]
        sig = self.functional.sig
        if self.dtype_index is not None and sig.values(args, kwargs)[self.dtype_index] is None:
            kwargs["dtype"] = outs[0].dtype
        try:
            result, index = self.functional.compute(args, kwargs)
        except LoweringMissing as exc:  # the lowering declines these arguments
            return fallback.run(self.op, args, given, exc.reason)
        results = result if len(outs) > 1 else (result,)
        for o, r in zip(outs, results):
            if o.device.type != "pjrt" or (o.device.index or 0) != index:
                raise RuntimeError(
                    f"Expected out tensor to have device pjrt:{index}, but got {o.device} instead"
                )
            if self.cat_like:
                _check_cat_cast(r, o)
            _store(o, r, inplace=False, warn=self.warn_on_resize)
        return outs[0] if len(outs) == 1 else tuple(outs)


def _check_cat_cast(value: jax.Array, out: torch.Tensor) -> None:
    if not torch.can_cast(torch_dtype(value.dtype), out.dtype):
        raise TypeError(
            f"torch.cat(): input types can't be cast to the desired output type "
            f"{dtype_name(out.dtype)}"
        )


# --- deriving variants from schemas -------------------------------------------------


def _arg_signature(op: OpOverload) -> tuple:
    return tuple(
        (a.name, str(a.type)) for a in op._schema.arguments if not (a.alias_info and a.is_out)
    )


def inplace_variant(op: OpOverload) -> OpOverload | None:
    """The ``op_`` overload with the same arguments as ``op`` (names and types)."""
    packet = getattr(aten, op._schema.name.split("::")[1] + "_", None)
    if packet is None:
        return None
    want = _arg_signature(op)
    for name in packet.overloads():
        variant = getattr(packet, name)
        first = variant._schema.arguments[0] if variant._schema.arguments else None
        if first is None or first.alias_info is None or not first.alias_info.is_write:
            continue
        if _arg_signature(variant) == want:
            return variant
    return None


def out_variants(op: OpOverload) -> list[tuple[OpOverload, list[str]]]:
    packet = getattr(aten, op._schema.name.split("::")[1])
    want = _arg_signature(op)
    found = []
    for name in packet.overloads():
        variant = getattr(packet, name)
        outs = [a.name for a in variant._schema.arguments if a.is_out]
        if outs and variant is not op and _arg_signature(variant) == want:
            found.append((variant, outs))
    return found
