"""The one lowering registry: ATen overload -> function of JAX arrays.

A lowering is a plain function registered with :func:`lowers`. It takes the op's
schema arguments by name (JAX arrays for tensors, JAX scalars for ``Scalar``
arguments, Python values for everything else) and returns JAX arrays. Everything
about PyTorch tensors happens here, at the dispatch boundary: reading the storage
cells, checking devices, jitting and caching one program per static signature,
wrapping the results. In-place and ``out=`` variants are derived from the schema.
"""

from __future__ import annotations

import dataclasses
import functools
import keyword
import logging
import time
import warnings
from collections.abc import Callable

import jax
import torch
from torch._ops import OpOverload, OpOverloadPacket

from torch_pjrt import random as pjrt_random
from torch_pjrt import runtime
from torch_pjrt.config import settings
from torch_pjrt.diagnostics import checks, metrics
from torch_pjrt.modes import StrictModeError, fused
from torch_pjrt.runtime import x64
from torch_pjrt.tensor import read, read_lazy, read_on_device, replace, wrap, write

log = logging.getLogger("torch_pjrt")
aten = torch.ops.aten

__all__ = [
    "LoweringMissing",
    "Lowering",
    "graph_lookup",
    "lowers",
    "lowers_in_graphs",
    "lookup",
    "table",
]


@dataclasses.dataclass(frozen=True)
class Lowering:
    fn: Callable
    random: bool = False
    static: frozenset = frozenset()
    writes: tuple = ()


_TABLE: dict[OpOverload, Lowering] = {}
# lowerings used only inside traced graphs (torch.compile): ops whose eager kernel
# works on tensors (views, allocation, copies) but which are plain functions of
# values once a graph is functional
_GRAPH: dict[OpOverload, Lowering] = {}


def _is_functional(op: OpOverload) -> bool:
    schema = op._schema
    return not schema.is_mutable and not any(r.alias_info for r in schema.returns)


def _overloads(op) -> list[OpOverload]:
    if isinstance(op, OpOverload):
        return [op]
    if isinstance(op, OpOverloadPacket):
        found = [getattr(op, name) for name in op.overloads()]
        return [o for o in found if _is_functional(o)]
    raise TypeError(f"lowers() takes OpOverload or OpOverloadPacket objects, got {op!r}")


def lowers(*ops, random: bool = False, static: tuple = (), writes: tuple = ()):
    """Register a lowering for ATen ops; a packet expands to its functional overloads.

    Args:
        ops: ``torch.ops.aten.<name>.<overload>`` or ``torch.ops.aten.<name>`` objects.
        random: the lowering draws random numbers and takes a ``key`` argument.
        static: names of ``Scalar`` arguments that choose the algorithm (a norm's order):
            passed as Python values, one compiled program per value.
        writes: names of tensor arguments the op updates in place (batch norm's running
            statistics); the lowering returns the op's outputs followed by one new value
            (or None: unchanged) per name.

    A lowering may return None for an output the op leaves undefined (``output_mask``).

    Example:
        >>> @lowers(aten.neg)
        ... def neg(self):
        ...     return -self
    """

    def register(fn):
        for packet_or_op in ops:
            for op in _overloads(packet_or_op):
                if op in _TABLE:
                    raise RuntimeError(f"{op} has two lowerings: {_TABLE[op].fn} and {fn}")
                _TABLE[op] = Lowering(fn, random, frozenset(static), tuple(writes))
        return fn

    return register


def lowers_in_graphs(*ops, random: bool = False):
    """Register a lowering used only in traced graphs (``torch.compile``).

    For ops whose eager kernel must work on tensors (views alias their base, ``empty``
    allocates) but which, in a functional graph, are plain functions of values.
    """

    def register(fn):
        for packet_or_op in ops:
            overloads = (
                [packet_or_op]
                if isinstance(packet_or_op, OpOverload)
                else [
                    o
                    for o in (getattr(packet_or_op, n) for n in packet_or_op.overloads())
                    if not o._schema.is_mutable and not any(a.is_out for a in o._schema.arguments)
                ]
            )
            for op in overloads:
                if op in _TABLE or op in _GRAPH:
                    raise RuntimeError(f"{op} has two lowerings")
                _GRAPH[op] = Lowering(fn, random)
        return fn

    return register


