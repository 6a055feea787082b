"""Every op of PyTorch's OpInfo database, run on the CPU and on pjrt and compared.

For each entry of ``torch.testing._internal.common_methods_invocations.op_db`` the
test generates the OpInfo's sample inputs on the CPU (float32; ops without float32
use the first of int64, int32, ... they support), runs each sample on the CPU and,
with its tensors moved by ``.to("pjrt")``, on pjrt under
``torch_pjrt.config(fallback="error")`` (so nothing passes by falling back to the
CPU), and compares the outputs with ``torch.testing.assert_close``. Tolerances are
the OpInfo's own (its ``toleranceOverride``/``precisionOverride`` decorators, the
largest declared for the dtype) or assert_close's defaults. Tensors an op writes in
place are compared too. A sample that raises on the CPU is skipped. Two rules widen
the comparison, each for a documented reason: a bfloat16 or float16 result that
differs from the CPU's passes if it is no further from the exact result (the op in
float64) than the CPU's (:func:`_closer_to_exact`), and the indices of sort, argsort
and topk without ``stable=True`` pass if they select equal values (``TIED_INDICES``).

``test_grad`` compares float32 gradients (a seeded random cotangent through
``torch.autograd.grad``) of every op that supports autograd, the first 2 samples in
``make test`` and all of them in the exhaustive run.

Each test runs in an execution mode (docs/modes.md), entered around the whole op: in
``eager`` every op is its own program; in ``fused`` the op is recorded, and its results
are compared after the recording runs (the comparison's ``.cpu()`` reads them, which
runs it). Parametrizations, one per op each:

- ``test_op[<op>-first3-eager]`` and ``test_op[<op>-first3-fused]``: the first 3
  samples, in each mode. ``make test`` runs one of the two per op (:func:`in_quick_run`:
  half the ops in each mode, by a stable hash of the op's name, so that every op and
  both modes are checked there); the other is marked ``slow``.
- ``test_op[<op>-all-fused]``: every sample, in fused mode (the default); marked
  ``slow``, so it runs only with ``--exhaustive``, ``TORCH_PJRT_EXHAUSTIVE=1`` or ``-m
  slow`` (``make test-all``).

``test_grad`` the same, with ``first2``.

``test_op_complex`` runs the first 3 samples of every op that supports complex64 on the
CPU (and is not tested in it already) in complex64, in the op's ``make test`` mode: ops
are tested in one dtype above, and complex numbers took other code paths (results of
the wrong dtype, lexicographic maxima) that float32 never reaches. Its expected
failures are ``XFAIL_COMPLEX``.

Expected outcomes come from one data table, ``tests/expectations.py``: ``XFAIL``
(strict: an op listed there that passes fails the run, so the table stays honest; it
fails in both modes), ``XFAIL_EAGER`` and ``XFAIL_FUSED`` (ops that fail in one mode
only), ``XFAIL_EXHAUSTIVE`` (ops that fail only on samples past the first 3), ``SKIP``
(ops that cannot be compared, e.g. random ones) and ``SHAPE_ONLY`` (ops whose CPU
result is uninitialised memory: only shape, dtype and device are compared). Regenerate
the xfail tables with ``python scripts/op_coverage.py --write-expectations``.

Each op's run is bounded by its sample subset and by a per-op alarm
(``TORCH_PJRT_OP_TIMEOUT`` seconds, default 120).
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import sys
import threading
import traceback
import unittest
import warnings
import zlib
from contextlib import contextmanager
from contextlib import nullcontext as _nothing

import numpy as np
import pytest
import torch
from torch.testing._internal import common_utils
from torch.testing._internal.common_device_type import precisionOverride, toleranceOverride
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.opinfo import core as opinfo_core

import torch_pjrt
from tests import expectations as E
from tests.expectations import GRAD_TOLERANCES, SHAPE_ONLY, SKIP


def _running_test_fn():
    """PyTorch's ``common_utils.extract_test_fn``, the same rule without ``inspect.stack()``.

    OpInfo's sample and error input iterators call it twice each, to find the running
    ``unittest.TestCase`` test method (none here: these are pytest functions); PyTorch's
    walks the frames with ``inspect.stack()``, which reads the source lines of every
    frame and searches ``sys.modules`` for each frame's module: about a tenth of this
    file's time (and of the other OpInfo tests' and scripts/op_coverage.py's, which
    import it). This walks the same frames with the same test and reads no source.
    """
    frame = sys._getframe(1)
    try:
        while frame is not None:
            this = frame.f_locals.get("self")
            if isinstance(this, unittest.TestCase):
                *_, cls_name, test_name = this.id().rsplit(".", 2)
                if cls_name == type(this).__name__ and test_name.startswith("test"):
                    return getattr(this, test_name).__func__
            frame = frame.f_back
    except Exception:  # noqa: BLE001  (as PyTorch's: no test found)
        pass
    return None


common_utils.extract_test_fn = opinfo_core.extract_test_fn = _running_test_fn

QUICK_SAMPLES = 3
# the execution modes the first samples run in; every sample runs in the default one
MODES = ("eager", "fused")


def in_quick_run(key: str, mode: str) -> bool:
    """Whether op ``key``'s first samples run in ``mode`` in ``make test``: each op in
    one of :data:`MODES`, chosen by a stable hash of its name (about half the ops in
    each); its run in the other mode is ``slow``, and the exhaustive run has both. (The
    second mode of every op cost ``make test`` about 5 of its minutes on 2 cores.)"""
    return MODES[zlib.crc32(key.encode()) % len(MODES)] == mode


DEFAULT_MODE = "fused"
SEED = 0
OP_TIMEOUT = float(os.environ.get("TORCH_PJRT_OP_TIMEOUT", "120"))

# The dtype an op is tested in: float32, else the first of these it supports on the CPU.
TEST_DTYPES = (
    torch.float32,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.float64,
)


# --- which ops, which dtype -----------------------------------------------------------


def op_key(op) -> str:
    """``name`` or ``name.variant``: the key of the expectation tables and the test id."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def ops_by_key() -> dict:
    return {op_key(op): op for op in op_db}


