"""In-place and ``out=`` variants, derived from the functional op's schema and run by its
kernel (``registry.Kernel``): ``add_`` and ``add.out`` compute ``add``, then store the
result into ``self`` or ``out``."""

from __future__ import annotations

import math
import warnings

import jax
import torch
from torch._ops import OpOverload
from torch._prims_common import is_non_overlapping_and_dense_or_false as _dense

from torch_pjrt.device.tensor import _contiguous_strides, replace, write
from torch_pjrt.ops import fallback
from torch_pjrt.ops._helpers import dtype_name
from torch_pjrt.ops.fallback import LoweringMissing
from torch_pjrt.ops.registry import Kernel, meta_error
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
_SILENT_RESIZE = frozenset({"aten::addbmm", "aten::log_sigmoid_forward", "aten::narrow_copy"})
# NOTE: ATen's out= kernels of these refuse an out tensor that shares any memory with an
# input (assert_no_overlap), where TensorIterator's (pointwise ops) refuse a partial
# overlap only; both refuse an out tensor whose elements overlap each other
_NO_OVERLAP = frozenset(
    {
        "aten::cat",
        "aten::gather",
        "aten::index_select",
        "aten::kthvalue",
        "aten::mode",
        "aten::take",
    }
)
_NO_INTERNAL_OVERLAP = _NO_OVERLAP | {"aten::bernoulli"}
_INTERNAL_OVERLAP = (
    "unsupported operation: more than one element of the written-to tensor refers to a single "
    "memory location. Please clone() the tensor before performing the operation."
)
_OVERLAP = (
    "unsupported operation: some elements of the input tensor and the written-to tensor refer "
    "to a single memory location. Please clone() the tensor before performing the operation."
)
# c10's names of dtypes (TypeMeta), as structured kernels' out= checks print them
_TYPE_META = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16",
    torch.int64: "long int",
    torch.int32: "int",
    torch.int16: "short int",
    torch.int8: "signed char",
    torch.uint8: "unsigned char",
    torch.bool: "bool",
    torch.complex64: "c10::complex<float>",
    torch.complex128: "c10::complex<double>",
}


def _structured_dtype(result: torch.dtype, out: torch.dtype) -> str:
    return (
        f"Expected out tensor to have dtype {_TYPE_META.get(result, result)}, but got "
        f"{_TYPE_META.get(out, out)} instead"
    )


# NOTE: out= kernels that refuse an out of another dtype than the result's, in ATen's words
# (result dtype, out dtype -> message), where the Meta kernel of the out= overload does not
# check it; other mismatches are left to that Meta kernel, then to the cast rules
_EXACT_DTYPE = {
    "aten::aminmax": _structured_dtype,
    "aten::amax": lambda r, o: (
        f"Expected the dtype for input and out to match, but got {dtype_name(r)} for input's "
        f"dtype and {dtype_name(o)} for out's dtype."
    ),
    "aten::complex": lambda r, o: (
        f"Expected object of scalar type {dtype_name(r)} but got scalar type {dtype_name(o)} "
        "for argument 'out'"
    ),
}
_EXACT_DTYPE["aten::amin"] = _EXACT_DTYPE["aten::amax"]
# NOTE: out= kernels that take one out dtype only, whatever the inputs, and check it before
# they compute, in ATen's words (dtype, out dtype -> message). (Before the program runs: the
# CPU checks the input's rank and dtype first, so a tensor wrong in both is told the out's.)
_OUT_DTYPE = {
    "aten::multinomial": (
        torch.int64,
        lambda o: f"multinomial expects Long tensor out, got: {dtype_name(o)}",
    ),
}


def _overlap(a: torch.Tensor, b: torch.Tensor, shape=None) -> str | None:
    """ATen's ``get_overlap_status`` of two tensors: "full" (the same elements), "partial"
    or None (none, or too hard to tell: not dense). ``shape``: ``a`` resized to it first
    (as an out= tensor is, contiguous from its first element)."""
    if a is b and shape is None:
        return "full"
    numel = a.numel() if shape is None else math.prod(shape)
    if not numel or not b.numel():
        return None
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():  # (one per storage)
        return None
    if not ((shape is not None or _dense(a)) and _dense(b)):
        return None
    a0, b0 = a.data_ptr(), b.data_ptr()
    a1, b1 = a0 + numel * a.element_size(), b0 + b.numel() * b.element_size()
    if a0 == b0 and a1 == b1:
        strides = a.stride() if shape is None else _contiguous_strides(shape)
        return "full" if strides == b.stride() else "partial"
    return "partial" if a0 < b1 and b0 < a1 else None


