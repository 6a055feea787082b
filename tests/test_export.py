"""``torch.export`` of models on pjrt, and ``torch_pjrt.export``'s StableHLO artifacts.

A CNN, and a Llama and a BERT built from small Hugging Face configs, with parameters and
inputs on pjrt, are exported with a dynamic batch dimension (``torch.export.Dim``); the
exported program's module, run on pjrt at the export's batch size and at another one,
gives the CPU model's outputs. The same programs saved by ``torch_pjrt.export.save``
and loaded back run on pjrt and on CPU tensors, and in a process where torch cannot be
imported (jax and numpy only), with the CPU model's outputs.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.export import Dim, export
from torch.nn.attention import SDPBackend

import torch_pjrt.export as pjrt_export
from tests import hf_families

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.norm(self.conv(x))), 2)
        return self.fc(x.flatten(1))


def _family(name: str):
    """A model of tests/hf_families.py (small configs), returning no KV cache (a cache
    object is not a tensor output ``torch.export`` can give)."""

    def build():
        model = hf_families.FAMILIES[name].build()
        model.config.use_cache = False
        return model

    return build


def _main_output(out):
    for name in ("logits", "last_hidden_state"):
        if hasattr(out, name):
            return getattr(out, name)
    return out


CASES = {
    "cnn": (CNN, lambda batch: torch.randn(batch, 3, 8, 8), "x"),
    "llama": (_family("llama"), lambda batch: torch.randint(3, 100, (batch, 8)), "input_ids"),
    "bert": (_family("bert"), lambda batch: torch.randint(3, 100, (batch, 8)), "input_ids"),
}


def _exported(name, batch=2):
    """The CPU model, and ``torch.export`` of its copy on pjrt (dynamic batch)."""
    make, inputs, arg = CASES[name]
    torch.manual_seed(0)
    model = make().eval()
    on_pjrt = make().eval()
    on_pjrt.load_state_dict(model.state_dict())
    on_pjrt.to("pjrt")
    dynamic = {arg: {0: Dim("batch", max=16)}}
    return model, export(on_pjrt, (inputs(batch).to("pjrt"),), dynamic_shapes=dynamic)


@pytest.mark.parametrize("name", sorted(CASES))
def test_export_on_pjrt_with_a_dynamic_batch(name):
    model, exported = _exported(name)
    held = {t.device.type for t in exported.state_dict.values()}
    assert held == {"pjrt"}, held  # (no move to the CPU)
    for batch in (2, 5):
        x = CASES[name][1](batch)
        with torch.no_grad():
            expected = _main_output(model(x))
            got = _main_output(exported.module()(x.to("pjrt")))
        assert got.device.type == "pjrt"
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_saved_program_runs_on_pjrt_and_cpu_tensors(name, tmp_path):
    model, exported = _exported(name)
    saved = pjrt_export.save(exported, tmp_path / "program")
    # (the export turned SDPA's overrideable backend off for its decomposition only)
    q = torch.randn(1, 2, 4, 8, device="pjrt")
    assert torch._fused_sdp_choice(q, q, q) == SDPBackend.OVERRIDEABLE.value
    assert sorted(p.name for p in saved.iterdir()) == [
        "meta.json",
        "program.jaxexport",
        "weights.npz",
    ]
    loaded = pjrt_export.load(saved)
    assert loaded.meta["inputs"][0]["shape"][0].startswith("s")  # (symbolic: the batch)
    make_inputs = CASES[name][1]
    for batch in (2, 5):
        x = make_inputs(batch)
        with torch.no_grad():
            expected = _main_output(model(x))
        for device in ("cpu", "pjrt"):
            got = loaded(x.to(device))
            got = got[0] if isinstance(got, tuple) else got
            assert got.device.type == device
            torch.testing.assert_close(got.cpu(), expected, rtol=1e-6, atol=1e-6)
    assert "stablehlo" in loaded.stablehlo() and "@main" in loaded.stablehlo()


def test_saved_program_runs_without_torch(tmp_path):
    """The runner lines of docs/export.md, in a process where importing torch fails, on
    a program saved for three platforms (run here on the CPU)."""
    model, exported = _exported("llama")
    saved = pjrt_export.save(exported, tmp_path / "llama", platforms=("cpu", "cuda", "tpu"))
    assert pjrt_export.load(saved).meta["platforms"] == ["cpu", "cuda", "tpu"]
    x = CASES["llama"][1](3)
    np.savez(tmp_path / "inputs.npz", x0=x.numpy())
    script = pathlib.Path(__file__).parent / "export_scripts" / "run_without_torch.py"
    cmd = [sys.executable, str(script), str(saved), str(tmp_path / "inputs.npz")]
    done = subprocess.run(
        [*cmd, str(tmp_path / "outputs.npz")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "JAX ONLY OK True" in done.stdout, done.stderr[-3000:]
    with torch.no_grad():
        expected = model(x).logits.numpy()
    with np.load(tmp_path / "outputs.npz") as out:
        np.testing.assert_allclose(out["y0"], expected, rtol=1e-6, atol=1e-6)


def test_bad_arguments_are_refused_and_leave_nothing(tmp_path):
    with pytest.raises(TypeError, match="expected the ExportedProgram"):
        pjrt_export.save(CNN(), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(FileNotFoundError, match="written by torch_pjrt.export.save"):
        pjrt_export.load(tmp_path)
    _, exported = _exported("cnn")
    loaded = pjrt_export.load(pjrt_export.save(exported, tmp_path / "cnn"))
    with pytest.raises(TypeError, match="takes 1 tensor inputs, got 2"):
        loaded(torch.zeros(2, 3, 8, 8), torch.zeros(2, 3, 8, 8))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnn"]  # (no staging left)


class _Unlowered(torch.nn.Module):
    def forward(self, x):
        return torch.hash_tensor(x * 2)  # (no pjrt lowering: tests/expectations.py)


def test_an_op_without_a_lowering_is_named_with_its_line(tmp_path):
    exported = export(_Unlowered(), (torch.ones(4, device="pjrt"),))
    with pytest.raises(
        NotImplementedError, match=r"aten\.hash_tensor\.default \(from .*test_export\.py:\d+\)"
    ):
        pjrt_export.save(exported, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


class _DataDependent(torch.nn.Module):
    def forward(self, x):
        return x[x > 0] * 2


def test_a_data_dependent_size_is_named_with_its_line(tmp_path):
    exported = export(_DataDependent(), (torch.ones(2, 3, device="pjrt"),))
    with pytest.raises(
        RuntimeError,
        match=r"aten\.index\.Tensor \(from .*test_export\.py:\d+\) has a size that depends",
    ):
        pjrt_export.save(exported, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