def lookup(op: OpOverload) -> Lowering | None:
    return _TABLE.get(op)


def graph_lookup(op: OpOverload) -> Lowering | None:
    """The lowering of ``op`` inside a traced graph (eager lowerings included)."""
    found = _TABLE.get(op)
    return found if found is not None else _GRAPH.get(op)


def table() -> dict[OpOverload, Lowering]:
    return dict(_TABLE)


class LoweringMissing(NotImplementedError):
    """An ATen op reached the pjrt device and has no lowering."""

    def __init__(self, op: OpOverload):
        super().__init__(
            f"The operator '{op}' has no pjrt lowering, and TORCH_PJRT_FALLBACK=error forbids "
            f"running it on the CPU.\n  schema: {op._schema}\nUnset TORCH_PJRT_FALLBACK (or set "
            "it to 'cpu') to run it on the CPU, and please report the missing op to the "
            "torch_pjrt issue tracker."
        )


# --- argument kinds, from the schema ------------------------------------------------

_TENSOR, _TENSOR_LIST, _SCALAR, _STATIC = range(4)


def _kind(type_str: str) -> int:
    if type_str in ("Tensor", "Optional[Tensor]"):
        return _TENSOR
    if type_str in ("List[Tensor]", "List[Optional[Tensor]]"):
        return _TENSOR_LIST
    if type_str in ("number", "Optional[number]", "List[number]"):
        return _SCALAR
    return _STATIC


# c10::ScalarType numbering: schema defaults such as ``ScalarType dtype=long`` arrive
# as these integers
_SCALAR_TYPES = {
    **dict(
        enumerate(
            [
                torch.uint8,
                torch.int8,
                torch.int16,
                torch.int32,
                torch.int64,
                torch.float16,
                torch.float32,
                torch.float64,
                torch.complex32,
                torch.complex64,
                torch.complex128,
                torch.bool,
            ]
        )
    ),
    15: torch.bfloat16,
}


def _default(arg):
    if not arg.has_default_value():
        return None
    value = arg.default_value
    if arg.name == "dtype" and isinstance(value, int) and not isinstance(value, bool):
        return _SCALAR_TYPES[value]
    return value


def _py_name(name: str) -> str:
    return name + "_" if keyword.iskeyword(name) else name


def _same_device_error(a, b) -> RuntimeError:
    return RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"{a} and {b}!"
    )


class Signature:
    """How one overload's arguments split into arrays, dynamic scalars and statics."""

    def __init__(self, op: OpOverload, static: frozenset = frozenset()):
        args = op._schema.arguments
        self.op = op
        self.names = [_py_name(a.name) for a in args]
        self.positional = [a.name for a in args if not a.kwarg_only]
        self.defaults = [_default(a) for a in args]
        self.index = {a.name: i for i, a in enumerate(args)}
        self.kinds = [_STATIC if a.name in static else _kind(str(a.type)) for a in args]
        self.arrays = [i for i, k in enumerate(self.kinds) if k in (_TENSOR, _TENSOR_LIST)]
        self.scalars = [i for i, k in enumerate(self.kinds) if k == _SCALAR]
        self.statics = [i for i, k in enumerate(self.kinds) if k == _STATIC]
        self.device_arg = self.index.get("device")

    def values(self, args, kwargs) -> list:
        vals = list(args) + self.defaults[len(args) :]
        for name, value in kwargs.items():
            vals[self.index[name]] = value
        return vals


