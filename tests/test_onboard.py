"""``torch-pjrt onboard``: a clean training script passes (exit 0); scripts with a planted
numerical divergence, a recompiling shape, an ``.item()`` in the loop and an op without
a lowering each get that finding, named with the script's line, and exit 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torch_pjrt import cli
from torch_pjrt.diagnostics import onboard

ROOT = Path(__file__).resolve().parents[1]

CLEAN = textwrap.dedent(
    """
    import torch
    import torch_pjrt  # noqa: F401


    class Off(torch.nn.Module):
        def forward(self, x):
            return x  # OFF


    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), Off(), torch.nn.ReLU(), torch.nn.Linear(16, 2)
    ).to("pjrt")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    total = torch.zeros((), device="pjrt")
    for step in range(6):
        x = torch.randn(4, 8).to("pjrt")  # BATCH
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        total += loss.detach()  # EXTRA
    print("mean loss", total.item() / 6)
    """
)

# each plant: (marker, the line that replaces the marked one)
PLANTS = {
    # pjrt's output 1% off the CPU's, in one module
    "divergence": ("return x  # OFF", 'return x * 1.01 if x.device.type == "pjrt" else x'),
    # a batch that grows every step
    "shape": ("x = torch.randn(4, 8)", 'x = torch.randn(4 + step, 8).to("pjrt")'),
    # a host read every step
    "item": ("total += loss.detach()  # EXTRA", 'print("loss", loss.item())'),
    # an op with no pjrt lowering, every step
    "fallback": ("total += loss.detach()  # EXTRA", "torch.hash_tensor(x)"),
}


def _script(tmp_path, plant: str) -> Path:
    text = CLEAN
    if plant != "none":
        marker, line = PLANTS[plant]
        lines = text.splitlines()
        i = next(i for i, ln in enumerate(lines) if marker in ln)
        lines[i] = lines[i][: len(lines[i]) - len(lines[i].lstrip())] + line
        text = "\n".join(lines) + "\n"
    path = tmp_path / f"train_{plant}.py"
    path.write_text(text)
    return path


def _line(path: Path, text: str) -> str:
    number = next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if text in ln)
    return f"{path}:{number}"


def test_a_clean_script_passes(tmp_path, capsys):
    path = _script(tmp_path, "none")
    assert cli.main(["onboard", str(path)]) == 0
    out = capsys.readouterr().out
    assert "nothing found" in out and "4 optimizer step(s) run" in out, out


@pytest.mark.parametrize(
    "plant, kind, where, says, lint",
    [
        ("divergence", "divergence", "loss = model(x)", "module 1 (Off)", None),
        # (the step's program runs at the optimizer step, where fused mode ends it)
        ("shape", "recompilation", "opt.step()", "compiled again", "per-step value"),
        ("item", "host-sync", "loss.item()", "waits for the device", ".item() in a training"),
        # (a CPU fallback reads its input from the device: a host sync there too)
        ("fallback", "fallback", "torch.hash_tensor(x)", "aten.hash_tensor", None),
    ],
)
def test_each_planted_problem_is_found(tmp_path, plant, kind, where, says, lint):
    path = _script(tmp_path, plant)
    report = onboard.onboard(str(path), [])
    kinds = [f["kind"] for f in report["findings"]]
    if lint is not None:  # (the static read sees it too: migrate's lint, first)
        assert kinds[0] == "migrate" and lint in report["findings"][0]["what"], report
        kinds = kinds[1:]
    expected = {"host-sync", "fallback"} if plant == "fallback" else {kind}
    assert report["ok"] is False and set(kinds) == expected, report
    found = next(f for f in report["findings"] if f["kind"] == kind)
    assert says in found["what"], found
    lines = {f["where"] for f in report["findings"] if f["kind"] != "migrate"} - {None}
    assert lines == {_line(path, where)}, (report["findings"], _line(path, where))
    assert any(fix.startswith(found["fix"]) for fix in report["fixes"])


def test_the_command_with_json(tmp_path):
    path = _script(tmp_path, "item")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "torch_pjrt.cli", "onboard", "--json", str(path)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads(done.stdout)  # (the script's prints went to stderr)
    assert [f["kind"] for f in report["findings"]] == ["migrate", "host-sync"]
    assert "loss" in done.stderr
    assert cli.main(["onboard", str(tmp_path / "missing.py")]) == 2