def cpu_dtypes(op) -> set:
    return set(op.supported_dtypes("cpu"))


def dtype_for(op):
    """The dtype the test runs an op in (None when the op has no usable CPU dtype)."""
    supported = cpu_dtypes(op)
    for dtype in TEST_DTYPES:
        if dtype in supported:
            return dtype
    return None


def tolerances(op, dtype) -> dict:
    """``atol``/``rtol`` from the OpInfo's own overrides for ``dtype``, else {} (defaults).

    Every ``toleranceOverride`` and ``precisionOverride`` the OpInfo declares for the
    dtype counts (any test class, any device type: an accelerator's tolerances are the
    relevant ones for a device compared with the CPU); the largest values win.
    """
    atol = rtol = None
    for info in op.decorators:
        if getattr(info, "active_if", True) is False:
            continue
        if getattr(info, "dtypes", None) is not None and dtype not in info.dtypes:
            continue
        for dec in getattr(info, "decorators", ()):
            if isinstance(dec, toleranceOverride) and dtype in dec.d:
                t = dec.d[dtype]
                atol = max(atol or 0.0, t.atol)
                rtol = max(rtol or 0.0, t.rtol)
            elif isinstance(dec, precisionOverride) and dtype in dec.d:
                atol = max(atol or 0.0, dec.d[dtype])
    if atol is None:
        return {}
    if rtol is None:  # a precision override alone: assert_close's default rtol
        rtol = {torch.float16: 1e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-7}.get(dtype, 1.3e-6)
    return {"atol": atol, "rtol": rtol}