def _device_index(vals, sig: Signature) -> int:
    """The device of the op: its first pjrt tensor, else its ``device=`` argument."""
    for i in sig.arrays:
        v = vals[i]
        if isinstance(v, torch.Tensor) and v.device.type == "pjrt":
            return v.device.index or 0
        if isinstance(v, (list, tuple)):
            for t in v:
                if isinstance(t, torch.Tensor) and t.device.type == "pjrt":
                    return t.device.index or 0
    if sig.device_arg is not None:
        dev = vals[sig.device_arg]
        if dev is not None:
            dev = torch.device(dev)
            if dev.type == "pjrt":
                return dev.index if dev.index is not None else pjrt_random.current_device()
    return pjrt_random.current_device()


def _array_of(t, index: int, lazy: bool = False):
    if t is None or isinstance(t, (bool, int, float, complex)):
        return t  # a wrapped number: JAX traces it as a weakly typed scalar
    device = t.device
    if device.type == "pjrt":
        if (device.index or 0) != index:
            raise _same_device_error(f"pjrt:{index}", device)
        return read_lazy(t) if lazy else read(t)
    if t.dim() == 0:  # a CPU scalar tensor may meet device tensors, as with CUDA
        return runtime.from_host(t, runtime.device(index))
    raise _same_device_error(f"pjrt:{index}", device)


_SCALAR_ARRAYS: dict = {}


def _device_scalar(v):
    """A Python number as the weakly typed JAX scalar that jit makes of it, made once:
    a jitted call converts Python numbers on every call (about 1.5 us each), arrays it
    takes as they are. Numbers that compare equal but differ (-0.0 and 0.0, NaN) are
    passed through unconverted."""
    cls = v.__class__
    if cls is not int and cls is not float and cls is not bool and cls is not complex:
        return v
    key = (cls, v)
    found = _SCALAR_ARRAYS.get(key)
    if found is None:
        if v != v or (not v and (cls is float or cls is complex)):
            return v
        if len(_SCALAR_ARRAYS) >= 4096:
            _SCALAR_ARRAYS.clear()
        try:
            with jax.enable_x64(True):
                found = _SCALAR_ARRAYS[key] = jax.numpy.asarray(v)
        except OverflowError:  # (the jitted call raises its own error)
            return v
    return found


def traced_at_full_precision(fn):
    """``fn`` for ``jax.jit``: while it traces, JAX's default precision of float32
    products is "highest". JAX's own default is fast (TF32 on recent NVIDIA GPUs, one
    bfloat16 pass on TPU), so a product a lowering leaves to JAX (inside a ``jnp.linalg``
    or ``jax.scipy`` function, or written without ``precision=``) would otherwise be
    less precise there than on the CPU. User-level products carry
    ``ops.linalg.matmul_precision()`` explicitly and keep following
    ``torch.set_float32_matmul_precision``. Every eager, fused and compiled program is
    traced through this."""

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        with jax.default_matmul_precision("highest"):
            return fn(*args, **kwargs)

    return traced


def _signature(sig: Signature, statics, arrays, scalars) -> list:
    """(label, value) pairs describing one traced call, for compilation causes."""
    out = [(f"argument {sig.names[i]}", v) for i, v in zip(sig.statics, statics)]
    for i, v in zip(sig.arrays, arrays):
        name = sig.names[i]
        if isinstance(v, (list, tuple)):
            out.extend((f"{name}[{j}]", getattr(x, "aval", type(x))) for j, x in enumerate(v))
        else:
            out.append((name, getattr(v, "aval", type(v))))
    out.extend((sig.names[i], getattr(v, "aval", type(v))) for i, v in zip(sig.scalars, scalars))
    return out


def _static(v):
    if isinstance(v, list):
        return tuple(_static(x) for x in v)
    return v


def _program_key(vals, sig: Signature) -> tuple:
    """The key of an op's program cache: its static arguments, and the two settings the
    lowerings read when they trace (the default dtype, for factories with dtype=None; the
    float32 matmul precision)."""
    statics = sig.statics
    return (
        tuple([_static(vals[i]) for i in statics]) if statics else (),
        torch.get_default_dtype(),
        torch.get_float32_matmul_precision(),
    )


