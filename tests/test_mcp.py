"""``torch-pjrt mcp``: the server started as an assistant starts it (a subprocess on
stdio), driven by the mcp SDK's own client; each tool's result checked against what the
same function gives in-process or against the file it rewrote."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

ROOT = Path(__file__).resolve().parents[1]

CUDA_SCRIPT = """import torch

model = torch.nn.Linear(4, 4).cuda()
x = torch.randn(2, 4, device="cuda")
print(model(x).sum().item())
"""


CLEAN_SCRIPT = """import torch
import torch_pjrt  # noqa: F401

model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)).to("pjrt")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    model(torch.ones(2, 4, device="pjrt")).sum().backward()
    opt.step()
    opt.zero_grad()
"""


async def _session_calls(calls):
    """Start the server, initialize, list the tools, make ``calls`` ((name, arguments)
    pairs); returns (tool names, [structured results])."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "torch_pjrt.cli", "mcp"], env=env, cwd=str(ROOT)
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            results = []
            for name, arguments in calls:
                result = await session.call_tool(name, arguments)
                assert not result.is_error, result
                results.append(result.structured_content)
    return sorted(t.name for t in tools.tools), results


def test_tools_over_stdio(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(CUDA_SCRIPT)
    clean = tmp_path / "clean.py"
    clean.write_text(CLEAN_SCRIPT)
    traceback = (
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
        "torch_pjrt.runtime.platform.PlatformError: PJRT platform 'tpu' was requested "
        "(PJRT_DEVICE or torch_pjrt.init) but JAX found no such devices. Install its PJRT "
        "plugin"
    )
    calls = [
        ("doctor", {}),
        ("explain", {"text": traceback}),
        ("explain", {"text": "a wholly unrelated message about the weather"}),
        ("migrate", {"path": str(script)}),
        ("migrate", {"path": str(script), "apply": True}),
        ("migrate", {"path": str(tmp_path / "missing.py")}),
        ("metrics", {}),
        ("onboard", {"script": str(clean)}),
        ("report", {"script": str(clean), "out": str(tmp_path / "page.html"), "steps": 3}),
    ]
    names, results = asyncio.run(asyncio.wait_for(_session_calls(calls), 600))
    assert names == ["doctor", "explain", "metrics", "migrate", "onboard", "report"]
    doctor, found, none, report, applied, missing, counters, onboarded, page = results

    assert doctor["ok"] is True and doctor["platform"] == "cpu", doctor
    assert doctor["smoke"]["max_error"] <= doctor["smoke"]["tolerance"]

    from torch_pjrt.diagnostics import glossary

    assert [e["id"] for e in found["entries"]] == [e.id for e in glossary.explain(traceback)]
    assert found["entries"][0]["id"] == "runtime-platform-not-found"
    assert none == {"entries": []}

    assert report["applied"] is False and report["files_to_change"] == 1
    found_at = [(f["kind"], f["line"]) for f in report["findings"]]
    assert found_at == [("cuda-method", 3), ("device-string", 4)], report
    assert applied["files_changed"] == 1
    rewritten = script.read_text()
    assert ".cuda()" not in rewritten and '"cuda"' not in rewritten, rewritten
    assert "error" in missing and "missing.py" in missing["error"]

    assert counters["compilations"] > 0  # (the doctor's smoke test, in the server)

    assert onboarded["ok"] is True and onboarded["steps_run"] == 4, onboarded
    assert onboarded["modules_compared"] == 3  # (two Linear layers and their Sequential)

    # the report's page is written, and its figures come back
    assert page["out"] == str(tmp_path / "page.html") and page["error"] is None, page
    assert page["steps_run"] == 3 and page["metrics"]["compilations"] > 0
    assert page["programs"] and page["programs"][0]["runs"] >= 1
    assert "<svg" in (tmp_path / "page.html").read_text()
