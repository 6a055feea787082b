"""Starting ``vllm serve`` as users do, on 127.0.0.1 (tests/test_vllm.py, benchmarks/serve.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from torch_pjrt.runtime.launch import free_port


def start(model, args, log, env=None) -> tuple[subprocess.Popen, str]:
    """``vllm serve model --host 127.0.0.1 --port <free> *args``, output to the open file
    ``log``: the process and its base URL (not yet healthy: see :func:`wait_healthy`)."""
    port = free_port()
    vllm = os.path.join(os.path.dirname(sys.executable), "vllm")
    cmd = [vllm, "serve", str(model), "--host", "127.0.0.1", "--port", str(port), *args]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    return proc, f"http://127.0.0.1:{port}"


def wait_healthy(proc: subprocess.Popen, url: str, timeout: float) -> None:
    """Wait for ``/health``; AssertionError if the server exits or the time runs out."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"vllm serve exited with {proc.returncode} while starting")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"vllm serve not healthy after {timeout} s")
