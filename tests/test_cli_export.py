"""``torch-pjrt export``: a script's or module's ``export_example()`` hook, written as a
StableHLO directory or a ``.tflite`` file that run as the model does; the refusals (an op
with no lowering, a data-dependent size or branch, a bad path, no hook) as one message
and an exit status, with nothing written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import torch_pjrt.export as pjrt_export
from torch_pjrt import cli

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

SCRIPT = textwrap.dedent(
    """
    import torch
    from torch.export import Dim


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(x).relu()


    def export_example():
        torch.manual_seed(0)
        model = Net().to("pjrt")
        return model, (torch.randn(2, 4, device="pjrt"),), {"x": {0: Dim("batch")}}


    class Masked(torch.nn.Module):
        def forward(self, x):
            return x[x > 0]


    def masked():
        return Masked(), (torch.randn(2, 4),)


    class Branching(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x


    def branching():
        return Branching(), (torch.randn(2, 4),)


    class Unlowered(torch.nn.Module):
        def forward(self, x):
            return torch.hash_tensor(x)


    def unlowered():
        return Unlowered(), (torch.randn(2, 4, device="pjrt"),)


    def not_a_pair():
        return Net()
    """
)


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(SCRIPT)
    return path


def _reference(script, x):
    namespace: dict = {}
    exec(compile(script.read_text(), str(script), "exec"), namespace)
    model, _, _ = namespace["export_example"]()
    with torch.no_grad():
        return model.cpu()(x)


def test_stablehlo_and_litert_from_a_script(script, tmp_path, capsys):
    out = tmp_path / "program"
    assert cli.main(["export", str(script), "--out", str(out), "--platforms", "cpu,tpu"]) == 0
    assert f"wrote {out} (stablehlo)" in capsys.readouterr().out
    loaded = pjrt_export.load(out)
    assert loaded.meta["platforms"] == ["cpu", "tpu"]
    x = torch.randn(5, 4)  # (another batch size: the hook's Dim)
    torch.testing.assert_close(loaded(x), _reference(script, x), rtol=1e-6, atol=1e-6)

    tflite = tmp_path / "net.tflite"
    assert cli.main(["export", str(script), "--format", "litert", "--out", str(tflite)]) == 0
    assert "takes the example's shapes" in capsys.readouterr().err
    x = torch.randn(2, 4)
    got = pjrt_export.load_litert(tflite)(x)
    torch.testing.assert_close(got, _reference(script, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "hook, fmt, message",
    [
        ("masked", "stablehlo", r"aten\.index\.Tensor \(from .*model\.py:\d+\) has a size"),
        ("masked", "litert", r"aten\.index\.Tensor \(from .*model\.py:\d+\) has a size"),
        ("branching", "stablehlo", r"branches on a tensor's value \(at .*model\.py:\d+;"),
        ("unlowered", "stablehlo", r"aten\.hash_tensor\.default \(from .*model\.py:\d+\)"),
    ],
)
def test_refusals_name_the_line_and_write_nothing(script, tmp_path, capsys, hook, fmt, message):
    out = tmp_path / "out" / ("m.tflite" if fmt == "litert" else "program")
    argv = ["export", f"{script}:{hook}", "--format", fmt, "--out", str(out)]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # (PyTorch may log the graph before it)
    assert last.startswith("torch-pjrt export: ") and "Traceback" not in err, err
    assert re.search(message, last), err
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_usage_errors(script, tmp_path, capsys):
    out = str(tmp_path / "o")
    cases = [
        (["export", str(tmp_path / "missing.py"), "--out", out], 2, "no such script"),
        (["export", "no_such_module_xyz", "--out", out], 2, "no such script or module"),
        (["export", f"{script}:nothing", "--out", out], 2, "defines no nothing()"),
        (["export", f"{script}:not_a_pair", "--out", out], 2, "hook returned Net"),
        (["export", str(script), "--quantize", "dynamic_int8", "--out", out], 2, "--format litert"),
        (["export", str(script), "--format", "onnx", "--out", out], 2, ""),
        (["export", str(script), "--out", str(script)], 1, "exists and is not a directory"),
        (["export", str(script), "--out", str(script / "x")], 1, "NotADirectoryError"),
    ]
    for argv, status, message in cases:
        assert cli.main(argv) == status, argv
        assert message in capsys.readouterr().err, argv
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.py"]


def test_the_installed_command_with_a_module_name(script, tmp_path):
    """``python -m torch_pjrt.cli export pkg.module`` in a fresh process, int8 LiteRT."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    out = tmp_path / "net-int8.tflite"
    done = subprocess.run(
        [sys.executable, "-m", "torch_pjrt.cli", "export", "model", "--format", "litert",
         "--quantize", "dynamic_int8", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    x = torch.randn(2, 4)
    expected = _reference(script, x)
    error = (pjrt_export.load_litert(out)(x) - expected).abs().max()
    assert 0 < error < 0.05 * expected.abs().max()