class Kernel:
    """The eager PrivateUse1 kernel of one lowered overload."""

    def __init__(self, op: OpOverload, lowering: Lowering):
        self.op = op
        self.name = str(op)
        self.lowering = lowering
        self.sig = Signature(op, lowering.static)
        self.cache: dict = {}
        self._traced = self._last_traced = None  # signatures, for compilation causes
        returns = op._schema.returns
        self.returns_list = len(returns) == 1 and str(returns[0].type) == "List[Tensor]"
        self.returns_tuple = len(returns) > 1
        self.returns_python = len(returns) == 1 and str(returns[0].type) not in (
            "Tensor",
            "List[Tensor]",
        )
        sig = self.sig
        # the plain eager call (see _plain_call): tensors, no lists, no randomness, no
        # writes, tensor results
        self.plain = not (
            lowering.random
            or lowering.writes
            or self.returns_list
            or self.returns_python
            or any(sig.kinds[i] == _TENSOR_LIST for i in sig.arrays)
        )
        self._scalar_defaults = [sig.defaults[i] for i in sig.scalars]
        # positional arguments given -> the defaults that complete them
        self._tails = {n: tuple(sig.defaults[n:]) for n in range(len(sig.defaults) + 1)}

    def _program(self, key):
        statics = key[0]
        sig, lowering = self.sig, self.lowering
        fn = lowering.fn

        def run(arrays, scalars, rng):
            self._traced = [
                ("default dtype", key[1]),
                ("float32 matmul precision", key[2]),
                *_signature(sig, statics, arrays, scalars),
            ]
            vals = [None] * len(sig.names)
            for i, v in zip(sig.arrays, arrays):
                vals[i] = v
            for i, v in zip(sig.scalars, scalars):
                vals[i] = sig.defaults[i] if v is None else v  # (None: the default, baked in)
            for i, v in zip(sig.statics, statics):
                vals[i] = v
            kwargs = dict(zip(sig.names, vals))
            if lowering.random:
                kwargs["key"] = jax.random.fold_in(jax.random.key(rng[0]), rng[1])
            return fn(**kwargs)

        program = jax.jit(traced_at_full_precision(run))
        self.cache[key] = program
        return program

    def compute(self, args, kwargs):
        """Run the lowering (in fused mode: record it); returns (JAX result, device index)."""
        sig = self.sig
        vals = sig.values(args, kwargs)
        index = _device_index(vals, sig)
        mode = settings.mode
        lazy = mode == "fused" and not (settings.check_nan or settings.check_numerics)
        arrays = []
        has_tensors = False
        for i in sig.arrays:
            v = vals[i]
            if isinstance(v, (list, tuple)):
                arrays.append([_array_of(t, index, lazy) for t in v])
                has_tensors = True
            else:
                arrays.append(_array_of(v, index, lazy))
                has_tensors = has_tensors or isinstance(v, torch.Tensor)
        scalars = [vals[i] for i in sig.scalars]
        if not lazy:  # (fused mode records Python numbers by value)
            scalars = [_device_scalar(v) for v in scalars]
        key = _program_key(vals, sig)
        program = self.cache.get(key)
        if program is None:
            program = self._program(key)
        rng = pjrt_random.next_key_parts(index) if self.lowering.random else None
        metrics.op(self.name)
        try:
            if lazy:
                try:
                    return fused.record(program, (arrays, scalars, rng), index, self.name), index
                except fused.Unfusable:  # an argument fused mode cannot record: run it now
                    arrays = fused.concrete(arrays)
            self._traced = None  # (set by the program when it traces: a compilation)
            start = time.perf_counter()
            with jax.enable_x64(True):
                out = program(arrays, scalars, rng)
                if index != 0 and not has_tensors:
                    out = jax.device_put(out, runtime.device(index))
        except StrictModeError:
            raise
        except Exception as exc:  # noqa: BLE001  (re-raised with PyTorch's message)
            out = _retry_on_mesh(program, arrays, scalars, rng)
            if out is None:
                raise _explain(self.op, args, kwargs, exc) from exc
        if self._traced is not None:
            self._note_compilation(start)
        if mode == "debug" or settings.check_nan or settings.check_numerics:
            checks.after_op(self.op, args, kwargs, out, self.lowering.random)
        return out, index

    def _plain_call(self, args):
        """The common eager call, with as little host work as possible: positional
        arguments, every tensor a pjrt tensor on one device, a program already built for
        the static arguments. None when anything else holds: :meth:`compute` runs."""
        sig = self.sig
        tail = self._tails.get(len(args))
        if tail is None:
            return None
        vals = args + tail
        index = None
        arrays = []
        for i in sig.arrays:
            v = vals[i]
            if isinstance(v, torch.Tensor):
                found = read_on_device(v) if v.layout is torch.strided else None
                if found is None or (index is not None and found[1] != index):
                    return None  # CPU scalars, device errors: the general path
                array, index = found
                arrays.append(array)
            else:  # None, or a wrapped Python number
                arrays.append(_device_scalar(v))
        if index is None:
            return None
        program = self.cache.get(_program_key(vals, sig))
        if program is None:
            return None
        # NOTE: a scalar at its schema default (add's alpha=1) is passed as None and
        # baked into a program of its own (jit keys on the None): one argument less per
        # call, about 0.4 us
        scalars = [
            None if v.__class__ is d.__class__ and v == d and (v or d.__class__ is not float)
            else _device_scalar(v)
            for v, d in zip([vals[i] for i in sig.scalars], self._scalar_defaults)
        ]  # fmt: skip
        self._traced = None
        start = time.perf_counter()
        prev = x64.on()
        try:
            out = program(arrays, scalars, None)
        except Exception:  # noqa: BLE001  (the general path raises PyTorch's error)
            return None
        finally:
            x64.restore(prev)
        metrics.op(self.name)
        if self._traced is not None:  # new shapes: jit compiled a program
            self._note_compilation(start)
        if self.returns_tuple:
            return tuple(None if a is None else wrap(a, index) for a in out)
        return wrap(out, index)

    def _note_compilation(self, start: float) -> None:
        cause = metrics.describe_change(self._last_traced, self._traced)
        self._last_traced = self._traced
        metrics.compilation("eager", None, time.perf_counter() - start, f"{self.name}: {cause}")

    def __call__(self, *args, **kwargs):
        if (
            self.plain
            and not kwargs
            and settings.mode == "eager"
            and not (settings.check_nan or settings.check_numerics)
        ):
            out = self._plain_call(args)
            if out is not None:
                return out
        out, index = self.compute(args, kwargs)
        writes = self.lowering.writes
        if writes:
            out = self._write_back(out, args, kwargs)
        if self.returns_python:
            metrics.host_sync()
            return fused.concrete(out, "host read").item()
        if self.returns_list:
            return [wrap(a, index) for a in out]
        if self.returns_tuple:
            return tuple(None if a is None else wrap(a, index) for a in out)
        return wrap(out, index)

    def _write_back(self, out, args, kwargs):
        writes = self.lowering.writes
        n = len(out) - len(writes)
        vals = self.sig.values(args, kwargs)
        for name, value in zip(writes, out[n:]):
            target = vals[self.sig.index[name]]
            if target is not None and value is not None:
                write(target, value)
        return out[:n] if n > 1 or self.returns_tuple else out[0]


