"""Faults of the pjrt process group: a rank that raises, dies or hangs, and collectives
that differ across ranks, make the other ranks raise a clear error, never hang.

Each test starts the ranks of tests/distributed_scripts/faults_worker.py itself (one
subprocess per rank, torchrun's environment variables), so it sees every rank's own
exit status and output; one test runs the worker under torchrun.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from tests.test_distributed import SCRIPTS
from torch_pjrt.runtime.launch import free_port_pair, local_cpu_env, local_torchrun_command

WORKER = SCRIPTS / "faults_worker.py"
TIMEOUT_S = 10  # the group's timeout (init_process_group(timeout=...))


def _ranks(scenario: str, nproc: int = 2, timeout_s: float = TIMEOUT_S, limit: float = 120):
    """Run every rank; (return codes, outputs, wall seconds until all exited)."""
    port = free_port_pair()
    procs = []
    start = time.monotonic()
    for rank in range(nproc):
        env = local_cpu_env()
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(nproc),
            LOCAL_WORLD_SIZE=str(nproc),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        cmd = [sys.executable, str(WORKER), scenario, str(timeout_s)]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outputs, codes = [], []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, limit - (time.monotonic() - start)))
            outputs.append(out)
            codes.append(p.returncode)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return codes, outputs, time.monotonic() - start


def _fault(output: str) -> tuple[float, str]:
    found = re.search(r"FAULT rank=\d+ seconds=(\S+) error=(.*)", output)
    assert found, output[-4000:]
    return float(found.group(1)), found.group(2)


def test_rank_that_raises_is_named():
    codes, outputs, wall = _ranks("raise")
    assert codes[1] == 1 and "ValueError: injected failure on rank 1" in outputs[1], outputs[1]
    seconds, error = _fault(outputs[0])
    assert "rank 1 raised ValueError: injected failure on rank 1" in error
    assert "collective #2 all_reduce(float32[4], sum)" in error
    assert seconds < TIMEOUT_S  # the report arrives at once, not at the timeout
    assert codes[0] == 1 and "torch.distributed.DistBackendError" in outputs[0]
    assert wall < 60, wall


def test_killed_rank_is_named():
    codes, outputs, wall = _ranks("kill")
    assert codes[1] == -9, (codes, outputs[1][-2000:])
    seconds, error = _fault(outputs[0])
    assert "rank 1 did not reach it (the process exited or was killed" in error
    assert seconds < TIMEOUT_S  # its connections closed: no need to wait for the timeout
    assert codes[0] == 1
    assert wall < 60, wall


def test_mismatched_shapes_and_order_name_both_sides():
    codes, outputs, _ = _ranks("mismatch")
    assert codes == [0, 0], [o[-3000:] for o in outputs]
    for rank, out in enumerate(outputs):
        errors = re.findall(r"FAULT rank=\d+ seconds=\S+ error=(.*)", out)
        assert len(errors) == 3, out[-3000:]
        shapes, order_first, order_second = errors
        assert (
            "rank 0 called #2 all_reduce(float32[4], sum), "
            "rank 1 called #2 all_reduce(float32[2,4], sum)"
        ) in shapes
        assert (
            "rank 0 called #3 all_reduce(float32[4], sum), "
            "rank 1 called #3 all_gather_into_tensor(float32[4], (8,))"
        ) in order_first
        assert (
            "rank 0 called #4 all_gather_into_tensor(float32[4], (8,)), "
            "rank 1 called #4 all_reduce(float32[4], sum)"
        ) in order_second
        assert f"MISMATCH OK rank={rank}" in out


@pytest.mark.slow
def test_hung_rank_times_out():
    """Rank 1 sleeps past the timeout: rank 0 raises after the group's timeout."""
    timeout_s = 5
    codes, outputs, wall = _ranks("hang", timeout_s=timeout_s)
    seconds, error = _fault(outputs[0])
    assert "rank 1 did not reach it" in error and "timeout 5 s" in error
    assert timeout_s - 0.5 <= seconds <= timeout_s + 5, seconds
    assert codes[0] == 1
    assert wall < 60, wall


@pytest.mark.slow
def test_under_torchrun_the_survivor_reports_the_failed_rank():
    """torchrun tears the job down when a worker fails; the survivor's error comes first."""
    cmd = local_torchrun_command(2, "--max-restarts", "0", str(WORKER), "raise", str(TIMEOUT_S))
    start = time.monotonic()
    done = subprocess.run(cmd, env=local_cpu_env(), capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - start
    output = done.stdout + done.stderr
    assert done.returncode != 0
    seconds, error = _fault(output)
    assert "rank 1 raised ValueError: injected failure on rank 1" in error, output[-4000:]
    assert seconds < TIMEOUT_S and wall < 60, (seconds, wall)


def test_timeout_and_switch_from_the_environment(monkeypatch):
    import torch

    from torch_pjrt.distributed import faults

    monkeypatch.delenv("TORCH_PJRT_COLLECTIVE_TIMEOUT", raising=False)
    assert faults.collective_timeout(timedelta(seconds=7)) == timedelta(seconds=7)
    monkeypatch.setenv("TORCH_PJRT_COLLECTIVE_TIMEOUT", "2.5")
    assert faults.collective_timeout(timedelta(minutes=30)) == timedelta(seconds=2.5)
    monkeypatch.setenv("TORCH_PJRT_COLLECTIVE_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="number of seconds"):
        faults.collective_timeout(None)
    assert faults.checks_enabled()
    monkeypatch.setenv("TORCH_PJRT_DISTRIBUTED_CHECKS", "0")
    assert not faults.checks_enabled()
    t = torch.ones(2, 3, dtype=torch.bfloat16)
    assert faults.describe("broadcast", t, 1) == "broadcast(bfloat16[2,3], 1)"


def test_jax_timeouts_from_the_environment(monkeypatch):
    from torch_pjrt.runtime.launch import jax_timeouts

    monkeypatch.delenv("TORCH_PJRT_INIT_TIMEOUT", raising=False)
    monkeypatch.delenv("TORCH_PJRT_HEARTBEAT_TIMEOUT", raising=False)
    assert jax_timeouts() == {}  # JAX's defaults
    monkeypatch.setenv("TORCH_PJRT_INIT_TIMEOUT", "30")
    monkeypatch.setenv("TORCH_PJRT_HEARTBEAT_TIMEOUT", "7.6")
    assert jax_timeouts() == {"initialization_timeout": 30, "heartbeat_timeout_seconds": 8}
    monkeypatch.setenv("TORCH_PJRT_HEARTBEAT_TIMEOUT", "x")
    with pytest.raises(ValueError, match="TORCH_PJRT_HEARTBEAT_TIMEOUT must be a number"):
        jax_timeouts()
