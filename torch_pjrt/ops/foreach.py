"""``_foreach_*`` ops from their elementwise lowerings: one program per list, not per tensor.

PyTorch's optimizers call ``_foreach_add_``, ``_foreach_addcdiv_``, ``_foreach_lerp_``...
over all parameters at once. Every one of them also has a per-tensor composite
fallback; a derived lowering runs the whole list as a single jitted program instead.
The in-place forms (``_foreach_add_``) are derived from these by the registry.
"""

from __future__ import annotations

import inspect

import torch

from torch_pjrt.ops.registry import HostCheck, Lowering, Signature

aten = torch.ops.aten

# foreach overload name -> the elementwise overload applied to each element
_BINARY = {"Scalar": "Scalar", "List": "Tensor", "ScalarList": "Scalar", "Tensor": "Tensor"}
_PLAN = {
    **{f"{op}.{k}": f"{op}.{v}" for op in ("add", "sub", "mul", "div") for k, v in _BINARY.items()},
    "addcmul.Scalar": "addcmul.default",
    "addcmul.ScalarList": "addcmul.default",
    "addcdiv.Scalar": "addcdiv.default",
    "addcdiv.ScalarList": "addcdiv.default",
    "lerp.Scalar": "lerp.Scalar",
    "lerp.ScalarList": "lerp.Scalar",
    "lerp.List": "lerp.Tensor",
    "maximum.List": "maximum.default",
    "minimum.List": "minimum.default",
    "clamp_min.Scalar": "clamp_min.default",
    "clamp_min.List": "clamp_min.Tensor",
    "clamp_max.Scalar": "clamp_max.default",
    "clamp_max.List": "clamp_max.Tensor",
    "pow.Scalar": "pow.Tensor_Scalar",
    "pow.ScalarList": "pow.Tensor_Scalar",
    "pow.List": "pow.Tensor_Tensor",
    "pow.ScalarAndTensor": "pow.Scalar",  # scalar ** each tensor (Adam's bias correction)
}
_UNARY = (
    "abs acos asin atan ceil cos cosh erf erfc exp expm1 floor frac lgamma log log10 log1p "
    "log2 neg reciprocal round rsqrt sigmoid sign sin sinh sqrt tan tanh trunc zero"
).split()


def _overload(qualified: str):
    name, overload = qualified.split(".")
    packet = getattr(aten, name, None)
    if packet is None or overload not in packet.overloads():
        return None
    return getattr(packet, overload)


def _plans():
    for key, target in _PLAN.items():
        yield f"_foreach_{key}", target
    for name in _UNARY:
        yield f"_foreach_{name}.default", f"{name}.default"


def _per_element(fn, names, base_names, listed):
    """A lowering over lists: element i gets element i of every listed argument."""

    def lowered(**kwargs):
        length = len(kwargs[next(n for n in names if n in listed)])
        outs = []
        for i in range(length):
            call = {}
            for name, base_name in zip(names, base_names):
                value = kwargs[name]
                call[base_name] = value[i] if name in listed else value
            outs.append(fn(**call))
        return outs

    return lowered


def derive(table: dict) -> dict:
    """Lowerings for the ``_foreach_*`` overloads whose elementwise op is lowered."""
    derived = {}
    for foreach_name, base_name in _plans():
        foreach, base = _overload(foreach_name), _overload(base_name)
        if foreach is None or base is None or base not in table or foreach in table:
            continue
        sig, base_sig = Signature(foreach), Signature(base)
        if len(sig.names) > len(base_sig.names):
            continue
        listed = {
            name
            for name, a in zip(sig.names, foreach._schema.arguments)
            if str(a.type) in ("List[Tensor]", "List[number]")
        }
        fn = _per_element(table[base].fn, sig.names, base_sig.names, listed)
        check = HostCheck.of(table[base], base_sig)
        host = None if check is None else _checked_per_element(check, sig, base_sig, listed)
        derived[foreach] = Lowering(fn, host=host)
    return derived


def _key(value):
    """What a host check reads of a list's element: a tensor's dtype, a number (its type
    too: 300 overflows int8 where 300.0 promotes to float)."""
    dtype = getattr(value, "dtype", None)
    return (value.__class__, value) if dtype is None else dtype


def _checked_per_element(check: HostCheck, sig: Signature, base_sig: Signature, listed):
    """The elementwise op's host check (a clamp bound that overflows an int8 element, an
    integer element to a negative power) made on each element's arguments: once per
    distinct element dtypes and numbers (an optimizer's list is checked once)."""
    pairs = [(name, base_sig.index[base]) for name, base in zip(sig.names, base_sig.names)]
    columns = [n for n in sig.names if n in listed]

    def host(**kwargs):
        distinct = {}
        keys = zip(*([_key(v) for v in kwargs[n]] for n in columns))
        for i, key in enumerate(keys):
            distinct.setdefault(key, i)
        for i in distinct.values():
            vals = list(base_sig.defaults)
            for name, j in pairs:
                vals[j] = kwargs[name][i] if name in listed else kwargs[name]
            check(vals)

    keyword = inspect.Parameter.KEYWORD_ONLY  # (HostCheck passes the arguments it names)
    host.__signature__ = inspect.Signature([inspect.Parameter(n, keyword) for n in sig.names])
    return host
