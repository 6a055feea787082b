"""The ``torch-pjrt`` command: ``doctor`` in-process and as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torch_pjrt
from torch_pjrt import cli
from torch_pjrt.diagnostics import doctor

ROOT = Path(__file__).resolve().parents[1]


def test_doctor_text(capsys):
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    for word in (
        "torch_pjrt doctor",
        "torch",
        "jax",
        "jaxlib",
        "platform",
        "pjrt:0",
        "smoke",
        "device guard  C++",
    ):
        assert word in out
    assert out.rstrip().endswith("result        OK")


def test_doctor_json(capsys):
    assert cli.main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True
    assert report["error"] is None
    assert set(report["versions"]) == {"python", "torch", "jax", "jaxlib", "torch_pjrt"}
    assert report["versions"]["torch_pjrt"] == torch_pjrt.__version__
    assert report["versions"]["torch"] == torch.__version__
    assert isinstance(report["plugins"], dict)
    assert report["platform"] == torch_pjrt.current_platform()
    assert report["device_count"] == torch.pjrt.device_count() >= 1
    assert [d["index"] for d in report["devices"]] == list(range(report["device_count"]))
    for d in report["devices"]:
        assert d["platform"] == report["platform"]
        assert d["name"] == torch.pjrt.get_device_name(d["index"])
        assert d["total_memory"] > 0
        assert d["memory_allocated"] >= 0
    smoke = report["smoke"]
    assert smoke["ok"] is True
    assert 0 <= smoke["max_error"] <= smoke["tolerance"] == 1e-5
    assert isinstance(smoke["fallbacks"], dict)


def test_doctor_other_platform_in_process(capsys):
    # the platform is already chosen in this process: asking for another one fails
    other = "tpu" if torch_pjrt.current_platform() != "tpu" else "cpu"
    assert cli.main(["doctor", "--json", "--platform", other]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert "already running" in report["error"]
    assert report["smoke"] is None


def test_usage():
    assert cli.main([]) == 2
    assert cli.main(["doctor", "--no-such-option"]) == 2
    assert cli.main(["doctor", "--help"]) == 0


def test_hints(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    hints = doctor._hints("TPU", {"libtpu": "0.0.1"})
    assert any("JAX_PLATFORMS=cpu" in h for h in hints)
    assert any("libtpu is installed" in h for h in hints)
    monkeypatch.delenv("JAX_PLATFORMS")
    assert doctor._hints("cuda", {}) == []
    assert doctor._hints(None, {}) == []


def _run_cli(*args: str, **env_overrides: str) -> subprocess.CompletedProcess:
    env = os.environ.copy()
    env["JAX_PLATFORMS"] = "cpu"  # no accelerator plugin is reachable, even if installed
    env.pop("PJRT_DEVICE", None)
    env.pop("TORCH_PJRT_PLATFORM", None)
    env.update(env_overrides)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "torch_pjrt.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_doctor_missing_platform_subprocess():
    proc = _run_cli("doctor", "--platform", "tpu")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "libtpu" in proc.stdout
    assert "result        FAILED" in proc.stdout


@pytest.mark.parametrize("value, package", [("CUDA", "jax-cuda12-plugin"), ("ROCM", "jax-rocm")])
def test_doctor_missing_platform_from_env_subprocess(value, package):
    proc = _run_cli("doctor", "--json", PJRT_DEVICE=value)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is False
    assert report["requested_platform"] == value
    assert package in report["error"]
    assert any("JAX_PLATFORMS" in h for h in report["hints"])
