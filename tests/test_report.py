"""``torch-pjrt report``: a training script with a recompiling batch, an ``.item()`` in
the loop and an op without a lowering is run and written up; the figures are checked
against ``metrics.as_dict()`` and the script's lines, and the page is rendered in
headless Chromium (the plots drawn, the numbers on the page those of ``as_dict()``); the
screenshot is kept in ``artifacts/report.png`` (``$TORCH_PJRT_ARTIFACTS`` elsewhere)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from html.parser import HTMLParser
from pathlib import Path

import numpy
import pytest
import torch

from torch_pjrt import cli
from torch_pjrt.diagnostics import metrics, report
from torch_pjrt.runtime import events

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("TORCH_PJRT_ARTIFACTS", ROOT / "artifacts"))

SCRIPT = textwrap.dedent(
    """
    import torch
    import torch_pjrt  # noqa: F401

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)
    ).to("pjrt")
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    for step in range(8):
        x = torch.randn(4 if step < 5 else 6, 8).to("pjrt")  # BATCH
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print("loss", loss.item())  # ITEM
        torch.hash_tensor(x)  # FALLBACK
    """
)

PARAMETER_BYTES = (8 * 32 + 32 + 32 * 2 + 2) * 4


def _line(path: Path, marker: str) -> str:
    number = next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if marker in ln)
    return f"{path}:{number}"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """(script, page, result, metrics.as_dict() after the run)."""
    folder = tmp_path_factory.mktemp("report")
    script = folder / "train.py"
    script.write_text(SCRIPT)
    page = folder / "report.html"
    metrics.reset()
    result = report(script, out=page)
    return script, page, result, metrics.as_dict()


def test_figures_are_the_counters_and_the_lines(written):
    script, page, result, counted = written
    assert result["error"] is None and result["steps_run"] == 8
    shown = result["metrics"]
    for key in ("compilations", "host_syncs", "transfers_to_device", "transfers_to_host"):
        assert shown[key] == counted[key] > 0, key
    for key in ("bytes_to_device", "bytes_to_host", "host_syncs_by_line", "fallbacks"):
        assert shown[key] == counted[key], key
    item, batch, fallback = (_line(script, m) for m in ("# ITEM", "# BATCH", "# FALLBACK"))
    assert shown["host_syncs_by_line"][item] == 8
    assert counted["fallbacks"] == {"aten.hash_tensor.out": 8}

    # each step's row, and the compilations on the same clock
    steps = result["steps"]
    assert [s["step"] for s in steps] == list(range(1, 9))
    assert all(s["seconds"] > 0 for s in steps)
    assert sum(s["host_syncs"] for s in steps) <= counted["host_syncs"]
    compiles = result["compilations"]
    assert len(compiles) == counted["compilations"]
    assert sum(c["seconds"] for c in compiles) == pytest.approx(
        events.compile_seconds(counted), abs=1e-4
    )
    assert all(0 <= c["at"] <= result["seconds"] for c in compiles)
    grown = [c for c in compiles if "changed from" in c["cause"] and c["step"] >= 6]
    assert grown, compiles  # the batch of 6 from step 6 on

    # the costliest programs: timed, with XLA's memory analysis; one holds the model
    programs = result["programs"]
    assert 1 <= len(programs) <= 10
    totals = [p["total_ms"] or 0.0 for p in programs]
    assert totals == sorted(totals, reverse=True) and totals[0] > 0
    assert all(p["runs"] >= 1 and "error" not in p for p in programs), programs
    assert max(p["arguments"] for p in programs) >= PARAMETER_BYTES
    assert any((p["flops"] or 0) > 0 for p in programs)

    # what strict mode would stop on, at the script's lines
    where = {(f["kind"], f["where"]) for f in result["findings"]}
    assert ("host-sync", item) in where and ("fallback", fallback) in where, where
    assert any(kind == "recompilation" for kind, _ in where), where
    assert len(result["memory"]) == 8 + 2  # the start, each step, the end
    assert max(max(m["bytes"].values()) for m in result["memory"]) >= PARAMETER_BYTES


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.metrics: dict[str, str] = {}
        self.svgs = 0
        self.paths = 0
        self.sections: list[str] = []
        self.data = None
        self._in_data = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "data-metric" in attrs and "data-value" in attrs:
            self.metrics[attrs["data-metric"]] = attrs["data-value"]
        self.svgs += tag == "svg"
        self.paths += tag == "path"
        if tag == "h2":
            self.sections.append(attrs.get("id"))
        self._in_data = tag == "script" and attrs.get("id") == "metrics"

    def handle_data(self, data):
        if self._in_data:
            self.data = json.loads(data)
            self._in_data = False


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("no Chromium: `make test` installs it (apt-get install chromium)")


def _chromium_run(*args) -> subprocess.CompletedProcess:
    command = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=180)


def test_the_page_renders_in_chromium(written):
    _, page, result, counted = written
    done = _chromium_run("--dump-dom", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    rendered = _Page()
    rendered.feed(done.stdout)

    expected = {
        "steps_run": 8,
        "compilations": counted["compilations"],
        "host_syncs": counted["host_syncs"],
        "transfers_to_device": counted["transfers_to_device"],
        "bytes_to_device": counted["bytes_to_device"],
        "transfers_to_host": counted["transfers_to_host"],
        "bytes_to_host": counted["bytes_to_host"],
        "fallbacks": sum(counted["fallbacks"].values()),
    }
    assert {k: int(v) for k, v in rendered.metrics.items() if k != "compile_seconds"} == expected
    compile_seconds = events.compile_seconds(counted)
    assert float(rendered.metrics["compile_seconds"]) == pytest.approx(compile_seconds, abs=2e-3)
    assert rendered.sections == [
        "steps", "syncs", "fallbacks", "bytes", "memory", "programs", "strict",
    ]  # fmt: skip
    # the plots: steps, host syncs, fallbacks, bytes, memory, memory per program, programs
    assert rendered.svgs == 7 and rendered.paths > 100, (rendered.svgs, rendered.paths)
    assert rendered.data["metrics"]["host_syncs_by_line"] == counted["host_syncs_by_line"]

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "report.png"
    done = _chromium_run(
        "--hide-scrollbars", "--window-size=1200,5000", f"--screenshot={shot}", page.as_uri()
    )
    assert done.returncode == 0 and shot.stat().st_size > 50_000, done.stderr[-2000:]
    from PIL import Image

    image = numpy.asarray(Image.open(shot).convert("RGB"))
    pixels = torch.from_numpy(image.reshape(-1, 3).astype("int32"))

    def share(color: str) -> float:  # of the screenshot's pixels within 8 of the colour
        rgb = torch.tensor([int(color[i : i + 2], 16) for i in (1, 3, 5)], dtype=torch.int32)
        return float(((pixels - rgb).abs().max(dim=1).values <= 8).float().mean())

    # the plots' bars are drawn: the blue of steps and programs, the red of fallbacks
    assert share("#3b6fb6") > 0.005 and share("#c8423b") > 0.001


def test_the_command(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    page = tmp_path / "page.html"
    assert cli.main(["report", "--out", str(page), "--steps", "3", "--json", str(script)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["steps_run"] == 3 and result["out"] == str(page) and page.is_file()
    assert "<svg" in page.read_text()

    failing = tmp_path / "failing.py"
    failing.write_text('import torch\n\nraise ValueError("planted failure")\n')
    assert cli.main(["report", "--out", str(page), str(failing)]) == 1
    text = page.read_text()
    assert "The script failed" in text and "planted failure" in text
    assert "No optimizer step ran" in text

    assert cli.main(["report", str(tmp_path / "missing.py")]) == 2
    assert cli.main(["report", "--out", str(tmp_path / "no" / "r.html"), str(script)]) == 2
    assert cli.main(["report", "--steps", "0", str(script)]) == 2
    err = capsys.readouterr().err
    assert "no such script" in err and "no such folder" in err and "at least 1" in err
