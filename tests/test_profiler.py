"""``torch.profiler`` on pjrt: pjrt's spans (program runs with their ops, compilations
with their cause, host syncs by line, transfers with their bytes) in PyTorch's own trace
and ``key_averages()``, counted as ``torch_pjrt.metrics`` counts them; and JAX's device
trace (``torch_pjrt.profiler.device_trace``) served by xprof."""

from __future__ import annotations

import glob
import gzip
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import torch_pjrt
from torch_pjrt.runtime.launch import free_port

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _spans(prof, tmp_path) -> list[dict]:
    """The pjrt spans of ``prof``'s exported Chrome trace, in order."""
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in events if e.get("name", "").startswith("pjrt::")]
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in spans)
    return sorted(spans, key=lambda e: e["ts"])


def _step(model, opt, x):
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()  # (the step's one host sync)


SYNC_LINE = _step.__code__.co_firstlineno + 5


@pytest.mark.parametrize("mode", ["fused", "eager"])
def test_training_steps_in_the_profilers_trace(mode, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model.to("pjrt")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [torch.randn(8, 16) for _ in range(3)]
    previous = torch_pjrt.get_mode()
    torch_pjrt.set_mode(mode)
    try:
        _step(model, opt, batches[0].to("pjrt"))  # (outside the profile: no spans)
        torch_pjrt.metrics.reset()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for x in batches:
                _step(model, opt, x.to("pjrt"))
        counted = torch_pjrt.metrics.as_dict()
    finally:
        torch_pjrt.set_mode(previous)
    spans = _spans(prof, tmp_path)
    names = [s["name"] for s in spans]

    syncs = [n for n in names if n.startswith("pjrt::host_sync ")]
    assert (
        syncs
        == [f"pjrt::host_sync {__file__}:{SYNC_LINE}"] * 3
        == [f"pjrt::host_sync {line}" for line, n in counted["host_syncs_by_line"].items()] * 3
    )
    uploads = [s for s in spans if s["name"] == "pjrt::to_device"]
    assert [s["args"]["bytes"] for s in uploads] == [8 * 16 * 4] * 3
    assert sum(s["args"]["bytes"] for s in uploads) == counted["bytes_to_device"]
    downloads = [s for s in spans if s["name"] == "pjrt::to_host"]
    assert [s["args"]["bytes"] for s in downloads] == [4] * 3

    runs = [s for s in spans if s["name"].startswith("pjrt::run ")]
    compiles = [s for s in spans if s["name"].startswith("pjrt::compile ")]
    assert len(compiles) == counted["compilations"]
    for c in compiles:  # each compilation inside the run that made it, with its cause
        run = next(r for r in runs if r["name"][11:] == c["name"][15:] and r["ts"] <= c["ts"])
        assert c["ts"] + c["dur"] <= run["ts"] + run["dur"] + 1
        assert c["args"]["cause"]
    if mode == "fused":  # one recording per step, holding the whole step
        assert len(runs) == 3 and len({r["name"] for r in runs}) == 1, names
        assert runs[0]["args"]["scope"] == "fused"
        assert "aten_addmm_default x2" in runs[0]["args"]["ops"], runs[0]["args"]
    else:  # one program per op, the same ones each step
        assert {"pjrt::run aten.addmm.default", "pjrt::run aten.mm.default"} <= set(names)
        steps, current = [], []
        for n in names:
            if n.startswith("pjrt::run "):
                current.append(n)
            elif n.startswith("pjrt::host_sync "):
                steps.append(current)
                current = []
        assert len(steps) == 3 and steps[0] == steps[1] == steps[2] and len(steps[0]) > 8

    averages = {e.key: e for e in prof.key_averages()}
    for name in {r["name"] for r in runs}:
        assert averages[name].count == sum(r["name"] == name for r in runs)
        assert averages[name].cpu_time_total > 0


def test_compiled_graphs_and_no_spans_outside_a_profile(tmp_path):
    model = torch.compile(torch.nn.Linear(8, 8).to("pjrt"), backend="pjrt")
    x = torch.randn(4, 8, device="pjrt")
    model(x)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        y = model(x)
    torch.pjrt.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as idle:
        pass
    model(x)  # (after the profile: nothing recorded)
    runs = [s for s in _spans(prof, tmp_path) if s["name"].startswith("pjrt::run ")]
    assert [r["args"]["scope"] for r in runs] == ["graph"], runs
    assert "aten.addmm.default" in runs[0]["args"]["ops"] or "aten.mm" in runs[0]["args"]["ops"]
    assert _spans(idle, tmp_path) == []
    torch.testing.assert_close(y.cpu(), model(x).cpu())


def _get(url: str):
    with urllib.request.urlopen(url, timeout=30) as reply:
        body = reply.read()
        if reply.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return json.loads(body)


def test_device_trace_opens_in_xprof(tmp_path):
    x = torch.randn(32, 32, device="pjrt")
    with torch_pjrt.profiler.device_trace(tmp_path / "logs"):
        y = (x @ x).relu().sum()
    assert y.item() > 0
    runs = glob.glob(str(tmp_path / "logs" / "plugins" / "profile" / "*"))
    assert len(runs) == 1 and glob.glob(os.path.join(runs[0], "*.xplane.pb")), runs
    (trace,) = glob.glob(os.path.join(runs[0], "*.trace.json.gz"))
    names = {e.get("name") for e in json.load(gzip.open(trace))["traceEvents"]}
    assert "PjitFunction(aten_mm_default)" in names or any(
        n and n.startswith("PjitFunction(fused_") for n in names
    ), sorted(n for n in names if n and "Pjit" in n)

    port = free_port()
    xprof = os.path.join(os.path.dirname(sys.executable), "xprof")
    server = subprocess.Popen(
        [xprof, "--logdir", str(tmp_path / "logs"), "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}/data/plugin/profile"
        for _ in range(120):
            try:
                listed = _get(f"{base}/runs")
                break
            except OSError:
                assert server.poll() is None, server.stderr.read()[-3000:]
                time.sleep(0.5)
        else:
            raise AssertionError("xprof did not answer within 60 s")
        assert listed == [os.path.basename(runs[0])]
        tools = _get(f"{base}/run_tools?run={listed[0]}")
        assert any(t.startswith("trace_viewer") for t in tools), tools
    finally:
        server.kill()
        server.wait(timeout=60)
