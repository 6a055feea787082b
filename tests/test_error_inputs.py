"""PyTorch's argument checks on pjrt: every OpInfo error input raises there as it should.

For each entry of ``torch.testing._internal.common_methods_invocations.op_db`` with
``error_inputs``, every ``ErrorInput`` the OpInfo makes on the CPU is run on pjrt, its
tensors moved by ``.to("pjrt")`` as views of their storages (``tests.test_ops.to_pjrt``
with ``views=True``: strides and memory shared between tensors are kept, so that the
samples of overlapping ``out=`` tensors still overlap), under
``torch_pjrt.config(fallback="error")`` (so no sample raises by falling back to the CPU).
It must raise the ErrorInput's ``error_type`` with a message matching its
``error_regex``. The op's results are read (``.cpu()``) inside the check, so an error
that surfaces only when the values are computed (a fused recording, a check of values on
the device) counts. A sample the CPU itself accepts is not checked: there is no error to
match (PyTorch marks these as expected failures of its own ``test_errors``).

Parametrizations, as in tests/test_ops.py:

- ``test_error_inputs[<op>-first6-eager]`` and ``test_error_inputs[<op>-first6-fused]``:
  the first 6 error inputs of the op (85% of them), in each mode; ``make test`` runs one
  of the two per op (``tests.test_ops.in_quick_run``), the other is ``slow``.
- ``test_error_inputs[<op>-all-fused]``: every error input, in fused mode (the default);
  marked ``slow``, so it runs only in the exhaustive run (``--exhaustive``). It holds the
  costly ones (multinomial's 2^24 + 1 categories).

Expected outcomes come from ``tests/expectations.py``: ``XFAIL_ERROR_INPUTS`` (ops with a
sample among their first 6 that does not raise, or raises another type, in either mode:
strict xfails with the reason) and ``ERROR_MESSAGES`` (ops whose exception has the right
type and a message of PyTorch's own that differs from the regex, such as a Meta kernel's
wording: only the type is asserted, and the run of all samples fails once every message
matches, so that the entry goes).
"""

from __future__ import annotations

import itertools
import operator
import random
import re
import warnings
from contextlib import nullcontext as _nothing

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.testing._internal.common_methods_invocations import op_db

import torch_pjrt
from tests import expectations as E
from tests.test_ops import (
    SEED,
    OpTimeout,
    _sample_text,
    _subsets,
    _tensors,
    in_quick_run,
    op_key,
    ops_by_key,
    to_pjrt,
)
from torch_pjrt import metrics
from torch_pjrt.ops import registry

QUICK_ERROR_INPUTS = 6  # per op in ``make test``; the exhaustive run takes all


