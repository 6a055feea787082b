"""Creation lowerings: ranges, identity matrices, triangle indices, filled tensors.

``full``, ``zeros``, ``ones``, ``scalar_tensor``, ``new_full``/``new_zeros``/``new_ones``
and ``arange`` are CompositeExplicitAutograd in ATen (``empty``, then ``fill_`` or an
``out=`` kernel): three ops on pjrt (a new storage, a program, a write into it). Their
eager kernels here make the value in one program (one recorded op in fused mode) and
wrap it: ~15-20 us a call against ~40-75. The ``*_like`` ops stay composite (their
``memory_format`` keeps the input's strides through ``empty_like``). In traced graphs
all of them are lowered as values (``lowers_in_graphs``, below).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_pjrt.device.tensor import shared_array, wrap, write
from torch_pjrt.modes import fused
from torch_pjrt.ops._helpers import default_dtype, spaced
from torch_pjrt.ops.memory import check_dtype, device_index
from torch_pjrt.ops.registry import implements, lowers
from torch_pjrt.ops.registry import lowers_in_graphs as in_graphs
from torch_pjrt.ops.scalar_fits import check_fits
from torch_pjrt.runtime import executor
from torch_pjrt.runtime.transfer import jax_dtype, torch_dtype

aten = torch.ops.aten


def _acc_dtype(dtype: torch.dtype):
    """PyTorch's CPU accumulation type, in which ranges are computed."""
    if dtype in (torch.float16, torch.bfloat16):
        return jnp.float32
    if dtype.is_floating_point:
        return jnp.float64
    return jnp.int64


# --- arange: its length depends on the values of its Scalar arguments ------------------


def _arange_length(start, end, step, dtype: torch.dtype) -> int:
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if dtype == torch.int64:
        start, end, step = int(start), int(end), int(step)
    if step == 0:  # (a fractional step of an integer arange: PyTorch's ValueError)
        raise ValueError("step must be nonzero")
    if not (math.isfinite(start) and math.isfinite(end)):
        raise RuntimeError(f"unsupported range: {start} -> {end}")
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise RuntimeError("upper bound and lower bound inconsistent with step sign")
    if dtype == torch.int64:
        # ATen's integer formula: (end - start + step - sign(step)) / step, truncated
        sign = (step > 0) - (step < 0)
        return abs(end - start + step - sign) // abs(step)
    return max(math.ceil((float(end) - float(start)) / float(step)), 0)


def _make_arange(length: int, dtype: torch.dtype, index: int):
    acc = _acc_dtype(dtype)

    def program(start, step):  # (numbers when inlined into a capture)
        start, step = jnp.asarray(start), jnp.asarray(step)
        return (start.astype(acc) + step.astype(acc) * jnp.arange(length, dtype=acc)).astype(
            jax_dtype(dtype)
        )

    return program


_arange_program = executor.helper(
    "arange",
    _make_arange,
    placed=lambda length, dtype, index: index,  # (no inputs to follow)
)


