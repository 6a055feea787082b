"""``torch-pjrt mcp``: torch_pjrt's diagnostics as tools for coding assistants, over the
Model Context Protocol (the official ``mcp`` SDK, stdio transport).

Tools: ``doctor`` (the installation and the chip), ``explain`` (an error or traceback,
looked up in the glossary), ``migrate`` (CUDA-only code found, and rewritten with
``apply=True``), ``onboard`` (a script's first steps on pjrt next to the CPU, in a
process of its own), ``report`` (a script run on pjrt, written up as an HTML page, in a
process of its own), and ``metrics`` (the counters of the server's own process).
docs/agents.md shows how to add the server to an assistant. Nothing is printed on stdout
but the protocol.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["build", "main"]

INSTRUCTIONS = (
    "torch_pjrt runs PyTorch programs on any chip with a PJRT plugin (TPU, GPU, CPU, ...) "
    "as the device 'pjrt'. Use doctor to check the installation and the chip, explain to "
    "understand a torch_pjrt error or traceback and get its fix, migrate to find CUDA-only "
    "code in a file or folder and rewrite it to device-generic code (apply=True writes), "
    "onboard to run a training script's first steps on pjrt and get the list of fixes, "
    "report to run a script and write an HTML page of what the device did (step times, "
    "compilations, host syncs, fallbacks, memory, the costliest programs)."
)


def build():
    """The MCP server with torch_pjrt's tools (not started)."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("torch-pjrt", instructions=INSTRUCTIONS)

    @server.tool(structured_output=True)
    def doctor(platform: str | None = None) -> dict[str, Any]:
        """Check the torch_pjrt installation: versions, PJRT plugins, the chosen platform
        and its devices, and a small matmul + softmax + backward compared with the CPU.
        `platform` (tpu, cuda, rocm, cpu, ...) checks one platform; `ok` is the verdict
        and `hints` say what to fix."""
        from torch_pjrt.diagnostics.doctor import doctor as run_doctor

        return run_doctor(platform)

    @server.tool(structured_output=True)
    def explain(text: str) -> dict[str, Any]:
        """Explain a torch_pjrt error message or a whole Python traceback: what it means,
        the usual cause, the fix and the doc to read (best match first; `entries` is
        empty when the glossary has none: errors of PyTorch or JAX themselves)."""
        from torch_pjrt.diagnostics import glossary

        return {"entries": [dataclasses.asdict(e) for e in glossary.explain(text)]}

    @server.tool(structured_output=True)
    def migrate(path: str, apply: bool = False) -> dict[str, Any]:
        """Analyze a Python file, or every *.py file under a folder, for CUDA-only code
        (torch.cuda calls, 'cuda' devices, .cuda(), CUDA autocast, GradScaler, nccl, ...)
        and code that is slow on XLA devices; each finding with the proposed change and
        its risk. With apply=True the files are rewritten in place (atomically) to
        device-generic torch.accelerator code."""
        from torch_pjrt import migrate as migrate_module

        try:
            report = migrate_module.migrate(path, apply=apply)
        except migrate_module.MigrateError as exc:
            return {"error": str(exc)}
        return report.as_dict()

    @server.tool(structured_output=True)
    def onboard(script: str, args: list[str] | None = None, steps: int = 4) -> dict[str, Any]:
        """Run a training script's first `steps` optimizer steps on pjrt next to the CPU
        (in a separate process) and report what to fix, with the script's lines: the
        first module whose output differs from the CPU's, recompilations with their
        cause, host syncs inside the loop, CPU fallbacks, CUDA-only code, and the fixes
        numbered. `ok` is true when nothing was found."""

        return _cli("onboard", "--steps", str(steps), script, *(args or []))

    @server.tool(structured_output=True)
    def report(
        script: str, args: list[str] | None = None, out: str = "report.html",
        steps: int | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Run a script on pjrt (in a separate process; `steps`: stop after that many
        optimizer steps) and write a self-contained HTML page to `out` for a person to
        open: step times with the compilations, host syncs by line, CPU fallbacks, bytes
        moved, device memory, the ten costliest programs, what strict mode would stop
        on. Returns the page's path and its figures: counters, programs, findings,
        fixes (`error`: the script's traceback, when it raised)."""
        extra = [] if steps is None else ["--steps", str(steps)]
        result = _cli("report", "--out", out, *extra, script, *(args or []))
        for bulky in ("steps", "memory"):  # (on the page; per step, long)
            result.pop(bulky, None)
        result.get("metrics", {}).pop("ops", None)
        return result

    @server.tool(structured_output=True)
    def metrics() -> dict[str, Any]:
        """torch_pjrt's counters in this server's process: ops, compilations and their
        causes, host syncs by line, transfers, CPU fallbacks."""
        from torch_pjrt.diagnostics import metrics as counters

        return counters.as_dict()

    return server


def _cli(command: str, *args: str) -> dict:
    """``torch-pjrt COMMAND --json ARGS`` in a process of its own: its JSON, or the error
    (exit status 0 and 1 both print the JSON)."""
    import json
    import subprocess
    import sys

    argv = [sys.executable, "-m", "torch_pjrt.cli", command, "--json", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if done.returncode not in (0, 1):
        return {"error": done.stderr.strip()[-4000:] or f"exit status {done.returncode}"}
    return json.loads(done.stdout)


def main() -> int:
    """Serve over stdio until the client closes the connection."""
    try:
        server = build()
    except ImportError as exc:
        import sys

        print(
            f"torch-pjrt mcp needs the mcp SDK ({exc}): pip install mcp (docs/agents.md)",
            file=sys.stderr,
        )
        return 1
    server.run("stdio")
    return 0
