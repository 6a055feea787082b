"""Running a test script in a process of its own (one CPU device) and reading the one
``RESULT {json}`` line it prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from torch_pjrt.runtime.launch import local_cpu_env


def script_result(script: Path, *args: str, timeout: float = 900, **env: str) -> dict:
    """Run ``python script args...``; its RESULT line as a dict (checked rc 0)."""
    done = subprocess.run(
        [sys.executable, str(script), *args],
        env={**local_cpu_env(), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, output[-6000:]
    return json.loads(line[len("RESULT ") :])