def _resized(out: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    # ATen's range kernels resize their output without the resize warning
    if out.shape != result.shape:
        out.resize_(result.shape)
    return out


def _arange_value(start, end, step, dtype: torch.dtype, index: int):
    length = _arange_length(start, end, step, dtype)
    # Python numbers go in as weakly typed arguments (cast to the accumulation dtype
    # inside the program): nothing to transfer, and fused mode records them as inputs
    to_python = int if jnp.issubdtype(_acc_dtype(dtype), jnp.integer) else float
    program = _arange_program(length, dtype, index)
    return fused.apply(program, (to_python(start), to_python(step)), index, "arange")


def _arange(start, end, step, dtype: torch.dtype, index: int) -> torch.Tensor:
    return wrap(_arange_value(start, end, step, dtype, index), index, owned=True)


@implements(aten.arange.start_step)
def arange(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    if dtype is None:
        integral = all(isinstance(x, (bool, int)) for x in (start, end, step))
        dtype = torch.int64 if integral else torch.get_default_dtype()
    return _arange(start, end, step, dtype, device_index(device))


@implements(aten.arange.default)
def arange_end(end, *, dtype=None, layout=None, device=None, pin_memory=None):
    # (ATen's composite arange(end) and arange(start, end) make an empty tensor and call
    # arange.start_out: an allocation and a write more than arange.start_step's kernel)
    return arange(0, end, 1, dtype=dtype, device=device)


@implements(aten.arange.start)
def arange_start(start, end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return arange(start, end, 1, dtype=dtype, device=device)


@implements(aten.arange.start_out)
def arange_start_out(start, end, step=1, *, out):
    # (``torch.arange(n, device=...)`` comes here with a fresh empty ``out``: the values
    # are written into it as they come, one program, no copy)
    value = _arange_value(start, end, step, out.dtype, out.device.index or 0)
    if out.shape != value.shape:
        out.resize_(value.shape)
    write(out, value, owned=True)
    return out


@implements(aten.arange.out)
def arange_out(end, *, out):
    return arange_start_out(0, end, 1, out=out)


# --- arange in graphs ---------------------------------------------------------------------


def _arange_dtype(dtype, *values):
    if dtype is not None:
        return dtype
    integral = all(isinstance(v, (bool, int)) or jax.export.is_symbolic_dim(v) for v in values)
    return torch.int64 if integral else torch.get_default_dtype()


def _symbolic_arange_length(start, end, step):
    """The length of an integer arange over symbolic bounds (a program exported with
    symbolic dimensions, ``torch_pjrt.export``): a symbolic dimension too."""
    if not (isinstance(step, int) and step > 0):
        raise NotImplementedError(
            f"arange({start}, {end}, {step}) over a symbolic dimension is lowered for a "
            "positive integer step only"
        )
    return (end - start + step - 1) // step


@in_graphs(aten.arange.default)
def arange_end_in_graphs(end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return arange_in_graphs(0, end, 1, dtype=dtype)


@in_graphs(aten.arange.start, aten.arange.start_step)
def arange_in_graphs(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = _arange_dtype(dtype, start, end, step)
    if any(map(jax.export.is_symbolic_dim, (start, end, step))):
        length = _symbolic_arange_length(start, end, step)
    else:
        length = _arange_length(start, end, step, dtype)
    acc = _acc_dtype(dtype)
    steps = jnp.asarray(step, acc) * jnp.arange(length, dtype=acc)
    return (jnp.asarray(start, acc) + steps).astype(jax_dtype(dtype))


# --- linspace and logspace: static length ---------------------------------------------


def _space_dtype(dtype, start, end):
    """linspace's and logspace's dtype: ``dtype``, else the default dtype, or its complex
    twin when an end is complex (as ATen infers it)."""
    if dtype is None and any(isinstance(v, complex) or jnp.iscomplexobj(v) for v in (start, end)):
        return jnp.complex128 if default_dtype(None) == jnp.float64 else jnp.complex64
    return default_dtype(dtype)


@lowers(aten.linspace.default)
def linspace(start, end, steps, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = _space_dtype(dtype, start, end)
    return spaced(start, end, steps, dtype).astype(dtype)


@lowers(aten.logspace.default)
def logspace(start, end, steps, base=10.0, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = _space_dtype(dtype, start, end)
    if steps == 1:
        exponent = jnp.reshape(jnp.asarray(start).astype(jnp.float64), (1,))
        return jnp.power(jnp.float64(base), exponent).astype(dtype)
    if not jnp.issubdtype(dtype, jnp.inexact):
        exponent = spaced(start, end, steps, dtype)
        return jnp.power(jnp.float64(base), exponent).astype(dtype)
    # reduced floats: the ends are rounded to dtype, the exponents computed in float32
    compute = jnp.float32 if jnp.finfo(dtype).bits < 32 else dtype
    start, end = (jnp.asarray(x).astype(dtype).astype(compute) for x in (start, end))
    exponent = spaced(start, end, steps, compute)
    return jnp.power(jnp.asarray(base, compute), exponent).astype(dtype)


def _space_out(functional):
    def kernel(start, end, steps, *args, out):
        result = functional(start, end, steps, *args, dtype=out.dtype, device=out.device)
        return _resized(out, result).copy_(result)

    return kernel


implements(aten.linspace.out)(_space_out(aten.linspace.default))
implements(aten.logspace.out)(_space_out(aten.logspace.default))


# --- eye and triangle indices --------------------------------------------------------


@lowers(aten._efficientzerotensor.default)
def efficient_zero_tensor(size, dtype=None, layout=None, device=None, pin_memory=None):
    # PyTorch's backward formulas make these for gradients known to be zero (sgn of a
    # real input); pjrt has no ZeroTensor dispatch key, so the zeros are real
    return jnp.zeros(tuple(size), default_dtype(dtype))


@lowers(aten.eye.default, aten.eye.m)
def eye(n, m=None, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, n if m is None else m, dtype=default_dtype(dtype))


def _triangle_indices(row: int, col: int, offset: int, lower: bool, dtype):
    dtype = torch.int64 if dtype is None else dtype
    if lower:
        mask = np.tri(row, col, offset, dtype=bool)
    else:
        mask = ~np.tri(row, col, offset - 1, dtype=bool)
    return jnp.asarray(np.stack(np.nonzero(mask)).reshape(2, -1), jax_dtype(dtype))


@lowers(aten.tril_indices.default)
def tril_indices(row, col, offset=0, dtype=None, layout=None, device=None, pin_memory=None):
    return _triangle_indices(row, col, offset, True, dtype)


@lowers(aten.triu_indices.default)
def triu_indices(row, col, offset=0, dtype=None, layout=None, device=None, pin_memory=None):
    return _triangle_indices(row, col, offset, False, dtype)


# --- filled tensors: one program eagerly -------------------------------------------------


def _make_filled(shape: tuple, dtype: torch.dtype, index: int):
    def program(value):  # (a Python number: one program for every value)
        return jnp.full(shape, value, jax_dtype(dtype))

    return program


_filled_program = executor.helper(
    "full",
    _make_filled,
    placed=lambda shape, dtype, index: index,  # (no inputs to follow)
)

_INT64 = range(-(2**63), 2**63)


def _filled(
    size, value, dtype: torch.dtype, layout, device, pin_memory, shared: bool = False
) -> torch.Tensor:
    """A new tensor of ``size`` and ``dtype`` holding ``value`` everywhere, in one program.
    What the one program does not cover (a layout other than strided, pinned memory, a
    negative size, an integer past int64) takes ATen's own way, ``empty`` then ``fill_``
    (with its errors). ``shared``: a number made a tensor (``_number``)."""
    shape = tuple(size)
    cls = value.__class__
    if (
        layout not in (None, torch.strided)
        or pin_memory
        or cls not in (bool, int, float, complex)
        or (cls is int and value not in _INT64)
        or any(s < 0 for s in shape)
    ):
        out = torch.empty(shape, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory)
        return out.fill_(value)
    check_dtype(dtype)  # (as empty's)
    check_fits(value, dtype)  # (fill_'s overflow error)
    index = device_index(device)
    program = _filled_program(shape, dtype, index)
    if shared and not fused.capturing:  # (a capture records it: its graph makes it)
        return wrap(_number(program, value, dtype, index), index)
    return wrap(fused.apply(program, (value,), index, "full"), index, owned=True)


# NOTE: a number made a tensor (``scalar_tensor``: how ATen hands an op a Python number,
# ``torch.where(c, x, -math.inf)``'s say) costs a program or a recorded op each time,
# several a token in a decoding loop: its array is made once per value, dtype and device
# and shared. Arrays never change; the tensors do not own it (nothing donates it), and a
# write into one stores a new array. Only scalar_tensor's: a tensor the caller keeps and
# writes in place (``torch.zeros(())`` as an accumulator) would not be donated at its
# first write and be at the next, two variants of the program that writes it.
_numbers: dict = {}


def _number(program, value, dtype: torch.dtype, index: int) -> jax.Array:
    """The shared 0-d array of ``value`` (``program``: the filled tensor's, run once)."""
    key = (value.__class__, repr(value), dtype, index)  # (repr: -0.0 and nan apart)
    return shared_array(_numbers, key, lambda: program(value), limit=1024)


def _full_dtype(fill_value) -> torch.dtype:
    """ATen's dtype of ``full`` without ``dtype=``: the fill value's kind."""
    if isinstance(fill_value, bool):
        return torch.bool
    if isinstance(fill_value, int):
        return torch.int64
    if isinstance(fill_value, complex):
        wide = torch.get_default_dtype() == torch.float64
        return torch.complex128 if wide else torch.complex64
    return torch.get_default_dtype()


@implements(aten.full.default)
def full_eager(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = dtype if dtype is not None else _full_dtype(fill_value)
    return _filled(size, fill_value, dtype, layout, device, pin_memory)


@implements(aten.scalar_tensor.default)
def scalar_tensor_eager(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = dtype or torch.get_default_dtype()
    return _filled((), s, dtype, layout, device, pin_memory, shared=True)


@implements(aten.new_full.default)
def new_full_eager(
    self, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None
):
    dtype, device = _of(self, dtype, device)
    return _filled(size, fill_value, dtype, layout, device, pin_memory)


def _of(self, dtype, device) -> tuple:
    """A ``new_*`` factory's dtype and device: ``self``'s where not given."""
    return (self.dtype if dtype is None else dtype), (self.device if device is None else device)


def _constant_eager(value):
    def allocate(size, *, dtype=None, layout=None, device=None, pin_memory=None):
        if value == 0 and any(s < 0 for s in size):  # (ATen's zeros checks first)
            raise RuntimeError("zeros: Dimension size must be non-negative.")
        return _filled(size, value, dtype or torch.get_default_dtype(), layout, device, pin_memory)

    def new(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
        dtype, device = _of(self, dtype, device)
        return _filled(size, value, dtype, layout, device, pin_memory)

    return allocate, new


for _value, _ops in (
    (0, (aten.zeros.default, aten.new_zeros.default)),
    (1, (aten.ones.default, aten.new_ones.default)),
):
    for _op, _fn in zip(_ops, _constant_eager(_value)):
        implements(_op)(_fn)


# --- allocation in graphs (eagerly: ``empty``, then ``fill_``) ----------------------------


def _filled_in_graph(shape, value, dtype):
    """A graph's ``full``: its value, a constant Python number (else symbolic), checked
    as eager calls check it (fill_'s overflow error)."""
    if isinstance(value, (bool, int, float, complex)):
        check_fits(value, torch_dtype(dtype))
    return jnp.full(tuple(shape), value, dtype)


@in_graphs(aten.full.default)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = jax_dtype(dtype if dtype is not None else _full_dtype(fill_value))
    return _filled_in_graph(size, fill_value, dtype)


@in_graphs(aten.full_like.default)
def full_like(
    self, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None
):
    return _filled_in_graph(self.shape, fill_value, default_dtype(dtype, self))


@in_graphs(aten.scalar_tensor.default)
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _filled_in_graph((), s, default_dtype(dtype))


def _constant(value):
    def allocate(
        size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None
    ):
        return jnp.full(tuple(size), value, default_dtype(dtype))

    def like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        return jnp.full(self.shape, value, default_dtype(dtype, self))

    def new(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
        return jnp.full(tuple(size), value, default_dtype(dtype, self))

    return allocate, like, new


# NOTE: the contents of ``empty`` are unspecified; zeros are as good as any
for _value, _ops in (
    (0, (aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default)),
    (1, (aten.ones.default, aten.ones_like.default, aten.new_ones.default)),
    (0, (aten.empty.memory_format, aten.empty_like.default, aten.new_empty.default)),
):
    for _op, _fn in zip(_ops, _constant(_value)):
        in_graphs(_op)(_fn)


@in_graphs(aten.empty_strided.default)
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), default_dtype(dtype))


@in_graphs(aten.new_empty_strided.default)
def new_empty_strided(self, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), default_dtype(dtype, self))


@in_graphs(aten.new_full.default)
def new_full(self, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _filled_in_graph(size, fill_value, default_dtype(dtype, self))