def _tensor_args(args, kwargs):
    for v in (*args, *kwargs.values()):
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (t for t in v if isinstance(t, torch.Tensor))


def _check_overlap(outs, args, kwargs, any_overlap: bool, shapes=None) -> None:
    """ATen's memory overlap checks of out= tensors: ``assert_no_internal_overlap``, then
    ``assert_no_overlap`` with every input (``any_overlap``) or TensorIterator's
    ``assert_no_partial_overlap``. ``shapes``: the results' shapes, to check the out
    tensors that are resized to them (ATen checks after resizing) as they will be."""
    for i, o in enumerate(outs):
        shape = None if shapes is None else tuple(shapes[i])
        if shape is not None and shape == tuple(o.shape):
            continue
        if shape is None and torch._debug_has_internal_overlap(o) == 1:  # (2: too hard)
            raise RuntimeError(_INTERNAL_OVERLAP)
        for t in _tensor_args(args, kwargs):
            status = _overlap(o, t, shape)
            if status == "partial" or (status == "full" and any_overlap):
                raise RuntimeError(_OVERLAP)


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
        pointwise = torch.Tag.pointwise in functional.op.tags  # (TensorIterator's)
        self.no_overlap = name in _NO_OVERLAP
        self.check_overlap = pointwise or name in _NO_INTERNAL_OVERLAP
        self.exact_dtype = _EXACT_DTYPE.get(name)
        self.out_dtype = _OUT_DTYPE.get(name)

    def __call__(self, *args, **kwargs):
        given = dict(kwargs)
        outs = [kwargs.pop(name) for name in self.out_names]
        sig = self.functional.sig
        if self.dtype_index is not None and sig.values(args, kwargs)[self.dtype_index] is None:
            kwargs["dtype"] = outs[0].dtype
        if self.out_dtype is not None and outs[0].dtype != self.out_dtype[0]:
            raise RuntimeError(self.out_dtype[1](outs[0].dtype))
        if self.check_overlap:
            _check_overlap(outs, args, kwargs, self.no_overlap)
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
        if self.check_overlap:  # (out tensors resized to the results)
            _check_overlap(outs, args, kwargs, self.no_overlap, [r.shape for r in results])
        self._check_dtypes(outs, results, args, given)
        for o, r in zip(outs, results):
            if self.cat_like:
                _check_cat_cast(r, o)
            _store(o, r, inplace=False, warn=self.warn_on_resize)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _check_dtypes(self, outs, results, args, given) -> None:
        """PyTorch's refusal of an out tensor of another dtype than its result, by ops that
        do not cast their results to it: in ATen's words (:data:`_EXACT_DTYPE`), else as
        the out= overload's Meta kernel refuses it. A result that cannot be cast is left
        to the cast rules (:func:`_store`), which word it as TensorIterator does."""
        for o, r in zip(outs, results):
            result = torch_dtype(r.dtype)
            if result == o.dtype:
                continue
            if self.exact_dtype is not None:
                raise RuntimeError(self.exact_dtype(result, o.dtype))
            if self.cat_like or not torch.can_cast(result, o.dtype):
                return
            with warnings.catch_warnings():  # (a resized out warns once, in _store)
                warnings.simplefilter("ignore")
                error = meta_error(self.op, args, given)
            if error is not None:
                raise error
            return


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
    """The ``op_`` overload with the same arguments as ``op`` (names and types); an
    operator's is ``__iop__`` (``x <<= s`` calls ``__ilshift__``)."""
    name = op._schema.name.split("::")[1]
    dunder = name.startswith("__") and name.endswith("__")
    packet = getattr(aten, f"__i{name[2:]}" if dunder else name + "_", None)
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
