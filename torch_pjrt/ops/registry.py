"""The one lowering registry: ATen overload -> function of JAX arrays.

A lowering is a plain function registered with :func:`lowers`. It takes the op's
schema arguments by name (JAX arrays for tensors, JAX scalars for ``Scalar``
arguments, Python values for everything else) and returns JAX arrays. Everything
about PyTorch tensors happens here, at the dispatch boundary: reading the storage
cells, checking devices, jitting and caching one program per static signature,
wrapping the results. In-place and ``out=`` variants are derived from the schema
(``variants.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import keyword
import logging
import sys
import warnings
from collections.abc import Callable

import jax
import torch
from torch._ops import OpOverload, OpOverloadPacket

from torch_pjrt.config import op_path, settings
from torch_pjrt.device import binding
from torch_pjrt.device import random as pjrt_random
from torch_pjrt.device.binding import device_scalar
from torch_pjrt.device.tensor import wrap, write
from torch_pjrt.modes import fused
from torch_pjrt.ops import checks, fallback
from torch_pjrt.ops.fallback import LoweringMissing, declined
from torch_pjrt.ops.scalar_fits import check_fits
from torch_pjrt.runtime import asserts, executor
from torch_pjrt.runtime import events as metrics
from torch_pjrt.runtime.transfer import torch_dtype

log = logging.getLogger("torch_pjrt")

__all__ = [
    "HostCheck",
    "LoweringMissing",
    "Lowering",
    "declined",
    "dtype_of",
    "graph_lookup",
    "lowers",
    "lowers_in_graphs",
    "lookup",
    "meta_error",
    "number_result_type",
    "table",
]


@dataclasses.dataclass(frozen=True)
class Lowering:
    fn: Callable
    random: bool = False
    static: frozenset = frozenset()
    writes: tuple = ()
    fits: tuple = ()  # Scalar arguments that must fit self's dtype (scalar_fits.py)
    fits_result: bool = False  # ... the result type of self and the Scalar instead
    host: Callable | None = None  # a check of the call's Python numbers (see lowers)


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


def lowers(
    *ops,
    random: bool = False,
    static: tuple = (),
    writes: tuple = (),
    fits: tuple = (),
    fits_result: bool = False,
    host: Callable | None = None,
):
    """Register a lowering for ATen ops; a packet expands to its functional overloads.

    Args:
        ops: ``torch.ops.aten.<name>.<overload>`` or ``torch.ops.aten.<name>`` objects.
        random: the lowering draws random numbers and takes a ``key`` argument.
        static: names of ``Scalar`` arguments that choose the algorithm (a norm's order):
            passed as Python values, one compiled program per value.
        writes: names of tensor arguments the op updates in place (batch norm's running
            statistics); the lowering returns the op's outputs followed by one new value
            (or None: unchanged) per name.
        fits: names of ``Scalar`` arguments (a fill value, a clamp bound) that must be
            representable in ``self``'s dtype: refused on the host with CPU PyTorch's
            overflow error otherwise (``scalar_fits.py``). Overloads without such a
            Scalar argument (``masked_fill.Tensor``) are not checked.
        fits_result: check ``fits`` against the result type of ``self`` and the number
            (``torch.result_type``: ops that promote, as ``clamp``) instead.
        host: a check of the values of ``Scalar`` arguments that CPU PyTorch refuses and
            a program cannot see (a Scalar is a run-time argument of it): a function of
            some of the op's arguments by name (Python numbers as given; a tensor as a
            torch tensor or a JAX array, :func:`dtype_of` reads either's dtype) that
            raises PyTorch's error (``pow``'s negative integer exponent of an integer
            tensor). Made on the host before every call, eager, fused and compiled
            (:class:`HostCheck`).

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
                _TABLE[op] = Lowering(
                    fn, random, frozenset(static), tuple(writes), tuple(fits), fits_result, host
                )
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


def pjrt_generator(generator: torch.Generator, op: str) -> torch.Generator:
    """A random op's ``generator=``: one of pjrt's (as CUDA refuses a CPU generator),
    outside graph captures (a replay draws from the device's RNG state)."""
    if generator.device.type != "pjrt":
        raise refusal(
            RuntimeError(
                f"Expected a 'pjrt' device type for generator but found '{generator.device.type}'"
            )
        )
    if fused.capturing:
        raise RuntimeError(
            f"{op} draws from a torch.Generator, which cannot be captured in a torch.pjrt "
            "graph (each replay draws from the device's RNG state, as CUDA graphs do from "
            "the default generator); leave generator= out inside the capture"
        )
    return generator