def _retry_on_mesh(program, arrays, scalars, rng):
    """The program's result with one-device arguments replicated over the mesh of a
    sharded one (torch_pjrt.distributed.spmd: JAX refuses to mix them, PyTorch sees one
    device); None when no mesh is in use or nothing needed moving. Only failed calls get
    here, so the common path pays nothing for SPMD."""
    if not fused.mesh_in_use:
        return None
    from torch_pjrt.distributed import spmd

    aligned = spmd.align(arrays)
    if aligned is None:
        return None
    try:
        with jax.enable_x64(True):
            return program(aligned, scalars, rng)
    except Exception:  # noqa: BLE001  (the caller raises the first error, explained)
        return None


def retarget(x, device: str, tensor: Callable):
    """An argument (tree) of an op moved to ``device``: tensors through ``tensor``,
    pjrt devices and device strings replaced."""
    if isinstance(x, torch.Tensor):
        return tensor(x)
    if isinstance(x, torch.device) and x.type == "pjrt":
        return torch.device(device)
    if isinstance(x, str) and x.startswith("pjrt"):
        return device
    if isinstance(x, (list, tuple)):
        return type(x)(retarget(v, device, tensor) for v in x)
    return x


def _meta_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _to_meta(x):
    return retarget(x, "meta", _meta_like)


