"""``torch_pjrt.export.to_litert``: models trained on pjrt, converted to ``.tflite`` by
litert-torch and run in LiteRT's own interpreter, against CPU PyTorch.

The CNN, and a BERT encoder and a Llama decoder from small Hugging Face configs, take an
optimizer step on pjrt, are converted with their parameters still there, and the file
gives the trained model's CPU outputs (float32 within 1e-5; dynamic-range int8 within
the bound below, the loss measured in docs/export.md). Importing litert-torch turns on
JAX's global x64 flag; a fresh process checks that the conversion leaves it, pjrt's
results and PyTorch's loggers as they were.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
import torch

import torch_pjrt.export as pjrt_export
from tests.test_export import CASES, _main_output

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

# dynamic-range int8: the largest error relative to the output's largest magnitude
# (measured 0.5-1.5%, docs/export.md)
INT8_RELATIVE = 0.05


class _MainOutput(torch.nn.Module):
    """A Hugging Face model as ``ids -> logits`` (or the last hidden state)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return _main_output(self.model(input_ids=ids))


def _trained_on_pjrt(name):
    """The model of ``name`` after one SGD step on pjrt (left in train mode, as after a
    training loop), and its example input on pjrt."""
    make, inputs, _ = CASES[name]
    torch.manual_seed(0)
    model = make()
    model = (model if name == "cnn" else _MainOutput(model)).to("pjrt").train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model(inputs(4).to("pjrt")).float().square().mean().backward()
    opt.step()
    return model, inputs(2).to("pjrt")


def _cpu_reference(name, model, x):
    """The trained model's output for ``x``: its weights in a CPU copy, in eval mode."""
    cpu = CASES[name][0]()
    cpu = cpu if name == "cnn" else _MainOutput(cpu)
    cpu.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    with torch.no_grad():
        return cpu.eval()(x.cpu())


@pytest.mark.parametrize("name", sorted(CASES))
def test_model_trained_on_pjrt_runs_in_litert(name, tmp_path):
    model, x = _trained_on_pjrt(name)
    expected = _cpu_reference(name, model, x)
    held = {p.device.type for p in model.parameters()}
    path = pjrt_export.to_litert(model, (x,), tmp_path / f"{name}.tflite")
    assert {p.device.type for p in model.parameters()} == held == {"pjrt"}
    assert model.training  # (converted from an eval copy; the model is left as it was)
    assert list(tmp_path.iterdir()) == [path]  # (no staging file left)
    litert = pjrt_export.load_litert(path)
    got = litert(x)
    assert got.device == x.device
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)

    quantized = pjrt_export.to_litert(
        model, (x,), tmp_path / f"{name}-int8.tflite", quantize="dynamic_int8"
    )
    assert quantized.stat().st_size < path.stat().st_size
    error = (pjrt_export.load_litert(quantized)(x.cpu()) - expected).abs().max()
    relative = float(error / expected.abs().max())
    assert 0 < relative < INT8_RELATIVE, relative  # (0: not quantized at all)


_CONTAINED = """
import logging, jax, jax.numpy as jnp, torch, torch_pjrt, torch_pjrt.export as pe

def probe():
    a = torch.arange(6, device="pjrt", dtype=torch.int64) * (2**40)
    b = torch.linspace(0, 1, 7, device="pjrt", dtype=torch.float64).exp()
    return (a.cpu(), b.cpu(), jax.config.jax_enable_x64, str(jnp.arange(3).dtype),
            logging.getLogger("torch._dynamo").level)

before = probe()
pe.to_litert(torch.nn.Linear(3, 2).to("pjrt"), (torch.ones(1, 3, device="pjrt"),), {path!r})
import litert_torch  # (imported by the conversion)
after = probe()
assert all(x is not None for x in after)
assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1]), (before, after)
assert before[2:] == after[2:] == (False, "int32", 0), (before[2:], after[2:])
print("CONTAINED")
"""


def test_importing_litert_torch_changes_nothing_for_pjrt(tmp_path):
    script = _CONTAINED.format(path=str(tmp_path / "linear.tflite"))
    root = pathlib.Path(__file__).parent.parent
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=root
    )
    assert done.returncode == 0 and "CONTAINED" in done.stdout, done.stderr[-3000:]


class _DataDependent(torch.nn.Module):
    def forward(self, x):
        return x[x > 0]


class _Bilinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Bilinear(3, 3, 1)

    def forward(self, x):
        return self.layer(x, x)  # (aten._trilinear: no lowering in litert-torch 0.10.0)


class _Add(torch.nn.Module):
    def forward(self, x, y):
        return x + y


def test_bad_arguments_and_failed_conversions_leave_nothing(tmp_path):
    x = torch.ones(2, 3)
    with pytest.raises(TypeError, match="expected a torch.nn.Module"):
        pjrt_export.to_litert(lambda t: t, (x,), tmp_path / "f.tflite")
    with pytest.raises(ValueError, match="quantize must be None or one of"):
        pjrt_export.to_litert(torch.nn.ReLU(), (x,), tmp_path / "f.tflite", quantize="int4")
    with pytest.raises(IsADirectoryError, match="is a directory"):
        pjrt_export.to_litert(torch.nn.ReLU(), (x,), tmp_path)
    with pytest.raises(
        RuntimeError,
        match=r"aten\.index\.Tensor \(from .*test_export_litert\.py:\d+\) has a size that "
        "depends on the tensor's values",
    ):
        pjrt_export.to_litert(_DataDependent(), (x.to("pjrt"),), tmp_path / "f.tflite")
    with pytest.raises(
        NotImplementedError,
        match=r"aten\._trilinear\.default \(from .*test_export_litert\.py:\d+\) has no LiteRT",
    ):
        pjrt_export.to_litert(_Bilinear(), (x,), tmp_path / "f.tflite")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FileNotFoundError, match="expected a .tflite file"):
        pjrt_export.load_litert(tmp_path / "missing.tflite")
    litert = pjrt_export.load_litert(pjrt_export.to_litert(_Add(), (x, x), tmp_path / "a.tflite"))
    torch.testing.assert_close(litert(x, 2 * x), 3 * x, rtol=0, atol=0)
    with pytest.raises(TypeError, match="takes 2 tensor inputs, got 1"):
        litert(x)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        litert(x, x.to("pjrt"))
