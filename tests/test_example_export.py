"""examples/export: training on pjrt, then the StableHLO directory served by a process
with only jax and numpy (serve_jax.py, over HTTP) and the LiteRT files, against CPU
PyTorch with the trained weights; and ``torch-pjrt export`` on the example's hook."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch

import torch_pjrt.export as pjrt_export
from torch_pjrt import cli

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "export"

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


def _trained_cpu_model(out: Path):
    sys.path.insert(0, str(EXAMPLE))
    try:
        from model import QuadrantNet, batch
    finally:
        sys.path.remove(str(EXAMPLE))
    model = QuadrantNet()
    model.load_state_dict(torch.load(out / "classifier.pt", map_location="cpu"))
    return model.eval(), batch


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())


def test_train_export_serve(tmp_path, monkeypatch):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(EXAMPLE / "train_and_export.py"), "--steps", "60", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    found = dict(re.findall(r"^(.+?)\s+accuracy (\S+)", done.stdout, re.M))
    assert len(found) == 4 and all(float(a) > 0.9 for a in found.values()), done.stdout
    model, batch = _trained_cpu_model(out)
    images, _ = batch(3, torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = model(images)

    for name, tolerance in (("classifier.tflite", 1e-5), ("classifier-int8.tflite", 0.1)):
        got = pjrt_export.load_litert(out / name)(images[:2])
        torch.testing.assert_close(got, expected[:2], rtol=0, atol=tolerance)

    server = subprocess.Popen(
        [sys.executable, str(EXAMPLE / "serve_jax.py"), str(out / "classifier"), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )  # fmt: skip
    try:
        line = server.stdout.readline()
        assert line.startswith("serving on http://"), (line, server.stderr.read()[-3000:])
        url = line.split()[-1] + "/predict"
        reply = _post(url, {"inputs": [images.tolist()]})
        torch.testing.assert_close(
            torch.tensor(reply["outputs"][0]), expected, rtol=1e-6, atol=1e-5
        )
        with pytest.raises(urllib.error.HTTPError, match="400"):
            _post(url, {"inputs": [[1.0, 2.0]]})  # (a shape the program does not take)
    finally:
        server.kill()
        server.wait(timeout=60)

    monkeypatch.setenv("QUADRANT_WEIGHTS", str(out / "classifier.pt"))
    hook = f"{EXAMPLE / 'model.py'}"
    assert cli.main(["export", hook, "--out", str(tmp_path / "by_cli")]) == 0
    got = pjrt_export.load(tmp_path / "by_cli")(images)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-5)
