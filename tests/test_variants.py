"""In-place and ``out=`` variants of every OpInfo op, on pjrt against the CPU.

For each ``op_db`` entry with an in-place variant or ``supports_out``, the first
:data:`SAMPLES` samples (float32 where the op has it, else the dtype tests/test_ops.py
uses) run under ``torch_pjrt.config(fallback="error")``:

- in place: ``op_(t, ...)`` must return ``t`` itself, bump its version counter when the
  CPU's does, and leave in ``t``, and in a view of ``t`` taken before the call, the
  values the CPU's in-place variant leaves in a clone (a sample the CPU refuses in
  place is skipped; a variant that changes ``t``'s shape or strides, like ``squeeze_``,
  is not checked through the old view);
- ``out=``: with correctly shaped empty outs (``empty_like`` the CPU's results, a tuple
  for multi-output ops) the op returns what the CPU returns (the outs themselves, or
  None for list outs), and the outs, and views of them taken before the call, hold the
  CPU's functional result. For the first sample also: with outs of a wrong, nonzero
  size the result is resized and PyTorch's resize warning raised exactly when the CPU
  raises it; with outs of a dtype the result may not be cast to, pjrt raises where the
  CPU raises (the same exception type) and otherwise computes what the CPU computes.

One test per op and execution mode (``eager`` and ``fused``, entered around the whole
op: in fused mode the results are compared after the recording runs), reporting every
failing sample and check; ``make test`` runs each op in one of the modes, the other is
``slow`` (``tests.test_ops.in_quick_run``). ``XFAIL_VARIANTS`` (in tests/expectations.py,
with the other expectations) lists the ops expected to fail in both modes,
``XFAIL_VARIANTS_EAGER`` and ``XFAIL_VARIANTS_FUSED`` in one (strict: a fixed op fails
the run until it is removed).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

import torch_pjrt
from tests import expectations as E
from tests.expectations import SHAPE_ONLY, SKIP, XFAIL_VARIANTS
from tests.test_ops import (
    MODES,
    SampleFailure,
    compare,
    cpu_copy,
    cpu_reference,
    dtype_for,
    in_quick_run,
    op_key,
    samples,
    to_pjrt,
    tolerances,
)

SAMPLES = 2


# an out= dtype each result kind may not be cast to (bool results cast to anything)
_UNCASTABLE = {"float": torch.int64, "complex": torch.float32, "int": torch.bool}

_RESIZE_WARNING = "was resized"


def _variant_dtype(op):
    return torch.float32 if torch.float32 in op.supported_dtypes("cpu") else dtype_for(op)


def _call_args(sample):
    return [sample.input, *sample.args], dict(sample.kwargs)


# --- in place -------------------------------------------------------------------------


def _layout(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride()


def check_inplace(op, sample, dtype, shape_only: bool) -> bool:
    """``op_(t, ...)`` on pjrt against the same call on a CPU clone; False if not run."""
    inplace = op.get_inplace()
    if inplace is None or not isinstance(sample.input, torch.Tensor):
        return False
    args, kwargs = _call_args(sample)
    cpu_args, cpu_kwargs = cpu_copy(args, kwargs)
    cpu_t = cpu_args[0]
    cpu_before = _layout(cpu_t), cpu_t._version
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            inplace(*cpu_args, **cpu_kwargs)
        except Exception:  # e.g. a broadcast the in-place variant cannot do
            return False
        dev_args, dev_kwargs = to_pjrt(args, kwargs)
        t = dev_args[0]
        view = t[...]  # taken before the write: it must see it
        version = t._version
        with torch_pjrt.config(fallback="error"):
            result = inplace(*dev_args, **dev_kwargs)
    if result is not t:
        raise AssertionError("the in-place variant did not return the tensor it was called on")
    # NOTE: the CPU decides: a data write bumps the version, a metadata change
    # (resize_as_) or an op that writes nothing (dropout with training=False) does not
    if (t._version > version) != (cpu_t._version > cpu_before[1]):
        said = "bumps" if cpu_t._version > cpu_before[1] else "does not bump"
        raise AssertionError(f"the CPU {said} the version counter, pjrt does the opposite")
    tol = tolerances(op, dtype)
    compare(t, cpu_t, tol, shape_only, "self after the op")
    if _layout(cpu_t) == cpu_before[0]:  # (squeeze_, t_, resize_: a view keeps the old one)
        compare(view, cpu_t, tol, shape_only, "a view of self taken before the op")
    return True


# --- out= -----------------------------------------------------------------------------


def _out_like(expected, make):
    """Outs for a result: ``make(t)`` per tensor, a tuple for multi-output ops; None when
    the result is not a strided tensor or a tuple of them (a sparse result, a number)."""
    results = _as_tuple(expected)
    if not all(isinstance(e, torch.Tensor) and e.layout == torch.strided for e in results):
        return None
    return make(expected) if isinstance(expected, torch.Tensor) else tuple(map(make, results))


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (list, tuple)) else (x,)


def _wrong_shape(t: torch.Tensor) -> tuple:
    return (t.numel() + 1,)  # never t's shape, never empty


def _uncastable(t: torch.Tensor):
    if t.dtype.is_complex:
        return _UNCASTABLE["complex"]
    if t.dtype.is_floating_point:
        return _UNCASTABLE["float"]
    return None if t.dtype == torch.bool else _UNCASTABLE["int"]


def _run_out(op, sample, outs, device: str):
    """The op with ``out=outs`` on one device: (result or exception, resize warned)."""
    args, kwargs = _call_args(sample)
    if device == "cpu":
        args, kwargs = cpu_copy(args, kwargs)
    else:
        args, kwargs = to_pjrt(args, kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if device == "cpu":
                result = op(*args, **kwargs, out=outs)
            else:
                with torch_pjrt.config(fallback="error"):
                    result = op(*args, **kwargs, out=outs)
        except Exception as exc:  # noqa: BLE001  (compared with the other device's)
            result = exc
    warned = any(
        issubclass(w.category, UserWarning) and _RESIZE_WARNING in str(w.message) for w in caught
    )
    return result, warned


def _returned(result, outs) -> str:
    """What the op gave back: "outs" (the out tensors themselves), "none" or "other"."""
    if result is None:
        return "none"
    got, want = _as_tuple(result), _as_tuple(outs)
    if len(got) == len(want) and all(g is w for g, w in zip(got, want)):
        return "outs"
    return "other"


def check_out(op, sample, dtype, shape_only: bool, misuse: bool = True) -> bool:
    """The op's ``out=`` form on pjrt against the CPU; False if not run. With ``misuse``,
    also outs of a wrong shape and of a dtype the result cannot be cast to."""
    if not op.supports_out:
        return False
    reference = cpu_reference(op, *_call_args(sample))
    if reference is None:
        return False
    expected = reference[2]
    if _out_like(expected, lambda e: e) is None:
        return False
    tol = tolerances(op, dtype)
    dev_outs = _check_like_cpu(
        op, sample, expected, lambda e, device: torch.empty_like(e, device=device), tol, shape_only
    )
    if dev_outs is None:  # the CPU refuses this out= call
        return False
    outs, views = dev_outs
    compare(outs, _as_tuple(expected), tol, shape_only, "out")
    compare(views, _as_tuple(expected), tol, shape_only, "a view of out taken before the op")
    if not misuse:
        return True
    _check_like_cpu(
        op,
        sample,
        expected,
        lambda e, device: torch.empty(_wrong_shape(e), dtype=e.dtype, device=device),
        tol,
        shape_only,
        "out= of a wrong shape",
    )
    if any(_uncastable(e) is not None for e in _as_tuple(expected)):
        _check_like_cpu(
            op,
            sample,
            expected,
            lambda e, device: torch.empty(e.shape, dtype=_uncastable(e) or e.dtype, device=device),
            tol,
            shape_only,
            "out= of a dtype the result cannot be cast to",
        )
    return True


def _check_like_cpu(op, sample, expected, make, tol, shape_only, what="out="):
    """Outs from ``make(result, device)``: pjrt must raise, warn about a resize, return
    and compute as the CPU does with the same outs. Returns pjrt's outs after the call
    and views of them taken before it (None when the CPU raises)."""
    cpu_outs = _out_like(expected, lambda e: make(e, "cpu"))
    dev_outs = _out_like(expected, lambda e: make(e, "pjrt"))
    views = tuple(o[...] for o in _as_tuple(dev_outs))
    cpu_result, cpu_warned = _run_out(op, sample, cpu_outs, "cpu")
    dev_result, dev_warned = _run_out(op, sample, dev_outs, "pjrt")
    if isinstance(cpu_result, Exception):
        if type(dev_result) is not type(cpu_result):
            got = f"{type(dev_result).__name__}: {dev_result}"[:300]
            raise AssertionError(
                f"{what}: the CPU raises {type(cpu_result).__name__}, pjrt gives {got}"
            )
        return None
    if isinstance(dev_result, Exception):
        raise AssertionError(f"{what}: raised {type(dev_result).__name__}: {dev_result}")
    returned = _returned(cpu_result, cpu_outs)
    if _returned(dev_result, dev_outs) != returned:
        raise AssertionError(f"{what}: the CPU returns {returned}, pjrt does not")
    if dev_warned != cpu_warned:
        said = "warns" if cpu_warned else "does not warn"
        raise AssertionError(f"{what}: the CPU {said} about resizing, pjrt does the opposite")
    compare(_as_tuple(dev_outs), _as_tuple(cpu_outs), tol, shape_only, what)
    return _as_tuple(dev_outs), views


# --- the test -------------------------------------------------------------------------


def _check_out_once(op, sample, dtype, shape_only: bool) -> bool:
    """:func:`check_out` with correctly shaped outs only (later samples: time)."""
    return check_out(op, sample, dtype, shape_only, misuse=False)


def _params():
    for mode in MODES:
        for op in op_db:
            if op.inplace_variant is None and not op.supports_out:
                continue
            key = op_key(op)
            reason = E.op_failure("test_variants", key, mode)
            marks = [] if in_quick_run(key, mode) else [pytest.mark.slow]
            if key in SKIP:
                marks.append(pytest.mark.skip(reason=SKIP[key]))
            elif reason is not None:
                marks.append(E.xfail(reason))
            yield pytest.param(op, mode, id=f"{key}-{mode}", marks=marks)


@pytest.mark.parametrize("op, mode", list(_params()))
def test_variants(op, mode):
    dtype = _variant_dtype(op)
    if dtype is None:
        pytest.skip(E.SKIP_NO_DTYPE)
    shape_only = op_key(op) in SHAPE_ONLY
    failures, checked = [], 0
    with torch_pjrt.mode(mode):
        for index, sample in enumerate(samples(op, dtype, SAMPLES)):
            checks = (check_inplace, check_out) if index == 0 else (check_inplace, _check_out_once)
            for check in checks:
                try:
                    checked += check(op, sample, dtype, shape_only)
                except Exception as exc:  # noqa: BLE001  (collected: one report per op)
                    failures.append(f"{check.__name__}: {SampleFailure(index, sample, exc)}")
    if failures:
        pytest.fail("\n".join(failures), pytrace=False)
    if not checked:
        pytest.skip(E.SKIP_NO_VARIANT)


def test_xfail_table_names_variant_ops():
    """Every key of the ``XFAIL_VARIANTS`` tables names an op_db entry with a variant, and
    an op failing in both modes is in ``XFAIL_VARIANTS`` alone."""
    keys = {op_key(op) for op in op_db if op.inplace_variant is not None or op.supports_out}
    for table in (XFAIL_VARIANTS, E.XFAIL_VARIANTS_EAGER, E.XFAIL_VARIANTS_FUSED):
        assert not set(table) - keys, sorted(set(table) - keys)
    one_mode = set(E.XFAIL_VARIANTS_EAGER) | set(E.XFAIL_VARIANTS_FUSED)
    assert not one_mode & set(XFAIL_VARIANTS), sorted(one_mode & set(XFAIL_VARIANTS))
    both = set(E.XFAIL_VARIANTS_EAGER) & set(E.XFAIL_VARIANTS_FUSED)
    assert not both, f"failing in both modes, so XFAIL_VARIANTS: {sorted(both)}"