def refusal(exc: Exception) -> Exception:
    """Mark an error a lowering raises on purpose, in PyTorch's words (arguments the CPU
    refuses too, which PyTorch's Meta kernel does not check): it reaches the user as is,
    not as a torch_pjrt bug."""
    exc.pjrt_refusal = True
    return exc


def _explain(op: OpOverload, args, kwargs, exc: Exception) -> Exception:
    """The error a failed lowering should raise: its own when it is a :func:`refusal`,
    PyTorch's message when PyTorch rejects the same call (its Meta kernel raises), else a
    bug report with op context."""
    if getattr(exc, "pjrt_refusal", False):
        return exc
    try:
        op(*_to_meta(args), **{k: _to_meta(v) for k, v in kwargs.items()})
    except Exception as meta_exc:  # noqa: BLE001  (this is the error PyTorch gives)
        return meta_exc
    return RuntimeError(
        f"pjrt: the lowering of {op} failed: {type(exc).__name__}: {exc}\n"
        "PyTorch accepts these arguments, so this is a torch_pjrt bug; please report it "
        "with this message."
    )


def _check_cast(result_dtype: torch.dtype, out: torch.Tensor) -> None:
    if not torch.can_cast(result_dtype, out.dtype):
        raise RuntimeError(
            f"result type {_dtype_name(result_dtype)} can't be cast to the desired output type "
            f"{_dtype_name(out.dtype)}"
        )


def _dtype_name(dtype: torch.dtype) -> str:
    return str(torch.empty((), dtype=dtype, device="meta").type()).split(".")[-1][:-6]


def _store(out: torch.Tensor, value: jax.Array, inplace: bool, warn: bool = True) -> None:
    from torch_pjrt.runtime.transfer import torch_dtype

    if replace(out, value):  # same shape and dtype, the whole storage: nothing to check
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
    write(out, value)


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

    def __init__(self, functional: Kernel):
        self.functional = functional

    def __call__(self, *args, **kwargs):
        out, _ = self.functional.compute(args, kwargs)
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

    def __init__(self, functional: Kernel, out_names: list[str]):
        self.functional = functional
        self.out_names = out_names
        name = functional.op._schema.name
        dtype_from_out = name in _DTYPE_FROM_OUT
        self.dtype_index = functional.sig.index.get("dtype") if dtype_from_out else None
        self.cat_like = name in _CAT_LIKE
        self.warn_on_resize = name not in _SILENT_RESIZE

    def __call__(self, *args, **kwargs):
        outs = [kwargs.pop(name) for name in self.out_names]
        sig = self.functional.sig
        if self.dtype_index is not None and sig.values(args, kwargs)[self.dtype_index] is None:
            kwargs["dtype"] = outs[0].dtype
        result, index = self.functional.compute(args, kwargs)
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
    from torch_pjrt.runtime.transfer import torch_dtype

    if not torch.can_cast(torch_dtype(value.dtype), out.dtype):
        raise TypeError(
            f"torch.cat(): input types can't be cast to the desired output type "
            f"{_dtype_name(out.dtype)}"
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


# --- raw kernels and installation ---------------------------------------------------

_RAW: dict[OpOverload, Callable] = {}


def implements(*ops):
    """Register a raw PrivateUse1 kernel (takes and returns torch tensors)."""

    def register(fn):
        for op in ops:
            if op in _RAW or op in _TABLE:
                raise RuntimeError(f"{op} is registered twice")
            _RAW[op] = fn
        return fn

    return register