def samples(op, dtype, limit=None) -> list:
    """The op's CPU sample inputs for ``dtype`` (the first ``limit``), from a fixed seed."""
    torch.manual_seed(SEED)
    random.seed(SEED)
    np.random.seed(SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gen = op.sample_inputs("cpu", dtype, requires_grad=False)
        return list(itertools.islice(gen, limit)) if limit else list(gen)


# --- moving and comparing -------------------------------------------------------------


def _map(fn, x):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple
        return type(x)(*(_map(fn, v) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(_map(fn, v) for v in x)
    if isinstance(x, dict):
        return {k: _map(fn, v) for k, v in x.items()}
    return x


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _tensors(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _tensors(v)


def _to_pjrt_device(v):
    if isinstance(v, torch.device) and v.type == "cpu":
        return torch.device("pjrt")
    if isinstance(v, str) and v == "cpu":
        return "pjrt"
    return v


def _storage_on_pjrt(t: torch.Tensor, storages: dict) -> torch.Tensor:
    """``t`` as the same view of its storage, the storage moved to pjrt once (so views
    of one storage stay views of one storage there, with their strides)."""
    storage = t.untyped_storage()
    key = (storage.data_ptr(), t.dtype)
    base = storages.get(key)
    if base is None:
        whole = torch.empty(0, dtype=t.dtype).set_(storage, 0, (storage.nbytes() // t.itemsize,))
        base = storages[key] = whole.detach().to("pjrt")
    return base.as_strided(t.shape, t.stride(), t.storage_offset())


def to_pjrt(args, kwargs, views: bool = False):
    """The sample's arguments with every tensor moved to pjrt (aliases kept) and
    ``device=`` arguments pointed at pjrt. ``views``: CPU tensors move as views of their
    storages (strides, and memory shared between tensors, kept), not as contiguous
    copies."""
    moved: dict = {}
    storages: dict = {}

    def move(t):
        if id(t) not in moved:
            if t.device.type != "cpu":
                moved[id(t)] = t.detach()
            elif views and t.layout is torch.strided and t.untyped_storage().nbytes():
                moved[id(t)] = _storage_on_pjrt(t.detach(), storages)
            else:
                moved[id(t)] = t.detach().to("pjrt")
        return moved[id(t)]

    args = _map(move, args)
    kwargs = _map(move, kwargs)
    kwargs = {k: _to_pjrt_device(v) if k == "device" else v for k, v in kwargs.items()}
    args = [_to_pjrt_device(a) if isinstance(a, (torch.device, str)) else a for a in args]
    return args, kwargs


def cpu_copy(args, kwargs):
    """A copy of the sample's arguments that the CPU run may mutate (aliases kept)."""
    copies: dict = {}

    def copy(t):
        if id(t) not in copies:
            copies[id(t)] = t.detach().clone()
        return copies[id(t)]

    return list(_map(copy, args)), _map(copy, kwargs)


def _expected_device(t: torch.Tensor) -> str:
    return "pjrt" if t.device.type == "cpu" else t.device.type


def compare(actual, expected, tol: dict, shape_only: bool = False, path: str = "output"):
    """Compare a pjrt result with the CPU one: structure, devices, shapes, dtypes, values."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise AssertionError(f"{path}: expected a tensor, got {type(actual).__name__}")
        if actual.device.type != _expected_device(expected):
            raise AssertionError(
                f"{path}: result on {actual.device}, expected a {_expected_device(expected)} tensor"
            )
        if actual.dtype != expected.dtype:
            raise AssertionError(f"{path}: dtype {actual.dtype}, expected {expected.dtype}")
        if actual.shape != expected.shape:
            raise AssertionError(
                f"{path}: shape {list(actual.shape)}, expected {list(expected.shape)}"
            )
        if shape_only:
            return
        if actual.device.type == "pjrt":
            actual = actual.cpu()
        torch.testing.assert_close(
            actual, expected, equal_nan=True, check_device=False, msg=_msg(path), **tol
        )
    elif isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            raise AssertionError(f"{path}: expected {_describe(expected)}, got {_describe(actual)}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            compare(a, e, tol, shape_only, f"{path}[{i}]")
    elif isinstance(expected, dict):
        if not isinstance(actual, dict) or actual.keys() != expected.keys():
            raise AssertionError(f"{path}: expected {_describe(expected)}, got {_describe(actual)}")
        for k in expected:
            compare(actual[k], expected[k], tol, shape_only, f"{path}[{k!r}]")
    elif isinstance(expected, (bool, int, float, complex)) and not shape_only:
        torch.testing.assert_close(actual, expected, equal_nan=True, msg=_msg(path), **tol)
    elif not shape_only and actual != expected:
        raise AssertionError(f"{path}: {actual!r} != {expected!r}")


def _msg(path):
    return lambda m: f"{path}: {m}"


def _describe(x) -> str:
    if isinstance(x, (list, tuple, dict)):
        return f"a {type(x).__name__} of {len(x)}"
    return type(x).__name__


# --- running one op -------------------------------------------------------------------


class SampleFailure(AssertionError):
    """A sample whose pjrt run raised or differs from the CPU's."""

    def __init__(self, index: int, sample, cause: BaseException):
        self.index = index
        self.cause = cause
        first = next((ln for ln in str(cause).splitlines() if ln.strip()), "")
        text = _sample_text(sample)
        super().__init__(f"sample {index} ({text}): {type(cause).__name__}: {first}")


def _sample_text(sample) -> str:
    def show(x):
        if isinstance(x, torch.Tensor):
            return f"Tensor{list(x.shape)}"
        if isinstance(x, (list, tuple)):
            inner = ", ".join(show(v) for v in x[:4]) + (", ..." if len(x) > 4 else "")
            return f"[{inner}]" if isinstance(x, list) else f"({inner})"
        return repr(x)

    parts = [show(sample.input)] + [show(a) for a in sample.args]
    parts += [f"{k}={show(v)}" for k, v in sample.kwargs.items()]
    return ", ".join(parts)[:200]


class OpTimeout(Exception):
    pass


@contextmanager
def time_limit(seconds: float):
    """Raise OpTimeout in the main thread after ``seconds`` (a no-op elsewhere)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise OpTimeout(f"op ran longer than {seconds:.0f}s (TORCH_PJRT_OP_TIMEOUT)")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# Ops whose index output may order equal values either way unless ``stable=True`` (as
# PyTorch documents): their indices count as equal when they select equal values.
# op key -> (which output holds the indices: None for the op's only output, the
# position of ``dim`` among the sample's positional arguments)
TIED_INDICES = {"sort": (1, 0), "argsort": (None, 0), "topk": (1, 1)}


def _settle_ties(key: str, sample, actual, expected):
    """For :data:`TIED_INDICES` ops (not asked to be stable), both results with their
    indices replaced by the input values they select."""
    if key not in TIED_INDICES or sample.kwargs.get("stable"):
        return actual, expected
    which, dim_at = TIED_INDICES[key]
    dim = sample.args[dim_at] if len(sample.args) > dim_at else sample.kwargs.get("dim", -1)
    source = sample.input

    def indices(result):
        return result if which is None else result[which]

    compare(indices(actual), indices(expected), {}, shape_only=True, path="indices")

    def select(result):
        idx = indices(result)
        picked = source.gather(dim, idx.cpu()) if source.ndim else source.clone()
        picked = picked.to(idx.device)  # (the pjrt result stays a pjrt tensor)
        return picked if which is None else (*result[:which], picked, *result[which + 1 :])

    return select(actual), select(expected)


HALF = (torch.float16, torch.bfloat16)


def _closer_to_exact(op, args, kwargs, dtype, actual, expected, tol) -> bool:
    """For half-precision samples: whether pjrt's outputs are, by the comparison's own
    measure (``|error| / (atol + rtol |exact|)``), no further from the exact result than
    the CPU's, the exact result being the op computed in float64 from the same inputs.

    NOTE: ATen's CPU kernels round some half-precision intermediates and XLA others (or
    none), so the two can differ by a unit in the last place where both are as accurate;
    this accepts such a difference only when pjrt is at least as close to the exact value.
    """
    if dtype not in HALF:
        return False

    def wide(t):
        return t.detach().double() if t.dtype == dtype else t.detach().clone()

    try:
        exact = op(*_map(wide, list(args)), **_map(wide, dict(kwargs)))
    except Exception:
        return False
    a_leaves, e_leaves = list(_tensors(actual)), list(_tensors(expected))
    x_leaves = list(_tensors(exact))
    if not (len(a_leaves) == len(e_leaves) == len(x_leaves)):
        return False
    atol = tol.get("atol", 1e-5)
    rtol = tol.get("rtol", 1.6e-2 if dtype == torch.bfloat16 else 1e-3)
    for a, e, x in zip(a_leaves, e_leaves, x_leaves):
        if not e.dtype.is_floating_point:
            if not torch.equal(a.cpu(), e):
                return False
            continue
        if a.shape != e.shape or a.dtype != e.dtype or x.shape != e.shape:
            return False
        x = x.double()
        scale = atol + rtol * x.abs()
        ours = ((a.cpu().double() - x).abs() / scale).nan_to_num(0.0)
        theirs = ((e.double() - x).abs() / scale).nan_to_num(0.0)
        if not torch.equal(a.cpu().isnan(), e.isnan()):
            return False
        if ours.numel() and ours.max() > max(1.0, theirs.max().item()):
            return False
    return True


def cpu_reference(op, args, kwargs):
    """(arguments, keyword arguments, result) of the op run on a CPU copy of the
    arguments (which it may have written), or None when the CPU raises."""
    cpu_args, cpu_kwargs = cpu_copy(args, kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return cpu_args, cpu_kwargs, op(*cpu_args, **cpu_kwargs)
        except Exception:
            return None


def run_sample(op, sample, dtype, shape_only: bool = False) -> bool:
    """Run one sample on both devices and compare; False when the CPU run raises."""
    args = [sample.input, *sample.args]
    kwargs = dict(sample.kwargs)
    reference = cpu_reference(op, args, kwargs)
    if reference is None:
        return False
    cpu_args, cpu_kwargs, expected = reference
    dev_args, dev_kwargs = to_pjrt(args, kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # a sample with no tensor and no device (``arange(2)``) makes pjrt the default device
        untied = next(_tensors([args, kwargs]), None) is None and "device" not in kwargs
        with torch_pjrt.config(fallback="error"):
            with torch.device("pjrt") if untied else _nothing():
                actual = op(*dev_args, **dev_kwargs)
            tol = tolerances(op, dtype)
            if not shape_only:
                actual, expected = _settle_ties(op_key(op), sample, actual, expected)
            try:
                compare(actual, expected, tol, shape_only)
            except AssertionError:
                closer = _closer_to_exact(op, args, kwargs, dtype, actual, expected, tol)
                if shape_only or not closer:
                    raise
            # whatever the op wrote in place must match too
            for i, (a, e) in enumerate(zip(_tensors(dev_args), _tensors(cpu_args))):
                compare(a, e, tol, shape_only, f"argument tensor {i} after the op")
            for k in cpu_kwargs:
                for a, e in zip(_tensors(dev_kwargs[k]), _tensors(cpu_kwargs[k])):
                    compare(a, e, tol, shape_only, f"argument {k} after the op")
    return True


def check_op(op, dtype, limit=None, shape_only: bool = False) -> tuple[int, int]:
    """Run the op's first ``limit`` samples (all when None); (samples, compared).

    Raises SampleFailure at the first sample that fails.
    """
    return _check(samples(op, dtype, limit), lambda s: run_sample(op, s, dtype, shape_only))


def _check(cases: list, run) -> tuple[int, int]:
    """``run`` each sample; (samples, compared), or SampleFailure at the first failure."""
    compared = 0
    for index, sample in enumerate(cases):
        try:
            compared += run(sample)
        except OpTimeout:
            raise
        except Exception as exc:
            raise SampleFailure(index, sample, exc) from exc
    return len(cases), compared


# --- gradients ------------------------------------------------------------------------

GRAD_SAMPLES = 2  # samples per op in ``make test``; the exhaustive run takes all


def grad_eligible(op) -> bool:
    """Whether the op's float32 gradients are tested: it supports autograd and float32."""
    return op.supports_autograd and torch.float32 in cpu_dtypes(op)


def grad_samples(op, limit=None) -> list:
    """The op's float32 CPU samples with ``requires_grad`` inputs, from a fixed seed."""
    torch.manual_seed(SEED)
    random.seed(SEED)
    np.random.seed(SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gen = op.sample_inputs("cpu", torch.float32, requires_grad=True)
        return list(itertools.islice(gen, limit)) if limit else list(gen)


def _differentiable(t) -> bool:
    return (
        isinstance(t, torch.Tensor)
        and t.requires_grad
        and (t.dtype.is_floating_point or t.dtype.is_complex)
    )


def _leaf_copies(args, kwargs, device: str):
    """The sample's arguments on ``device`` with every tensor that requires grad made a
    fresh leaf (aliases kept), and the list of those leaves in order of appearance."""
    moved: dict = {}
    leaves: list = []

    def move(t):
        if id(t) not in moved:
            c = t.detach().to(device) if device != "cpu" else t.detach().clone()
            if _differentiable(t):
                c.requires_grad_(True)
                leaves.append(c)
            moved[id(t)] = c
        return moved[id(t)]

    args, kwargs = _map(move, list(args)), _map(move, dict(kwargs))
    if device != "cpu":
        kwargs = {k: _to_pjrt_device(v) if k == "device" else v for k, v in kwargs.items()}
    return args, kwargs, leaves


def _backward(op, sample, args, kwargs, leaves, cotangents=None):
    """Gradients of the op's differentiable outputs with respect to ``leaves``, for
    ``cotangents`` (drawn from a fixed CPU generator when None); (grads, cotangents)."""
    out = sample.output_process_fn_grad(op(*args, **kwargs))
    outs = [t for t in _tensors(out) if _differentiable(t)]
    if not outs:
        return None, None
    if cotangents is None:
        g = torch.Generator().manual_seed(SEED)
        cotangents = [torch.randn(o.shape, dtype=o.dtype, generator=g) for o in outs]
    device = outs[0].device
    grads = torch.autograd.grad(outs, leaves, [c.to(device) for c in cotangents], allow_unused=True)
    return grads, cotangents


def run_grad_sample(op, sample) -> bool:
    """Compare the gradients of one sample on pjrt with the CPU's (a random cotangent
    through ``torch.autograd.grad``); False when the CPU run raises or has nothing to
    differentiate."""
    args = [sample.input, *sample.args]
    cpu_args, cpu_kwargs, cpu_leaves = _leaf_copies(args, sample.kwargs, "cpu")
    if not cpu_leaves:
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            expected, cotangents = _backward(op, sample, cpu_args, cpu_kwargs, cpu_leaves)
        except Exception:
            return False
        if expected is None:
            return False
        dev_args, dev_kwargs, dev_leaves = _leaf_copies(args, sample.kwargs, "pjrt")
        with torch_pjrt.config(fallback="error"):
            actual, _ = _backward(op, sample, dev_args, dev_kwargs, dev_leaves, cotangents)
            tol = tolerances(op, torch.float32)
            wider = GRAD_TOLERANCES.get(op_key(op), ({}, ""))[0]
            if wider:
                tol = {k: max(tol.get(k, 0.0), wider[k]) for k in ("atol", "rtol")}
            for i, (a, e) in enumerate(zip(actual, expected)):
                if e is None:  # unused on the CPU: pjrt may say None or zeros
                    if a is not None and bool(a.cpu().any()):
                        raise AssertionError(f"gradient {i}: nonzero where the CPU has none")
                    continue
                if a is None:
                    a = torch.zeros_like(e, device="pjrt")  # unused on pjrt: zeros
                compare(a, e, tol, path=f"gradient {i}")
    return True


def check_grad(op, limit=None) -> tuple[int, int]:
    """:func:`check_op` for float32 gradients."""
    return _check(grad_samples(op, limit), lambda s: run_grad_sample(op, s))


def short_error(exc: BaseException, width: int = 80) -> str:
    """A one-line summary of a failure, for the tables."""
    cause = exc.cause if isinstance(exc, SampleFailure) else exc
    if isinstance(cause, torch_pjrt.LoweringMissing):
        text = "no lowering: " + str(cause).split("'")[1]
    else:
        first = next((ln.strip() for ln in str(cause).splitlines() if ln.strip()), "")
        text = f"{type(cause).__name__}: {first}"
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def failure_report(exc: BaseException, frames: int = 4) -> str:
    """The failure and the innermost frames of its cause."""
    cause = exc.cause if isinstance(exc, SampleFailure) else exc
    tb = "".join(traceback.format_tb(cause.__traceback__)[-frames:])
    return f"{exc}\n{tb}"


# --- the test -------------------------------------------------------------------------


def _param(test: str, op, subset: str, limit, mode: str):
    """One op's test parameter, marked from the expectation tables: the exhaustive
    (``limit`` None) runs and the first samples in the op's other mode
    (:func:`in_quick_run`) are ``slow``; see :func:`tests.expectations.op_failure`."""
    key = op_key(op)
    marks = [pytest.mark.slow] if limit is None or not in_quick_run(key, mode) else []
    reason = E.op_failure(test, key, mode, exhaustive=limit is None)
    if key in SKIP:
        marks.append(pytest.mark.skip(reason=SKIP[key]))
    elif reason is not None:
        marks.append(E.xfail(reason))
    return pytest.param(op, limit, mode, id=f"{key}-{subset}-{mode}", marks=marks)


def _subsets(quick: str, quick_limit: int):
    """(subset name, sample limit, mode) of each parametrization of an op."""
    yield from ((quick, quick_limit, mode) for mode in MODES)
    yield "all", None, DEFAULT_MODE


def _params():
    for subset, limit, mode in _subsets("first3", QUICK_SAMPLES):
        for op in op_db:
            yield _param("test_op", op, subset, limit, mode)


@pytest.mark.parametrize("op, limit, mode", list(_params()))
def test_op(op, limit, mode):
    dtype = dtype_for(op)
    if dtype is None:
        pytest.skip(E.SKIP_NO_DTYPE)
    _run_op_test(op, dtype, limit, mode)


def _run_op_test(op, dtype, limit, mode: str) -> None:
    """``check_op`` in ``mode``, failing the test with a short report, or skipping it when
    the CPU refuses every sample."""
    report = None
    try:
        with time_limit(OP_TIMEOUT), torch_pjrt.mode(mode):
            total, compared = check_op(op, dtype, limit, shape_only=op_key(op) in SHAPE_ONLY)
    except (SampleFailure, OpTimeout) as exc:
        report = failure_report(exc)
    if report is not None:
        # a short report: pytest's own traceback would print (and so compute) pjrt tensors
        pytest.fail(report, pytrace=False)
    if compared == 0:
        pytest.skip(E.SKIP_CPU_REFUSES.format(total=total) if total else E.SKIP_NO_SAMPLES)


COMPLEX = torch.complex64


def _complex_params():
    for op in op_db:
        key = op_key(op)
        if COMPLEX not in cpu_dtypes(op) or dtype_for(op) == COMPLEX or key in SHAPE_ONLY:
            continue
        mode = next(m for m in MODES if in_quick_run(key, m))
        marks = [pytest.mark.skip(reason=SKIP[key])] if key in SKIP else []
        if key in E.XFAIL_COMPLEX:
            marks.append(E.xfail(E.XFAIL_COMPLEX[key]))
        yield pytest.param(op, mode, id=f"{key}-first3-{mode}", marks=marks)


@pytest.mark.parametrize("op, mode", list(_complex_params()))
def test_op_complex(op, mode):
    _run_op_test(op, COMPLEX, QUICK_SAMPLES, mode)


def _grad_params():
    for subset, limit, mode in _subsets("first2", GRAD_SAMPLES):
        for op in op_db:
            key = op_key(op)
            if grad_eligible(op) and key not in SKIP and key not in SHAPE_ONLY:
                yield _param("test_grad", op, subset, limit, mode)


@pytest.mark.parametrize("op, limit, mode", list(_grad_params()))
def test_grad(op, limit, mode):
    report = None
    try:
        with time_limit(OP_TIMEOUT), torch_pjrt.mode(mode):
            total, compared = check_grad(op, limit)
    except (SampleFailure, OpTimeout) as exc:
        report = failure_report(exc)
    if report is not None:
        pytest.fail(report, pytrace=False)
    if compared == 0:
        pytest.skip(E.SKIP_NO_GRADIENT.format(total=total))


def _overlaps(tables: dict, may_share: tuple = ()) -> list:
    """Keys in two of ``tables``, except in the pairs of ``may_share``."""
    return [
        f"{a} and {b}: {sorted(set(ta) & set(tb))}"
        for (a, ta), (b, tb) in itertools.combinations(tables.items(), 2)
        if set(ta) & set(tb) and {a, b} not in [set(pair) for pair in may_share]
    ]


def test_expectation_tables_name_real_ops():
    """Every op key of tests/expectations.py names an op_db entry, and no op is in two
    tables that would both decide one test's outcome."""
    keys = set(ops_by_key())
    tables = {
        "SKIP": SKIP,
        "SHAPE_ONLY": SHAPE_ONLY,
        "XFAIL": E.XFAIL,
        "XFAIL_EAGER": E.XFAIL_EAGER,
        "XFAIL_FUSED": E.XFAIL_FUSED,
        "XFAIL_EXHAUSTIVE": E.XFAIL_EXHAUSTIVE,
    }
    grad_tables = {
        "XFAIL_GRAD": E.XFAIL_GRAD,
        "XFAIL_GRAD_EAGER": E.XFAIL_GRAD_EAGER,
        "XFAIL_GRAD_FUSED": E.XFAIL_GRAD_FUSED,
        "XFAIL_GRAD_EXHAUSTIVE": E.XFAIL_GRAD_EXHAUSTIVE,
    }
    others = {"GRAD_TOLERANCES": GRAD_TOLERANCES, "XFAIL_COMPLEX": E.XFAIL_COMPLEX}
    for name, table in {**grad_tables, **others}.items():
        assert not set(table) - keys, f"{name}: not in op_db: {sorted(set(table) - keys)}"
        assert not set(table) & set(SKIP), f"{name}: skipped ops: {sorted(set(table) & set(SKIP))}"
    unknown = {name: sorted(set(t) - keys) for name, t in tables.items() if set(t) - keys}
    assert not unknown, f"not in op_db (renamed or removed?): {unknown}"
    # the exhaustive run is fused: an op may fail later samples there and early ones in eager
    overlaps = _overlaps(tables, [("XFAIL_EAGER", "XFAIL_EXHAUSTIVE")])
    overlaps += _overlaps(grad_tables, [("XFAIL_GRAD_EAGER", "XFAIL_GRAD_EXHAUSTIVE")])
    assert not overlaps, "ops in two tables: " + "; ".join(overlaps)
