"""Errors on pjrt read like PyTorch's (as CUDA's do), never as a raw JAX traceback."""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_pjrt
from tests import expectations
from torch_pjrt.diagnostics import metrics

# An op PyTorch knows but torch_pjrt never lowers: it exercises the CPU fallback.
_lib = torch.library.Library("pjrt_test", "DEF")
_lib.define("twice(Tensor x) -> Tensor")
_lib.impl("twice", lambda x: x * 2, "CPU")


def test_mixing_cpu_and_pjrt_tensors():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(3, device="pjrt") + torch.ones(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(3) * torch.ones(3, device="pjrt")


def test_a_cpu_scalar_tensor_mixes_like_on_cuda():
    got = torch.ones(3, device="pjrt") + torch.tensor(2.0)
    assert got.device.type == "pjrt"
    torch.testing.assert_close(got.cpu(), torch.full((3,), 3.0))


@pytest.mark.devices(2)
def test_mixing_two_pjrt_devices():
    with pytest.raises(RuntimeError, match="pjrt:0 and pjrt:1|pjrt:1 and pjrt:0"):
        torch.ones(3, device="pjrt:0") + torch.ones(3, device="pjrt:1")


@pytest.mark.parametrize("index", [2, 99])
def test_invalid_device_index(index):
    with pytest.raises(RuntimeError, match=f"Invalid device pjrt:{index}"):
        torch.ones(2, device=f"pjrt:{index}")


def test_unsupported_dtype_names_dtype_and_platform():
    platform = torch_pjrt.runtime.current_platform()
    with pytest.raises(TypeError, match=rf"complex32.*platform '{platform}'"):
        torch.empty(2, dtype=torch.complex32, device="pjrt")


def test_shape_errors_come_from_pytorch():
    with pytest.raises(RuntimeError, match="broadcast|must match the size"):
        torch.ones(2, 3, device="pjrt") + torch.ones(4, device="pjrt")


def test_inplace_result_shape_mismatch():
    a = torch.ones(3, device="pjrt")
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        a.add_(torch.ones(2, 3, device="pjrt"))


def test_inplace_result_dtype_cannot_be_cast():
    a = torch.ones(3, dtype=torch.int64, device="pjrt")
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired"):
        a.add_(torch.ones(3, device="pjrt"))


def test_out_tensor_on_the_wrong_device():
    with pytest.raises(RuntimeError, match="Expected out tensor to have device pjrt:0"):
        torch.add(torch.ones(2, device="pjrt"), 1, out=torch.empty(2))


def test_out_resize_warns_as_on_cpu():
    out = torch.empty(5, device="pjrt")
    with pytest.warns(UserWarning, match="An output with one or more elements was resized"):
        torch.add(torch.ones(2, device="pjrt"), 1, out=out)
    assert out.shape == (2,)
    torch.testing.assert_close(out.cpu(), torch.full((2,), 2.0))


def test_fallback_runs_on_cpu_warns_once_and_counts():
    metrics.reset()
    x = torch.arange(3.0, device="pjrt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = torch.ops.pjrt_test.twice(x)
        second = torch.ops.pjrt_test.twice(x)
    messages = [str(w.message) for w in caught if "pjrt_test.twice" in str(w.message)]
    assert len(messages) <= 1  # once per op per process (an earlier test may have warned)
    assert first.device.type == "pjrt"
    torch.testing.assert_close(second.cpu(), torch.tensor([0.0, 2.0, 4.0]))
    assert metrics.as_dict()["fallbacks"]["pjrt_test.twice.default"] == 2


def test_fallback_error_names_op_and_schema():
    x = torch.arange(3.0, device="pjrt")
    with torch_pjrt.config(fallback="error"):
        with pytest.raises(torch_pjrt.LoweringMissing) as info:
            torch.ops.pjrt_test.twice(x)
    message = str(info.value)
    assert "pjrt_test.twice.default" in message
    assert "pjrt_test::twice(Tensor x) -> Tensor" in message
    assert "TORCH_PJRT_FALLBACK" in message
    assert isinstance(info.value, NotImplementedError)


def test_fallback_error_from_the_environment():
    import os
    import subprocess
    import sys

    code = (
        "import torch, torch_pjrt\n"
        "lib = torch.library.Library('pjrt_test', 'DEF')\n"
        "lib.define('twice(Tensor x) -> Tensor')\n"
        "lib.impl('twice', lambda x: x * 2, 'CPU')\n"
        "torch.ops.pjrt_test.twice(torch.ones(2, device='pjrt'))\n"
    )
    env = dict(os.environ, TORCH_PJRT_FALLBACK="error")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode != 0
    assert "LoweringMissing" in out.stderr


def _t(device, n=3, dtype=torch.int8):
    return torch.zeros(n, dtype=dtype, device=device)


def _mask(device):
    return torch.tensor([True, False, True], device=device)


# a number given to an op that must convert it to the tensor's dtype (c10's
# Scalar::to<T>): CPU refuses one that does not fit; pjrt must not wrap or saturate it
NUMBERS_THAT_MUST_FIT = {
    "full int8 300": lambda d: torch.full((2,), 300, dtype=torch.int8, device=d),
    "full float16 1e6": lambda d: torch.full((2,), 1e6, dtype=torch.half, device=d),
    "full float32 1e39": lambda d: torch.full((2,), 1e39, device=d),
    "full int32 nan": lambda d: torch.full((2,), float("nan"), dtype=torch.int32, device=d),
    "full float32 inf (fits)": lambda d: torch.full((2,), float("inf"), device=d),
    "new_full": lambda d: _t(d).new_full((2,), 300),
    "full_like": lambda d: torch.full_like(_t(d), 300),
    "full_like uint8 -1 (wraps)": lambda d: torch.full_like(_t(d, dtype=torch.uint8), -1),
    "fill_ uint8 -256": lambda d: _t(d, dtype=torch.uint8).fill_(-256),
    "fill_ int8 127.5": lambda d: _t(d).fill_(127.5),
    "fill_ bfloat16 1e39": lambda d: _t(d, dtype=torch.bfloat16).fill_(1e39),
    "fill_ complex64 1e39j": lambda d: _t(d, dtype=torch.complex64).fill_(1e39j),
    "fill_ float32 1+1j": lambda d: _t(d, dtype=torch.float32).fill_(1 + 1j),
    "fill_ float32 1+0j (fits)": lambda d: _t(d, dtype=torch.float32).fill_(1 + 0j),
    "fill_ bool 5 (fits)": lambda d: _t(d, dtype=torch.bool).fill_(5),
    "masked_fill": lambda d: _t(d).masked_fill(_mask(d), 300),
    "masked_fill tensor value": lambda d: _t(d).masked_fill(_mask(d), torch.tensor(300)),
    "masked_fill tensor value (fits)": lambda d: _t(d).masked_fill(_mask(d), torch.tensor(-7)),
    "index_fill": lambda d: _t(d).index_fill(0, torch.tensor([0], device=d), 300),
    "scatter value": lambda d: _t(d).scatter(0, torch.tensor([0], device=d), 300),
    "clamp min": lambda d: _t(d).clamp(min=300),
    "clamp max": lambda d: _t(d).clamp(max=-300),
    "clamp float bound (promotes)": lambda d: _t(d).clamp(min=2.5),
    "fill_diagonal_": lambda d: _t(d, 4).view(2, 2).fill_diagonal_(300),
    "lerp weight": lambda d: _t(d, 2, torch.float32).lerp(_t(d, 2, torch.float32), 1e40),
    "threshold value": lambda d: torch.nn.functional.threshold(_t(d, 2), 1, 300),
    # a foreach op checks each element: its list may mix dtypes (pjrt wrapped these)
    "foreach clamp_min": lambda d: torch._foreach_clamp_min([_t(d, 2, torch.int32), _t(d)], 300),
    "foreach lerp_ weight": lambda d: torch._foreach_lerp_(
        [_t(d, 2, torch.float32)], [_t(d, 2, torch.float32)], 1e40
    )[0],
    "foreach clamp_max float bound (promotes)": lambda d: torch._foreach_clamp_max([_t(d)], 300.5),
}


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        pytest.param(
            name,
            mode,
            marks=expectations.marks(expectations.XFAIL_COMPILED_NUMBERS, name)
            if mode == "compiled"
            else [],
        )
        for name in sorted(NUMBERS_THAT_MUST_FIT)
        for mode in ("fused", "eager", "compiled")
    ],
)
def test_a_number_that_does_not_fit_the_dtype_raises_as_on_cpu(name, mode):
    """Eager and fused kernels check the number on the host before the program runs; a
    compiled graph checks its constants when its program is built (it wrapped them)."""
    make = NUMBERS_THAT_MUST_FIT[name]
    try:
        want, error = _results(make("cpu")), None
    except RuntimeError as exc:
        want, error = None, str(exc)
    if mode == "compiled":
        torch._dynamo.reset()
        make = torch.compile(make, backend="pjrt", fullgraph=False)
    with torch_pjrt.mode("eager" if mode == "compiled" else mode):
        if error is not None:
            with pytest.raises(RuntimeError) as got:
                _results(make("pjrt"))
            assert str(got.value) == error
        else:
            assert all(map(torch.equal, _results(make("pjrt")), want))


def _results(out) -> list:
    return [t.cpu() for t in (out if isinstance(out, (list, tuple)) else [out])]