def _program_key(vals, sig: Signature) -> tuple:
    """The key of an op's program cache: its static arguments, and the settings the
    lowerings read when they trace (the default dtype, for factories with dtype=None; the
    float32 matmul precision; whether values are checked, ``runtime.asserts``)."""
    statics = sig.statics
    return (
        tuple([binding.static(vals[i]) for i in statics]) if statics else (),
        torch.get_default_dtype(),
        torch.get_float32_matmul_precision(),
        settings.checks,
    )


_NUMBERS = (bool, int, float, complex)


class HostCheck:
    """The checks of a call's Python numbers that CPU PyTorch makes and a program cannot
    (its Scalar arguments are run-time values): each ``fits`` argument must fit self's
    dtype (or the result type, ``fits_result``), and the lowering's ``host`` function
    holds. Made on the host before each call: by eager kernels (every mode) on the
    arguments as given, and by compiled graphs' nodes (``compile/nodes.py``) on their
    constant numbers; a symbolic number is not checked (nothing but its value could
    be). Tensors arrive as torch tensors in eager calls, JAX arrays in graphs."""

    __slots__ = ("fits", "fits_result", "self_index", "host", "host_args")

    def __init__(self, lowering: Lowering, sig: Signature, fits: tuple):
        self.fits, self.fits_result = fits, lowering.fits_result
        self.self_index = sig.index.get("self")
        self.host = lowering.host
        names = inspect.signature(lowering.host).parameters if lowering.host else ()
        self.host_args = tuple((n, sig.index[n]) for n in names)

    @classmethod
    def of(cls, lowering: Lowering, sig: Signature) -> HostCheck | None:
        fits = tuple(
            sig.index[n]
            for n in lowering.fits
            if n in sig.index and sig.kinds[sig.index[n]] == _SCALAR
        )
        if not fits and lowering.host is None:
            return None
        return cls(lowering, sig, fits)

    def __call__(self, vals) -> None:
        if self.fits:
            dtype = dtype_of(vals[self.self_index])
            for i in self.fits:
                value = vals[i]
                if isinstance(value, _NUMBERS):
                    check_fits(
                        value,
                        number_result_type(dtype, value.__class__) if self.fits_result else dtype,
                    )
        if self.host is not None:
            self.host(**{n: vals[i] for n, i in self.host_args})


@functools.cache
def number_result_type(dtype: torch.dtype, number: type) -> torch.dtype:
    """``torch.result_type`` of a tensor of ``dtype`` and a Python number of that type."""
    return torch.result_type(torch.empty((1,), dtype=dtype, device="meta"), number(1))


def dtype_of(x) -> torch.dtype:
    """A torch tensor's dtype, or a JAX array's as torch names it."""
    dtype = x.dtype
    return dtype if isinstance(dtype, torch.dtype) else torch_dtype(dtype)


