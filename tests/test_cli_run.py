"""``torch-pjrt run``: unmodified CUDA-style scripts on pjrt, with ``--cuda-compat``.

Each script under ``tests/cuda_scripts`` is run twice as a subprocess: through
``torch-pjrt run --cuda-compat`` (on pjrt) and plainly with this CPU build of PyTorch
(``torch.cuda.is_available()`` is False, so the script picks the CPU). The results must
agree, and the receipt must list the CUDA calls the script made.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torch_pjrt import cli

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "cuda_scripts"


def _env(**overrides: str) -> dict:
    env = os.environ.copy()
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("PJRT_DEVICE", None)
    env.pop("TORCH_PJRT_PLATFORM", None)
    env["PYTHONWARNINGS"] = "ignore"
    env.update(overrides)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _compat(script: str, tmp_path: Path, *extra: str, **env: str):
    receipt = tmp_path / "receipt.json"
    proc = _run(
        "-m", "torch_pjrt.cli", "run", "--cuda-compat", "--receipt", str(receipt),
        *extra, str(SCRIPTS / script), **env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = {r["call"]: r for r in json.loads(receipt.read_text())["calls"]}
    return proc, calls


def _value(out: str, key: str) -> str:
    m = re.search(rf"^{re.escape(key)} (.*)$", out, re.M)
    assert m, f"no '{key}' line in:\n{out}"
    return m.group(1)


def _expect(calls: dict, expected: dict) -> None:
    for call, (count, mapping) in expected.items():
        assert call in calls, f"{call} missing from the receipt: {sorted(calls)}"
        assert (calls[call]["count"], calls[call]["mapping"]) == (count, mapping), calls[call]


def test_mlp_training_matches_cpu(tmp_path):
    proc, calls = _compat("mlp_train.py", tmp_path)
    plain = _run(str(SCRIPTS / "mlp_train.py"))
    assert plain.returncode == 0, plain.stderr
    assert _value(proc.stdout, "device") == "pjrt:0"
    assert _value(plain.stdout, "device") == "cpu"
    assert abs(float(_value(proc.stdout, "loss")) - float(_value(plain.stdout, "loss"))) <= 1e-4
    _expect(
        calls,
        {
            "torch.cuda.is_available": (2, "exact"),
            "torch.cuda.manual_seed": (1, "exact"),
            "torch.cuda.synchronize": (1, "exact"),
            "Module.cuda": (1, "exact"),
            "Tensor.cuda": (1, "exact"),
            '"cuda" device string': (1, "exact"),
            "torch.backends.cudnn.benchmark": (1, "approximate"),
        },
    )
    assert len(calls) == 7  # nothing else: torch's own calls are mapped, not counted
    # the table on stderr
    assert "CUDA calls mapped at run time" in proc.stderr
    assert re.search(
        r"torch\.cuda\.synchronize\s+1\s+torch\.pjrt\.synchronize\s+exact", proc.stderr
    )


@pytest.mark.slow  # two runs of a 5-step AMP loop: about 18 s on 2 busy cores
def test_amp_matches_cpu_autocast(tmp_path):
    proc, calls = _compat("amp_train.py", tmp_path)
    plain = _run(str(SCRIPTS / "amp_train.py"))
    assert plain.returncode == 0, plain.stderr
    assert _value(proc.stdout, "device") == "pjrt:0"
    assert _value(proc.stdout, "autocast dtype") == "torch.bfloat16"
    assert _value(proc.stdout, "scale") == "65536.0 True"  # both scalers enabled, on pjrt
    assert _value(plain.stdout, "device") == "cpu"
    # same bfloat16 autocast on both sides (the CPU run uses CPU autocast); the scaler
    # scales and unscales by a power of two, so the loss agrees to a few bf16 roundings
    assert abs(float(_value(proc.stdout, "loss")) - float(_value(plain.stdout, "loss"))) <= 2e-2
    _expect(
        calls,
        {
            'torch.autocast("cuda")': (5, "exact"),
            "torch.cuda.amp.autocast": (1, "exact"),
            'torch.amp.GradScaler("cuda")': (1, "exact"),
            "torch.cuda.amp.GradScaler": (1, "exact"),
            'torch.device("cuda")': (1, "exact"),
        },
    )


def test_events_memory_streams(tmp_path):
    proc, calls = _compat("events_memory.py", tmp_path)
    out = proc.stdout
    assert _value(out, "device") == "pjrt:0 pjrt:0"
    for key in ("is_cuda", "elapsed_ms_positive", "allocated_grew", "peak", "stats", "value"):
        assert _value(out, key) == "True", out
    _expect(
        calls,
        {
            "torch.cuda.Event": (2, "approximate"),
            "torch.cuda.Stream": (1, "approximate"),
            "torch.cuda.stream": (1, "approximate"),
            "torch.cuda.memory_allocated": (2, "approximate"),
            "torch.cuda.memory_stats": (1, "approximate"),
            '"cuda:N" device string': (1, "exact"),
            'torch.device("cuda")': (1, "exact"),
            "torch.cuda.device_count": (1, "exact"),
            "Tensor.is_cuda": (1, "approximate"),
        },
    )


def test_cuda_graphs_training_matches_cpu(tmp_path):
    """torch.cuda.CUDAGraph and torch.cuda.graph become torch.pjrt's: the replayed steps
    train as the plain loop does on the CPU."""
    proc, calls = _compat("graph_train.py", tmp_path)
    plain = _run(str(SCRIPTS / "graph_train.py"))
    assert plain.returncode == 0, plain.stderr
    assert _value(proc.stdout, "device") == "pjrt:0"
    assert _value(proc.stdout, "losses") == _value(plain.stdout, "losses") == "8"
    assert abs(float(_value(proc.stdout, "loss")) - float(_value(plain.stdout, "loss"))) <= 1e-4
    _expect(
        calls,
        {
            "torch.cuda.CUDAGraph": (1, "exact"),
            "torch.cuda.graph": (1, "exact"),
            "torch.cuda.Stream": (1, "approximate"),
        },
    )


def test_nccl_backend_and_cudnn_flags(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc, calls = _compat("nccl_cudnn.py", tmp_path, TEST_PORT=str(port))
    assert _value(proc.stdout, "backend") == "pjrt"
    assert _value(proc.stdout, "device") == "pjrt:0"
    assert _value(proc.stdout, "sum") == "6.0"
    _expect(
        calls,
        {
            'init_process_group("nccl")': (1, "exact"),
            "torch.backends.cudnn.deterministic": (1, "unsupported"),
            "torch.backends.cudnn.enabled": (1, "approximate"),
        },
    )


def test_without_cuda_compat_runs_on_cpu():
    # honest: without the mapping, a CUDA-style script finds no CUDA and uses the CPU.
    # (A subprocess: the script sets cudnn flags, which PyTorch's own test utilities,
    # imported by other tests in this process, forbid.)
    proc = _run("-m", "torch_pjrt.cli", "run", str(SCRIPTS / "mlp_train.py"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _value(proc.stdout, "device") == "cpu"
    assert "CUDA calls mapped" not in proc.stderr


def test_receipt_printed_when_the_script_fails(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("import torch\ntorch.cuda.synchronize()\nraise ValueError('boom')\n")
    proc = _run("-m", "torch_pjrt.cli", "run", "--cuda-compat", str(script))
    assert proc.returncode == 1
    assert "ValueError: boom" in proc.stderr
    assert re.search(r"torch\.cuda\.synchronize\s+1", proc.stderr)


def test_argv_exit_status_and_missing_script(tmp_path, capsys):
    script = tmp_path / "argv.py"
    script.write_text("import sys\nprint(sys.argv[1:])\nraise SystemExit(int(sys.argv[-1]))\n")
    assert cli.main(["run", str(script), "--lr", "0.1", "3"]) == 3
    assert capsys.readouterr().out.strip() == "['--lr', '0.1', '3']"
    assert cli.main(["run", "--", str(script), "--", "0"]) == 0
    assert capsys.readouterr().out.strip() == "['--', '0']"
    assert cli.main(["run", str(tmp_path / "missing.py")]) == 2
    assert "no such script" in capsys.readouterr().err
    assert cli.main(["run", "--mode", "nope", str(script)]) == 2
    # this process already runs on its platform: asking for another one is an error
    assert cli.main(["run", "--platform", "tpu", str(script), "0"]) == 1
    assert "torch-pjrt run:" in capsys.readouterr().err


def test_install_and_uninstall_in_process():
    from torch_pjrt.migrate import cuda_compat

    original = (torch.cuda.is_available, torch.autocast, torch.nn.Module.to)
    cuda_compat.install(report_at_exit=False)
    try:
        assert torch.cuda.is_available() is True
        assert torch.zeros(2, device="cuda").device.type == "pjrt"
        assert torch.device("cuda:0") == torch.device("pjrt:0")
        try:  # not mapped: counted as unsupported, called as it is
            torch.cuda.get_arch_list()
        except Exception:  # noqa: BLE001  (whatever the CPU build does with it)
            pass
        row = {r["call"]: r for r in cuda_compat.receipt().rows()}["torch.cuda.get_arch_list"]
        assert row["mapping"] == "unsupported"
    finally:
        cuda_compat.uninstall()
    assert (torch.cuda.is_available, torch.autocast, torch.nn.Module.to) == original
    assert torch.cuda.is_available() is False
    assert torch.device("cuda").type == "cuda"