def error_inputs(op, limit=None) -> list:
    """The op's first ``limit`` ErrorInputs (all when None), made on the CPU from a fixed
    seed."""
    torch.manual_seed(SEED)
    random.seed(SEED)
    np.random.seed(SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(itertools.islice(op.error_inputs("cpu"), limit))


def _cpu_raises(op, sample) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            op(sample.input, *sample.args, **sample.kwargs)
        except OpTimeout:  # the time limit of a caller (scripts/op_coverage.py)
            raise
        except Exception:
            return True
    return False


def _pjrt_error(op, sample, mode: str) -> BaseException | None:
    """What the sample raises on pjrt in ``mode``, its results read; None if nothing."""
    args, kwargs = to_pjrt([sample.input, *sample.args], dict(sample.kwargs), views=True)
    # a sample with no tensor and no device makes pjrt the default device
    untied = next(_tensors([args, kwargs]), None) is None and "device" not in kwargs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch_pjrt.config(fallback="error"), torch_pjrt.mode(mode):
                with torch.device("pjrt") if untied else _nothing():
                    out = op(*args, **kwargs)
                for t in _tensors(out):
                    t.cpu()
        except OpTimeout:
            raise
        except Exception as exc:
            return exc
    return None


def error_outcomes(op, mode: str, limit=None) -> tuple[int, list[tuple[str, str]]]:
    """Run the first ``limit`` error inputs of ``op`` (all when None) on pjrt; (samples,
    outcomes), one outcome per sample the CPU refuses: (verdict, line), the verdict
    ``"match"`` (the right type, a message matching the sample's regex), ``"type"`` (the
    right type, another message) or ``"wrong"`` (no exception, or another type), the line
    naming the sample, the expected exception and what happened instead ("" for a match)."""
    cases = error_inputs(op, limit)
    outcomes = []
    for index, case in enumerate(cases):
        sample = case.sample_input
        if not _cpu_raises(op, sample):
            continue
        exc = _pjrt_error(op, sample, mode)
        want = f"{case.error_type.__name__} matching {case.error_regex!r}"
        where = f"sample {index} ({_sample_text(sample)})"
        if exc is None:
            outcomes.append(("wrong", f"{where}: returned, expected {want}"))
        elif not isinstance(exc, case.error_type):
            outcomes.append(("wrong", f"{where}: {_first_line(exc)}; expected {want}"))
        elif not re.search(case.error_regex, str(exc)):
            outcomes.append(("type", f"{where}: {_first_line(exc)}; expected {want}"))
        else:
            outcomes.append(("match", ""))
    return len(cases), outcomes


def check_error_inputs(op, mode: str, limit=None, match=True) -> tuple[int, int, list[str]]:
    """Run the first ``limit`` error inputs of ``op`` (all when None) on pjrt; (samples,
    checked, failures), a failure being a line naming the sample, the expected exception
    and what happened instead. ``match``: the message must match the sample's regex too
    (else the type alone, and, over all samples, that some message does not match)."""
    total, outcomes = error_outcomes(op, mode, limit)
    failed = ("wrong", "type") if match else ("wrong",)
    failures = [line for verdict, line in outcomes if verdict in failed]
    mismatched = sum(verdict == "type" for verdict, _ in outcomes)
    if not match and limit is None and not failures and outcomes and mismatched == 0:
        failures.append("every message matches: remove the op from ERROR_MESSAGES")
    return total, len(outcomes), failures


def _first_line(exc: BaseException) -> str:
    text = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    return f"{type(exc).__name__}: {text[:200]}"


def _params():
    for subset, limit, mode in _subsets("first6", QUICK_ERROR_INPUTS):
        for op in op_db:
            if op.error_inputs_func is None:
                continue
            key = op_key(op)
            slow = limit is None or not in_quick_run(key, mode)
            marks = [pytest.mark.slow] if slow else []
            marks += E.marks(E.XFAIL_ERROR_INPUTS, key)
            yield pytest.param(op, limit, mode, id=f"{key}-{subset}-{mode}", marks=marks)


@pytest.mark.parametrize("op, limit, mode", list(_params()))
def test_error_inputs(op, limit, mode):
    match = op_key(op) not in E.ERROR_MESSAGES
    total, checked, failures = check_error_inputs(op, mode, limit, match)
    if failures:
        # a short report: pytest's own traceback would print (and so compute) pjrt tensors
        pytest.fail("\n".join(failures), pytrace=False)
    if checked == 0:
        pytest.skip(E.SKIP_CPU_ACCEPTS.format(total=total) if total else E.SKIP_NO_ERROR_INPUTS)


def test_error_tables_name_real_ops():
    """Every key of XFAIL_ERROR_INPUTS and ERROR_MESSAGES names an op_db entry with error
    inputs, and no op is in both."""
    keys = {k for k, op in ops_by_key().items() if op.error_inputs_func is not None}
    for name in ("XFAIL_ERROR_INPUTS", "ERROR_MESSAGES"):
        table = getattr(E, name)
        assert not set(table) - keys, f"{name}: no such op with error inputs: {set(table) - keys}"
    both = set(E.XFAIL_ERROR_INPUTS) & set(E.ERROR_MESSAGES)
    assert not both, f"in XFAIL_ERROR_INPUTS and ERROR_MESSAGES: {sorted(both)}"


# --- the mechanism: PyTorch's Meta kernels, once per signature -------------------------


@pytest.mark.parametrize("mode", ["eager", "fused", "debug"])
def test_arguments_are_checked_before_a_program_runs(mode):
    """In every mode, arguments PyTorch refuses raise PyTorch's exception (here its Meta
    kernel's) at the op, and no program is compiled for them."""
    x = torch.ones(3, 4, 5, device="pjrt")
    with torch_pjrt.mode(mode):
        metrics.reset()  # (entering a mode runs the recording that made x)
        with pytest.raises(RuntimeError, match="expected a matrix, but got tensor with dim 3"):
            torch.trace(x)
        with pytest.raises(RuntimeError, match="shifts and dimensions must align"):
            torch.roll(x, [2, 1], 0)
        assert metrics.as_dict()["compilations"] == 0


@pytest.mark.parametrize("mode", ["eager", "fused"])
def test_arguments_are_checked_once_per_signature(mode, monkeypatch):
    """The Meta kernel runs when a call traces a program (new shapes, dtypes or static
    arguments), not on the calls that reuse it."""
    checked = []
    meta_error = registry.meta_error
    monkeypatch.setattr(
        registry, "meta_error", lambda op, *a: checked.append(str(op)) or meta_error(op, *a)
    )
    shape = (7, 11) if mode == "eager" else (11, 7)  # (shapes no other test uses)
    x, y = torch.randn(shape, device="pjrt"), torch.randn(shape, device="pjrt")
    with torch_pjrt.mode(mode):
        for _ in range(3):
            torch.atan2(x, y).cpu()
        assert checked.count("aten.atan2.default") == 1
        torch.atan2(x[:3], y[:3]).cpu()
        assert checked.count("aten.atan2.default") == 2


def test_meta_kernels_that_cannot_tell_change_nothing():
    """A Meta kernel that is missing, or needs values, refuses nothing."""
    x = torch.ones(4, device="pjrt")
    assert registry.meta_error(torch.ops.aten.nonzero.default, (x,), {}) is None
    repeats = torch.ones(4, dtype=torch.int64, device="pjrt")
    assert registry.meta_error(torch.ops.aten.repeat_interleave.Tensor, (repeats,), {}) is None
    assert isinstance(registry.meta_error(torch.ops.aten.trace.default, (x,), {}), RuntimeError)


def test_a_meta_refusal_the_cpu_does_not_make_is_not_made():
    """PyTorch's Meta kernel of ``<<`` refuses a bool shift amount ("Expected shift value
    to have an integral dtype"); the CPU kernel shifts by it: pjrt computes, as the CPU."""
    a, s = torch.tensor([4, 2, -8]), torch.tensor([True, False, True])
    for op in (operator.lshift, operator.rshift, operator.ilshift):
        assert torch.equal(op(a.to("pjrt"), s.to("pjrt")).cpu(), op(a.clone(), s))


# --- the CPU's words ---------------------------------------------------------------------


def _reduce_into(d, op: str, dtype, reduce: str, include_self=True, matrix=False):
    """``index_reduce`` or ``scatter_reduce`` of ones of ``dtype`` into the first place of
    a vector (or, ``matrix``, of each row of a 3x2 matrix)."""
    shape, source_shape, dim = ((3, 2), (3, 1), 1) if matrix else ((3,), (1,), 0)
    self = torch.ones(shape, dtype=dtype, device=d)
    source = torch.ones(source_shape, dtype=dtype, device=d)
    index = torch.zeros(1, dtype=torch.long, device=d)
    if op == "scatter_reduce":
        if matrix:
            index = index.expand(3, 1)
        return self.scatter_reduce(dim, index, source, reduce, include_self=include_self)
    return self.index_reduce(dim, index, source, reduce, include_self=include_self)


# calls PyTorch refuses, whose Meta kernels (or decompositions) word the refusal otherwise
# than the CPU kernels do: on pjrt the message is the CPU's, word for word
_REFUSED = {
    "matmul": lambda d: torch.ones(2, 3, device=d) @ torch.ones(2, 3, device=d),
    "linear": lambda d: F.linear(torch.ones(2, 3, device=d), torch.ones(4, 5, device=d)),
    "dot dtypes": lambda d: torch.dot(
        torch.ones(3, device=d), torch.ones(3, device=d, dtype=torch.half)
    ),
    "dot sizes": lambda d: torch.dot(torch.ones(3, device=d), torch.ones(4, device=d)),
    "masked_fill_": lambda d: torch.ones(3, device=d).masked_fill_(
        torch.ones(3, device=d) > 0, torch.ones(2, device=d)
    ),
    "layer_norm": lambda d: F.layer_norm(torch.ones(2, 3, device=d), (3,), torch.ones(2, device=d)),
    "softshrink": lambda d: F.softshrink(torch.ones(3, device=d), -0.5),
    "roll": lambda d: torch.roll(torch.ones(3, device=d), [1, 2], [0]),
    "trace": lambda d: torch.trace(torch.ones(2, 2, 2, device=d)),
    "cauchy_": lambda d: torch.ones(3, device=d).cauchy_(0, 0),
    "max_unpool2d (a decomposition)": lambda d: F.max_unpool2d(
        torch.ones(1, 1, 2, 2, device=d), torch.zeros(1, 1, 2, 3, dtype=torch.long, device=d), 2
    ),
    # (a bool operand, a Python True included: pjrt subtracted where the CPU refuses)
    "sub bool scalar": lambda d: torch.tensor([1, 2], device=d) - True,
    "rsub bool scalar": lambda d: True - torch.tensor([1.0], device=d),
    "sub bool tensor": lambda d: torch.tensor([True], device=d) - torch.tensor([1], device=d),
    "sub_ bool": lambda d: torch.tensor([1, 2], device=d).sub_(torch.tensor([True], device=d)),
    # (an integer tensor to a negative integer Scalar: pjrt computed 0 or garbage for uint8)
    "pow int negative": lambda d: torch.tensor([1, 2], device=d) ** -1,
    "pow uint8 negative": lambda d: torch.tensor([3], dtype=torch.uint8, device=d).pow(-2),
    "pow_ bool negative": lambda d: torch.tensor([True], device=d).pow_(-1),
    "foreach pow negative": lambda d: torch._foreach_pow([torch.ones(2, device=d).int()], -1),
    # (an integer divided by zero: fmod gave 0, checked on the device now)
    "fmod int by 0": lambda d: torch.fmod(torch.tensor([1, 2], device=d), 0),
    "fmod int by a tensor with 0": lambda d: torch.fmod(
        torch.tensor([1, 2], device=d), torch.tensor([1, 0], device=d)
    ),
    "remainder int by 0": lambda d: torch.tensor([1, 2], device=d) % 0,
    # (the exponent converts to an integer or half result type)
    "pow int8 ** 300": lambda d: torch.tensor([1], dtype=torch.int8, device=d) ** 300,
    "pow half ** 1e5": lambda d: torch.tensor([1.0], dtype=torch.half, device=d) ** 1e5,
    # (dtypes without a CPU kernel: pjrt computed, or crashed for gcd of bools)
    "heaviside of two dtypes": lambda d: torch.heaviside(
        torch.tensor([1, 0], device=d), torch.tensor([0.5], device=d)
    ),
    "hypot ints": lambda d: torch.hypot(torch.tensor([3], device=d), torch.tensor([4], device=d)),
    "logaddexp bools": lambda d: torch.logaddexp(
        torch.tensor([True], device=d), torch.tensor([False], device=d)
    ),
    "logaddexp2 uint8": lambda d: torch.logaddexp2(
        torch.ones(2, dtype=torch.uint8, device=d), torch.ones(2, dtype=torch.uint8, device=d)
    ),
    "softmax ints, last dim": lambda d: torch.softmax(torch.tensor([1, 2], device=d), 0),
    "log_softmax ints, first dim": lambda d: torch.log_softmax(
        torch.ones(2, 3, dtype=torch.int32, device=d), 0
    ),
    "ceil bool": lambda d: torch.ceil(torch.tensor([True], device=d)),
    "round bool": lambda d: torch.round(torch.tensor([True], device=d)),
    "round bool decimals": lambda d: torch.round(torch.tensor([True], device=d), decimals=1),
    "argmax bool": lambda d: torch.argmax(torch.tensor([True, False], device=d)),
    "argmin bool dim": lambda d: torch.argmin(torch.tensor([True, False], device=d), 0),
    "relu bool": lambda d: torch.relu(torch.tensor([True], device=d)),
    "gcd bools": lambda d: torch.gcd(
        torch.tensor([True], device=d), torch.tensor([True], device=d)
    ),
    "lcm floats": lambda d: torch.lcm(torch.ones(2, device=d), torch.ones(2, device=d)),
    "std ints": lambda d: torch.tensor([1, 2], device=d).std(),
    "var_mean ints": lambda d: torch.var_mean(torch.tensor([1, 2], device=d)),
    "logcumsumexp ints": lambda d: torch.tensor([1, 2], device=d).logcumsumexp(0),
    "histc ints": lambda d: torch.histc(torch.tensor([1, 2], device=d), 3),
    "histc bools": lambda d: torch.histc(torch.tensor([True], device=d), 3),
    "bincount floats": lambda d: torch.tensor([1.0], device=d).bincount(),
    "argmax of nothing": lambda d: torch.ones(0, device=d).argmax(),
    "median bools": lambda d: torch.tensor([True, False], device=d).median(),
    "nanmedian bools dim": lambda d: torch.tensor([[True, False]], device=d).nanmedian(1),
    "kthvalue bools": lambda d: torch.tensor([True, False], device=d).kthvalue(1),
    "topk bools": lambda d: torch.tensor([True, False], device=d).topk(1),
    "trace bools": lambda d: torch.ones(2, 2, dtype=torch.bool, device=d).trace(),
    "mm bools": lambda d: (
        torch.ones(2, 2, dtype=torch.bool, device=d) @ torch.ones(2, 2, dtype=torch.bool, device=d)
    ),
    "dot bools": lambda d: torch.ones(2, dtype=torch.bool, device=d).dot(
        torch.ones(2, dtype=torch.bool, device=d)
    ),
    "bmm bools": lambda d: torch.bmm(
        torch.ones(1, 2, 2, dtype=torch.bool, device=d),
        torch.ones(1, 2, 2, dtype=torch.bool, device=d),
    ),
    "addmv bools": lambda d: torch.addmv(
        torch.ones(2, dtype=torch.bool, device=d),
        torch.ones(2, 2, dtype=torch.bool, device=d),
        torch.ones(2, dtype=torch.bool, device=d),
    ),
    # (no bool kernels: pjrt computed)
    "pow bool tensors": lambda d: torch.tensor([True], device=d) ** torch.tensor([True], device=d),
    "pow True bool tensor": lambda d: torch.pow(True, torch.tensor([False], device=d)),
    "clamp bool min": lambda d: torch.tensor([True, False], device=d).clamp(min=True),
    "clamp bool both": lambda d: torch.tensor([True], device=d).clamp(False, True),
    "clamp_max_ bool": lambda d: torch.tensor([True], device=d).clamp_max_(False),
    # (reductions of a scatter or index_reduce the CPU has no kernel for: pjrt computed or
    # failed to lower; index_reduce takes no "sum")
    "index_reduce sum": lambda d: _reduce_into(d, "index_reduce", torch.float, "sum"),
    "index_reduce mean bools": lambda d: _reduce_into(d, "index_reduce", torch.bool, "mean"),
    "index_reduce amax complex vector": lambda d: _reduce_into(
        d, "index_reduce", torch.cfloat, "amax"
    ),
    "index_reduce amin complex matrix": lambda d: _reduce_into(
        d, "index_reduce", torch.cfloat, "amin", matrix=True
    ),
    "index_reduce prod bools without self": lambda d: _reduce_into(
        d, "index_reduce", torch.bool, "prod", include_self=False
    ),
    "scatter_reduce mean bools": lambda d: _reduce_into(d, "scatter_reduce", torch.bool, "mean"),
    "scatter_reduce amin complex": lambda d: _reduce_into(
        d, "scatter_reduce", torch.cfloat, "amin", include_self=False
    ),
    # (complex tensors the CPU has no kernel for: pjrt's lowering failed ("a torch_pjrt
    # bug"), or the Meta kernel worded it otherwise or failed an assert)
    "frac complex": lambda d: torch.frac(torch.ones(2, dtype=torch.cfloat, device=d)),
    "fmod complex": lambda d: torch.fmod(torch.ones(2, dtype=torch.cfloat, device=d), 2),
    "argmax complex": lambda d: torch.ones(2, dtype=torch.cfloat, device=d).argmax(),
    "floor_divide complex": lambda d: torch.ones(2, dtype=torch.cfloat, device=d) // 2,
    "polar complex": lambda d: torch.polar(
        torch.ones(2, dtype=torch.cfloat, device=d), torch.ones(2, dtype=torch.cfloat, device=d)
    ),
    # (complex tensors the Meta kernel accepts and XLA orders by the real part: pjrt
    # computed where the CPU refuses)
    "max complex": lambda d: torch.ones(2, dtype=torch.cfloat, device=d).max(),
    "sort complex": lambda d: torch.ones(2, dtype=torch.cfloat, device=d).sort(),
    "clamp complex": lambda d: torch.ones(2, dtype=torch.cfloat, device=d).clamp(0, 1),
    "gt complex": lambda d: torch.ones(2, dtype=torch.cfloat, device=d) > 0,
    "softmax complex": lambda d: torch.ones(2, dtype=torch.cfloat, device=d).softmax(0),
    "signbit complex": lambda d: torch.ones(2, dtype=torch.cfloat, device=d).signbit(),
    # (integer images the CPU has no resampling kernel for: pjrt computed)
    "interpolate bilinear int32": lambda d: F.interpolate(
        torch.ones(1, 3, 4, 4, dtype=torch.int32, device=d), scale_factor=2, mode="bilinear"
    ),
    "interpolate linear uint8": lambda d: F.interpolate(
        torch.ones(1, 3, 4, dtype=torch.uint8, device=d), scale_factor=2, mode="linear"
    ),
    "interpolate area int64": lambda d: F.interpolate(
        torch.ones(1, 3, 4, 4, dtype=torch.int64, device=d), size=2, mode="area"
    ),
    "unique complex": lambda d: torch.unique(torch.ones(2, dtype=torch.cfloat, device=d)),
    "unique dim complex": lambda d: torch.unique(
        torch.ones(2, dtype=torch.cfloat, device=d), dim=0
    ),
    "unique_consecutive complex": lambda d: torch.unique_consecutive(
        torch.ones(2, dtype=torch.cfloat, device=d)
    ),
}


def _refusal(call, device: str) -> str:
    with pytest.raises(Exception) as info:
        for t in _tensors(call(device)):
            t.cpu()
    return f"{info.type.__name__}: {info.value}"


@pytest.mark.parametrize("mode", ["eager", "fused"])
@pytest.mark.parametrize("case", list(_REFUSED))
def test_refusals_in_the_cpus_words(case, mode):
    """Arguments PyTorch refuses raise on pjrt the CPU's exception with its message, word
    for word (the Meta kernel's words are "a and b must have same reduction dim" where the
    CPU's are "mat1 and mat2 shapes cannot be multiplied (2x3 and 2x3)")."""
    want = _refusal(_REFUSED[case], "cpu")
    with torch_pjrt.mode(mode):
        assert _refusal(_REFUSED[case], "pjrt") == want


@pytest.mark.parametrize(
    "case", ["max complex", "sort complex", "clamp complex", "gt complex", "interpolate area int64"]
)
def test_dtype_refusals_in_compiled_graphs(case):
    """A compiled graph refuses dtypes the CPU kernel has no instance for, as eager calls
    do (the graph's node runs once on CPU stand-ins when it is compiled)."""
    torch._dynamo.reset()
    want = _refusal(_REFUSED[case], "cpu")
    compiled = torch.compile(_REFUSED[case], backend="pjrt")
    assert _refusal(compiled, "pjrt") == want


def test_arguments_too_big_to_stand_in_keep_the_meta_kernels_words(monkeypatch):
    """The CPU's words come from running the op on CPU stand-ins of the arguments; above
    ``registry.CPU_WORDS_LIMIT`` elements that is not done and the Meta kernel's message
    stays."""
    monkeypatch.setattr(registry, "CPU_WORDS_LIMIT", 11)
    a, b = torch.ones(2, 3, device="pjrt"), torch.ones(2, 3, device="pjrt")
    with pytest.raises(RuntimeError, match=r"^a and b must have same reduction dim"):
        torch.mm(a, b)
    monkeypatch.setattr(registry, "CPU_WORDS_LIMIT", 12)
    with pytest.raises(RuntimeError, match=re.escape("cannot be multiplied (2x3 and 2x3)")):
        torch.mm(a, b)