class Kernel:
    """The eager PrivateUse1 kernel of one lowered overload: it binds the op's arguments
    through ``device/binding.py`` (one binding for every mode and path, and for compiled
    graphs) and hands the executor its program."""

    def __init__(self, op: OpOverload, lowering: Lowering):
        self.op = op
        self.name = str(op)
        self.lowering = lowering
        self.sig = Signature(op, lowering.static)
        # a random op's generator= argument (None: the op has none, or draws nothing)
        self._generator = self.sig.index.get("generator") if lowering.random else None
        self.program = executor.Program(
            "eager", self.name, self._build, self._describe, placed=_placed, unchecked=_unchecked
        )
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
        self.host_check = HostCheck.of(lowering, sig)  # (None: nothing to check)
        # positional arguments given -> the defaults that complete them
        self._tails = {n: tuple(sig.defaults[n:]) for n in range(len(sig.defaults) + 1)}

    # --- what the executor runs ---------------------------------------------------

    def _build(self, key):
        statics = key[0]
        sig, lowering = self.sig, self.lowering
        fn = lowering.fn

        def run(arrays, scalars, rng):
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
            out = fn(**kwargs)
            call = _call_tracing(self)
            if call is not None:
                self._check_arguments(*call)
            return out

        run.__name__ = run.__qualname__ = self.name.replace(".", "_")
        return run, False

    def _describe(self, key, traced) -> list:
        arrays, scalars, _ = traced
        return [
            ("default dtype", key[1]),
            ("float32 matmul precision", key[2]),
            ("value checks", key[3]),
            *_signature(self.sig, key[0], arrays, scalars),
        ]

    def _scalars(self, vals, lazy: bool) -> list:
        """The op's Scalar arguments as its program takes them: None for one at its
        schema default (add's ``alpha=1``: the program bakes it in, one argument less per
        call), else the number (fused mode records it by value) or its cached JAX scalar.
        Every path binds scalars here, so a new op compiles once, whichever path runs
        it first."""
        out = []
        for i, d in zip(self.sig.scalars, self._scalar_defaults):
            v = vals[i]
            if v.__class__ is d.__class__ and v == d and (v or d.__class__ is not float):
                out.append(None)
            else:
                out.append(v if lazy else device_scalar(v))
        return out

    # --- calls ----------------------------------------------------------------------

    def compute(self, args, kwargs):
        """Run the lowering (in fused mode: record it); returns (JAX result, device index)."""
        sig = self.sig
        vals = sig.values(args, kwargs)
        generator = None
        if self._generator is not None and vals[self._generator] is not None:
            generator = pjrt_generator(vals[self._generator], self.name)
            vals[self._generator] = None  # (not a static: one program for every generator)
        if self.host_check is not None:
            self.host_check(vals)
        path = op_path()
        lazy = path == "fused"
        bound = binding.plain_arrays(vals, sig.arrays, lazy)  # (the common case, cheaply)
        if bound is not None:
            (arrays, index), has_tensors = bound, True
        else:
            index = _device_index(vals, sig)
            arrays, has_tensors = binding.arrays_of(vals, sig.arrays, index, lazy)
        scalars = self._scalars(vals, lazy)
        key = _program_key(vals, sig)
        if not has_tensors:  # nothing to follow: the program places its outputs
            key = (*key, index)
        rng = None
        if self.lowering.random:
            if generator is None:
                rng = pjrt_random.next_key_parts(index)
            else:
                rng = pjrt_random.generator_key_parts(generator)
        metrics.op(self.name)
        try:
            if lazy:
                try:
                    inputs = (arrays, scalars, rng)
                    program = self.program
                    run = program.passed_key(key, inputs)
                    out = fused.record(
                        program.jitted(run), inputs, index, self.name, rng is not None
                    )
                    if out.__class__ is asserts.Checked:  # (its checks: pending values)
                        marks = program.checks_made(key, inputs, fused=True)
                        out = asserts.unpack(out, self.name, marks=marks)
                    return out, index
                except fused.Unfusable:  # an argument fused mode cannot record: run it now
                    arrays = fused.concrete(arrays)
                    scalars = [device_scalar(v) for v in scalars]
            out = self.program(key, executor.align(arrays), scalars, rng)
        except LoweringMissing:
            raise
        except Exception as exc:  # noqa: BLE001  (re-raised with PyTorch's message)
            error = _explain(self.op, args, kwargs, exc)
            if error is exc:
                raise
            raise error from exc
        if path == "debug" or path == "checked":
            checks.after_op(self.op, args, kwargs, out, self.lowering.random)
        return out, index

    def _check_arguments(self, args, kwargs) -> None:
        """PyTorch's own checks of the op's arguments (shapes, dims, dtypes, the values of
        static arguments), made by its Meta kernel on meta copies of them while a call
        traces a program (jit traces once per shapes, dtypes and static arguments, so
        each signature is checked once, and no program runs on arguments PyTorch
        refuses). Raises PyTorch's exception, as a :func:`refusal`.

        Complex arguments, and integer or bool ones first, are run once more on CPU
        stand-ins (:func:`_dtype_refusal`): the Meta kernel accepts dtypes the CPU kernel
        has no instance for (complex ``max``, ``sort``, ``clamp``, ``softmax``; integer
        ``interpolate``), and XLA computes them.

        NOTE: at the end of the trace: the lowering's own checks, in the CPU's words
        where the Meta kernel's differ, come first."""
        error = meta_error(self.op, args, kwargs)
        # (not random ops: a CPU run would draw from the CPU's default generator)
        dtypes = _tensor_dtypes((args, kwargs))
        if error is None and not self.lowering.random and _may_lack_a_kernel(dtypes):
            error = _dtype_refusal(self.op, args, kwargs)
        if error is not None:
            raise refusal(error)

    def _plain_call(self, args):
        """The common eager call, with as little host work as possible: positional
        arguments, every tensor a pjrt tensor on one device, no mesh
        (``binding.plain_arrays``). None when anything else holds: :meth:`compute` runs
        (and raises PyTorch's error, if any)."""
        sig = self.sig
        tail = self._tails.get(len(args))
        if tail is None:
            return None
        vals = args + tail
        if self.host_check is not None:
            self.host_check(vals)
        bound = binding.plain_arrays(vals, sig.arrays)
        if bound is None:
            return None
        arrays, index = bound
        try:
            out = self.program(_program_key(vals, sig), arrays, self._scalars(vals, False), None)
        except Exception as exc:  # noqa: BLE001  (the general path raises PyTorch's error)
            if getattr(exc, "pjrt_event", False):  # strict mode's: the program is built now
                raise
            return None
        metrics.op(self.name)
        if self.returns_tuple:
            return tuple(None if a is None else wrap(a, index, True) for a in out)
        return wrap(out, index, True)

    def __call__(self, *args, **kwargs):
        if self.plain and not kwargs and op_path() == "eager":
            out = self._plain_call(args)
            if out is not None:
                return out
        try:
            out, index = self.compute(args, kwargs)
        except LoweringMissing as exc:  # the lowering declines these arguments
            return fallback.run(self.op, args, kwargs, exc.reason)
        writes = self.lowering.writes
        if writes:
            out = self._write_back(out, args, kwargs)
        if self.returns_python:
            value = fused.concrete(out, "host read")
            metrics.host_sync()
            asserts.refuse_read(value)
            return value.item()
        # NOTE: a program's results are new arrays (jit never hands back an input), so
        # each result tensor owns its array (tensor.Cell)
        if self.returns_list:
            return [wrap(a, index, True) for a in out]
        if self.returns_tuple:
            return tuple(None if a is None else wrap(a, index, True) for a in out)
        return wrap(out, index, True)

    def _write_back(self, out, args, kwargs):
        writes = self.lowering.writes
        n = len(out) - len(writes)
        vals = self.sig.values(args, kwargs)
        for name, value in zip(writes, out[n:]):
            target = vals[self.sig.index[name]]
            if target is not None and value is not None:
                write(target, value, owned=True)
        return out[:n] if n > 1 or self.returns_tuple else out[0]


_CALLS = (Kernel.compute.__code__, Kernel._plain_call.__code__)


def _call_tracing(kernel: Kernel) -> tuple | None:
    """``(args, kwargs)`` of the call of ``kernel`` whose program is being traced, or
    None when none is (a fused recording replays its ops, a program is dumped). The
    trace runs inside that call, in its thread, so the call is on the stack: read from
    there, the arguments cost nothing to the calls that do not trace."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code in _CALLS:
            local = frame.f_locals
            if local.get("self") is kernel:
                return local["args"], local.get("kwargs") or {}
        frame = frame.f_back
    return None


def _unchecked(key):
    """An op's program key with its value checks off (its fourth part: ``_program_key``)."""
    return key if not key[3] else (*key[:3], False, *key[4:])


def _placed(key):
    """The device of an op's program with no tensor arguments (its key's fifth part)."""
    return key[4] if len(key) > 4 else None


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
    if isinstance(x, torch.Generator):
        return None  # (Meta kernels draw nothing; a pjrt generator would be refused)
    return retarget(x, "meta", _meta_like)


def meta_error(op: OpOverload, args, kwargs) -> Exception | None:
    """The exception PyTorch's Meta kernel of ``op`` raises for these arguments (run on
    meta copies of them), or None: it accepts them, it cannot tell, or the CPU kernel
    accepts what it refuses (``_in_cpu_words``). A Meta kernel that
    cannot tell raises NotImplementedError (there is none, or its result depends on
    values: ``nonzero``) or says that it needs values ("cannot repeat_interleave a meta
    tensor without output_size", "Tensor.item() cannot be called on meta tensors")."""
    try:
        op(*_to_meta(args), **{k: _to_meta(v) for k, v in kwargs.items()})
    except NotImplementedError:
        return None
    except Exception as exc:  # noqa: BLE001  (this is the error PyTorch gives)
        return None if "meta tensor" in str(exc).lower() else _in_cpu_words(op, args, kwargs, exc)
    return None


# arguments of more elements than this keep the Meta kernel's words (their stand-ins cost)
CPU_WORDS_LIMIT = 1 << 22


def _in_cpu_words(op: OpOverload, args, kwargs, exc: Exception) -> Exception:
    """``exc``, the Meta kernel's refusal of these arguments, as the CPU kernel words it:
    the op run on CPU stand-ins of the arguments (zeros of the pjrt tensors' shapes,
    strides and dtypes; copies of CPU tensors) when that raises an exception of the same
    type whose message does not name the CPU (a kernel's name, a device); None when the
    CPU computes them (a Meta kernel stricter than the CPU's: ``x << bool_tensor``); else
    ``exc`` (the CPU's refusal where the Meta kernel failed an ``assert`` or the CPU has
    no kernel for the dtype).
    Meta kernels check what the CPU kernels check, in their own words ("a and b must
    have same reduction dim" where the CPU, and CUDA, say "mat1 and mat2 shapes cannot
    be multiplied (2x3 and 2x3)"); users compare our errors with theirs."""
    made, cpu_exc = _cpu_error(op, args, kwargs)
    if not made:
        return exc
    if cpu_exc is None:  # the CPU computes what the Meta kernel refuses: as the CPU
        return None
    if type(cpu_exc) is type(exc) and "cpu" not in str(cpu_exc).lower():
        return cpu_exc
    # a dtype the CPU has no kernel for, which the Meta kernel words its own way ("torch.
    # complex64 not supported for floor_divide"), or failed an assert on (polar's "real
    # must be floating point", no message for users): the CPU's refusal
    if isinstance(exc, AssertionError) or _no_kernel_for_dtype(cpu_exc):
        return cpu_exc
    return exc


def _no_kernel_for_dtype(exc: Exception) -> bool:
    return isinstance(exc, NotImplementedError) and " not implemented for '" in str(exc)


def _cpu_error(op: OpOverload, args, kwargs) -> tuple[bool, Exception | None]:
    """Whether CPU stand-ins of the arguments could be made (zeros of the pjrt tensors'
    shapes, strides and dtypes; copies of CPU tensors; not too big), and the exception the
    op raises on them (None when it computes them)."""
    budget = CPU_WORDS_LIMIT

    def stand_in(t: torch.Tensor) -> torch.Tensor:
        nonlocal budget
        span = 0 if 0 in t.shape else 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
        budget -= span
        if budget < 0:
            raise OverflowError  # (too big to stand in for)
        if t.device.type == "cpu":
            return t.detach().clone()
        return torch.zeros(span, dtype=t.dtype).as_strided(t.shape, t.stride())

    def on_cpu(x):
        return None if isinstance(x, torch.Generator) else retarget(x, "cpu", stand_in)

    try:
        cpu_args, cpu_kwargs = on_cpu(args), {k: on_cpu(v) for k, v in kwargs.items()}
    except Exception:  # noqa: BLE001  (no stand-in)
        return False, None
    return True, _raised(op, cpu_args, cpu_kwargs)


def _raised(op: OpOverload, args, kwargs) -> Exception | None:
    """The exception ``op`` raises on these (CPU) arguments, or None."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            op(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001  (the CPU's refusal)
        return exc.with_traceback(None)
    return None


def _refuses_complex(exc: Exception | None) -> bool:
    return exc is not None and "complex" in str(exc).lower()


def _tensor_dtypes(x) -> list:
    """The dtypes of the tensors in ``x`` (nested lists, tuples and dicts), in order."""
    if isinstance(x, torch.Tensor):
        return [x.dtype]
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        return [d for v in x for d in _tensor_dtypes(v)]
    return []


def _may_lack_a_kernel(dtypes: list) -> bool:
    """Whether a call's tensors are of dtypes CPU kernels often have no instance for: a
    complex one anywhere, an integer or bool one first (the input)."""
    return any(d.is_complex for d in dtypes) or bool(dtypes) and not dtypes[0].is_floating_point


def _lacks_a_kernel(exc: Exception | None) -> bool:
    """Whether ``exc`` is a CPU kernel's refusal of a dtype: "\"max_all\" not implemented
    for 'ComplexFloat'", "clamp is not supported for complex types"."""
    return exc is not None and (_no_kernel_for_dtype(exc) or _refuses_complex(exc))


def _dtype_refusal(op: OpOverload, args, kwargs) -> Exception | None:
    """The CPU kernel's refusal of the arguments' dtypes, run on stand-ins of them, or
    None."""
    _, cpu_exc = _cpu_error(op, args, kwargs)
    return cpu_exc if _lacks_a_kernel(cpu_exc) else None


def graph_dtype_refusal(sig: Signature, vals) -> Exception | None:
    """:func:`_dtype_refusal` of a compiled graph's node, whose arguments ``vals`` (in
    schema order) are JAX values: CPU zeros of their shapes and dtypes stand in for
    arrays (up to ``CPU_WORDS_LIMIT`` elements, of known shapes), 0 for a traced number,
    the CPU for a device. Not called for random ops."""

    def dtypes(v) -> list:
        if isinstance(v, (list, tuple)):
            return [d for x in v for d in dtypes(x)]
        return [torch_dtype(v.dtype)] if isinstance(v, jax.Array) else []

    if not _may_lack_a_kernel([d for i in sig.arrays for d in dtypes(vals[i])]):
        return None

    def size(v) -> int:
        if isinstance(v, (list, tuple)):
            return sum(size(x) for x in v)
        if not isinstance(v, jax.Array):
            return 0
        if not all(isinstance(n, int) for n in v.shape):  # (a symbolic shape: an export's)
            return CPU_WORDS_LIMIT + 1
        return v.size

    if sum(size(vals[i]) for i in sig.arrays) > CPU_WORDS_LIMIT:
        return None  # (too big to stand in for, or of no known size)

    def stand_in(v):
        if isinstance(v, (list, tuple)):
            return [stand_in(x) for x in v]
        if isinstance(v, jax.Array):
            return torch.zeros(tuple(v.shape), dtype=torch_dtype(v.dtype))
        return torch.device("cpu") if isinstance(v, torch.device) else v

    cpu = [stand_in(v) for v in vals]
    for i in sig.scalars:
        if isinstance(cpu[i], torch.Tensor):
            cpu[i] = cpu[i].item()
    schema = sig.op._schema.arguments
    args = [v for v, a in zip(cpu, schema) if not a.kwarg_only]
    kwargs = {a.name: v for v, a in zip(cpu, schema) if a.kwarg_only}
    exc = _raised(sig.op, args, kwargs)
    return exc if _lacks_a_kernel(exc) else None


def _cpu_refusal(op: OpOverload, args, kwargs, exc: Exception) -> Exception | None:
    """The CPU's refusal of arguments a lowering failed on (``exc``) and the Meta kernel
    accepts: a dtype the CPU has no kernel for (its NotImplementedError, "frac_cpu" not
    implemented for 'ComplexFloat'), a refusal of complex numbers, or any refusal where
    the lowering failed on a dtype itself; None otherwise (a refusal of the stand-ins'
    zeros, say a singular matrix, would not be the arguments')."""
    _, cpu_exc = _cpu_error(op, args, kwargs)
    if cpu_exc is None:
        return None
    if _lacks_a_kernel(cpu_exc) or "dtype" in str(exc):
        return cpu_exc
    return None


def refusal(exc: Exception) -> Exception:
    """Mark an error a lowering raises on purpose, in PyTorch's words (arguments the CPU
    refuses too, which PyTorch's Meta kernel does not check): it reaches the user as is,
    not as a torch_pjrt bug."""
    exc.pjrt_refusal = True
    return exc


def _explain(op: OpOverload, args, kwargs, exc: Exception) -> Exception:
    """The error a failed lowering should raise: its own when it is a :func:`refusal` or
    came from an event listener (strict mode's ``StrictModeError``, marked ``pjrt_event``
    by ``runtime.events``), PyTorch's message when PyTorch rejects the same call (its Meta
    kernel raises, or the CPU kernel refuses the dtype: :func:`_cpu_refusal`), else a bug
    report with op context."""
    if getattr(exc, "pjrt_refusal", False) or getattr(exc, "pjrt_event", False):
        return exc
    meta_exc = meta_error(op, args, kwargs)
    if meta_exc is not None:  # (this is the error PyTorch gives)
        return meta_exc
    cpu_exc = _cpu_refusal(op, args, kwargs, exc)
    if cpu_exc is not None:  # (and this the one CPU PyTorch gives)
        return cpu_exc
    return RuntimeError(
        f"pjrt: the lowering of {op} failed at {metrics.user_line()}: "
        f"{type(exc).__name__}: {exc}\n  schema: {op._schema}\n"
        "PyTorch accepts these arguments, so this is a torch_pjrt bug; please report it "
        "with this message."
    )


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
