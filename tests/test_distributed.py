"""torch.distributed's ``pjrt`` backend: collectives across real processes (torchrun).

The worker (tests/distributed_scripts/collectives_worker.py) runs every collective on
pjrt tensors and the same one with gloo on CPU tensors, and compares. Each process is
one JAX process with one CPU device; JAX's gloo collectives carry the data between them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests import expectations
from torch_pjrt.runtime.launch import free_port, local_cpu_env, local_torchrun_command

SCRIPTS = Path(__file__).parent / "distributed_scripts"
WORKER = SCRIPTS / "collectives_worker.py"
DDP_WORKER = SCRIPTS / "ddp_worker.py"
FUNCTIONAL_WORKER = SCRIPTS / "functional_worker.py"
PARALLEL_WORKER = SCRIPTS / "parallel_worker.py"
CHECKPOINT_WORKER = SCRIPTS / "checkpoint_worker.py"


def _launch(nproc: int, script: Path, *args: str, timeout: float = 300) -> str:
    """Run ``script`` under ``python -m torch.distributed.run``; its output (checked rc 0).
    One CPU device per process: conftest's forced device count does not leak in."""
    cmd = local_torchrun_command(nproc, str(script), *args)
    done = subprocess.run(cmd, env=local_cpu_env(), capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    return output


def _torchrun(nproc: int, init: str, timeout: float = 300) -> list[str]:
    output = _launch(nproc, WORKER, init, timeout=timeout)
    # the ranks share one pipe: their lines may run together
    found = re.findall(r"COLLECTIVES OK rank=(\d+) world=(\d+) init=(\w+) dtypes=([\w,]+)", output)
    assert sorted(int(rank) for rank, *_ in found) == list(range(nproc)), output[-6000:]
    for _, world, how, dtypes in found:
        assert (int(world), how) == (nproc, init)
        assert dtypes == "float32,float64,bfloat16,float16,int32,int64,int8,uint8"
    return found


def _ddp(nproc: int, cases: list[str], timeout: float = 600) -> None:
    """DDP on pjrt vs. single-process CPU training (the worker checks 1e-4 itself)."""
    output = _launch(nproc, DDP_WORKER, ",".join(cases), timeout=timeout)
    found = re.findall(r"DDP OK case=(\w+) rank=(\d+) world=(\d+) loss_diff=(\S+)", output)
    want = sorted((case, rank) for case in cases for rank in range(nproc))
    assert sorted((case, int(rank)) for case, rank, *_ in found) == want, output[-6000:]
    for _, _, world, loss_diff in found:
        assert int(world) == nproc and float(loss_diff) <= 1e-4


def _functional(nproc: int) -> None:
    output = _launch(nproc, FUNCTIONAL_WORKER)
    found = re.findall(r"FUNCTIONAL OK rank=(\d+) world=(\d+) checks=(\d+)", output)
    assert sorted(int(rank) for rank, *_ in found) == list(range(nproc)), output[-6000:]
    assert all(int(world) == nproc and int(checks) >= 60 for _, world, checks in found)


def test_collectives_two_processes():
    _torchrun(2, "pjrt")


def test_plain_init_process_group_picks_pjrt():
    _torchrun(2, "default")


@pytest.mark.slow
def test_collectives_four_processes():
    _torchrun(4, "pjrt")


@pytest.mark.parametrize("method", ["file", "tcp"])
def test_spawn_with_a_file_init_method(tmp_path, method):
    """torch.multiprocessing.spawn and init_method='file://...' or 'tcp://...', no launcher
    environment: the pjrt process group starts JAX's distributed runtime through its own
    store (collectives and two DDP steps checked against values every rank computes)."""
    init = str(tmp_path / "init") if method == "file" else f"tcp://127.0.0.1:{free_port()}"
    cmd = [sys.executable, str(SCRIPTS / "spawn_worker.py"), "2", init]
    done = subprocess.run(cmd, env=local_cpu_env(), capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    # the ranks share one pipe: their lines may run together
    found = re.findall(r"SPAWN OK rank=(\d) world=2 param_diff=(\d\.\d\de[-+]\d\d)", output)
    assert sorted(int(rank) for rank, _ in found) == [0, 1], output[-6000:]
    assert all(float(diff) <= 1e-5 for _, diff in found)


def test_ddp_two_processes():
    """An MLP with AdamW: two gradient buckets per step, gradients as bucket views."""
    _ddp(2, ["mlp_adamw_bucket_view"])


@pytest.mark.slow
def test_ddp_llama_two_processes():
    """SGD (one and two buckets); a small Llama-style model with AdamW, DDP's own
    allreduce and a comm hook."""
    _ddp(2, ["mlp_sgd", "mlp_sgd_buckets", "llama_adamw", "llama_adamw_hook"])


@pytest.mark.slow
def test_ddp_four_processes():
    _ddp(4, ["mlp_sgd", "mlp_sgd_buckets", "mlp_adamw_bucket_view", "llama_adamw"])


def test_ddp_step_captured_two_processes():
    """A DDP step captured into one graph: each replay is one SPMD program with the
    gradient all-reduce inside, compiled once, and trains as the uncaptured steps do."""
    output = _launch(2, SCRIPTS / "graph_worker.py")
    found = re.findall(
        r"GRAPH OK rank=(\d+) world=2 loss_diff=(\S+) param_diff=(\S+) "
        r"compilations=(\d+) replays=(\d+)",
        output,
    )
    assert sorted(int(r[0]) for r in found) == [0, 1], output[-6000:]
    for _, loss_diff, param_diff, compilations, replays in found:
        assert float(loss_diff) <= 1e-6 and float(param_diff) <= 1e-6
        assert (int(compilations), int(replays)) == (1, 4)


def test_functional_collectives_two_processes():
    _functional(2)


@pytest.mark.slow
def test_functional_collectives_four_processes():
    _functional(4)


def _parallel(nproc: int, cases: list[str]) -> None:
    output = _launch(nproc, PARALLEL_WORKER, ",".join(cases), timeout=900)
    found = re.findall(
        r"PARALLEL OK case=(\S+) rank=(\d+) world=(\d+) .*? "
        r"graph_eager_collectives=(\d+) graph_spmd_collectives=(\d+)",
        output,
    )
    expected = sorted((case, rank) for case in cases for rank in range(nproc))
    assert sorted((case, int(rank)) for case, rank, *_ in found) == expected, output[-6000:]
    for case, _, _, eager, spmd in found:
        if case == "tp:compiled":  # DTensor's collectives are in the graphs' XLA programs
            assert int(eager) == 0 and int(spmd) > 0, (case, eager, spmd)
        if case.endswith(":eager"):
            assert int(eager) == int(spmd) == 0, (case, eager, spmd)


def test_fsdp2_tp_four_processes_eager():
    """FSDP2 over 4 ranks, TP over 4 ranks and FSDP2 x TP on a 2x2 mesh, against one
    process on the CPU (losses and gathered parameters within 1e-4 over 10 steps)."""
    _parallel(4, ["fsdp:eager", "tp:eager", "fsdp_tp:eager"])


def test_fsdp2_tp_two_processes_compiled():
    """FSDP2 and TP compiled (the collectives inside the graphs' programs), on 2 ranks
    (the 4-rank run is the exhaustive one: 4 processes compiling on 2 cores cost
    ``make test`` about 90 s)."""
    _parallel(2, ["fsdp:compiled", "tp:compiled"])


@pytest.mark.slow
def test_fsdp2_tp_four_processes_compiled():
    _parallel(4, ["fsdp:compiled", "tp:compiled"])


@pytest.mark.slow
@expectations.expected(expectations.XFAIL_DISTRIBUTED)
def test_fsdp2_x_tp_four_processes_compiled():
    _parallel(4, ["fsdp_tp:compiled"])


def _checkpoint_round_trip(tmp_path, saved_on: str, loads: list[tuple[int, str]]) -> None:
    """Save an FSDP2 model from 4 ranks on ``saved_on``; load it with each (ranks,
    device) of ``loads`` (1 rank: a plain process without FSDP) and compare bit for bit."""
    path = str(tmp_path / "checkpoint")
    output = _launch(4, CHECKPOINT_WORKER, "save", path, saved_on)
    assert output.count(f"CHECKPOINT OK save {saved_on}") == 4, output[-6000:]
    for nproc, device in loads:
        if nproc == 1:
            done = subprocess.run(
                [sys.executable, str(CHECKPOINT_WORKER), "load", path, device],
                env=local_cpu_env(),
                capture_output=True,
                text=True,
                timeout=300,
            )
            output = done.stdout + done.stderr
            assert done.returncode == 0, output[-6000:]
        else:
            output = _launch(nproc, CHECKPOINT_WORKER, "load", path, device)
        ok = f"CHECKPOINT OK load {device} rank="
        assert output.count(ok) == nproc and "tensors=21" in output, output[-6000:]


def test_checkpoint_fsdp2_four_to_two_to_one(tmp_path):
    """torch.distributed.checkpoint: an FSDP2 model saved from 4 pjrt ranks loads into 2
    pjrt ranks, and into one process on pjrt and on the CPU, bit-exact."""
    _checkpoint_round_trip(tmp_path, "pjrt", [(2, "pjrt"), (1, "pjrt"), (1, "cpu")])


@pytest.mark.slow
def test_checkpoint_saved_on_cpu_loads_on_pjrt(tmp_path):
    """The other way: saved from 4 CPU (gloo) ranks, loaded into 2 pjrt ranks, 2 CPU
    ranks and one pjrt process."""
    _checkpoint_round_trip(tmp_path, "cpu", [(2, "pjrt"), (2, "cpu"), (1, "pjrt")])


def test_backend_registered_for_the_device():
    assert "pjrt" in dist.Backend.backend_list
    assert dist.Backend.default_device_backend_map["pjrt"] == "pjrt"


def test_single_process_group_and_errors():
    """World size 1 in this process (no torchrun: JAX is not multi-process)."""
    from torch_pjrt.distributed.backend import PjrtProcessGroup

    dist.init_process_group("pjrt", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert isinstance(dist.group.WORLD, PjrtProcessGroup)
        x = torch.arange(6, dtype=torch.float32, device="pjrt").reshape(2, 3)
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        assert torch.equal(x.cpu(), torch.arange(6.0).reshape(2, 3))
        out = torch.empty(2, 3, device="pjrt")
        dist.all_gather_into_tensor(out, x)
        assert torch.equal(out.cpu(), x.cpu())
        # functional collectives find the group by its name
        import torch.distributed._functional_collectives as fc

        assert dist.group.WORLD.group_name
        y = fc.wait_tensor(fc.all_reduce(x, "max", dist.group.WORLD))
        assert y.device.type == "pjrt" and torch.equal(y.cpu(), x.cpu())
        y = fc.wait_tensor(fc.all_gather_tensor(x, 1, dist.group.WORLD))
        assert torch.equal(y.cpu(), x.cpu())
        with pytest.raises(RuntimeError, match="group_size=2 for a group of 1"):
            torch.ops._c10d_functional.all_gather_into_tensor(x, 2, dist.group.WORLD.group_name)
        with pytest.raises(RuntimeError, match="ReduceOp.AVG needs a floating point"):
            dist.all_reduce(torch.ones(3, dtype=torch.int64, device="pjrt"), op=dist.ReduceOp.AVG)
        y = x.clone()
        dist.all_reduce(y, op=dist._make_nccl_premul_sum(2.0))  # one rank: x times 2
        assert torch.equal(y.cpu(), x.cpu() * 2)
        with pytest.raises(RuntimeError, match="ReduceOp.PREMUL_SUM needs a floating point"):
            dist.all_reduce(
                torch.ones(3, dtype=torch.int64, device="pjrt"), op=dist.ReduceOp.PREMUL_SUM(2.0)
            )
        with pytest.raises(RuntimeError, match="all be pjrt tensors or all CPU"):
            dist.all_gather_into_tensor(torch.empty(2, 3), x)
        with pytest.raises(RuntimeError, match="does not support dtype torch.complex64"):
            PjrtProcessGroup._check("all_reduce", [torch.ones(2, dtype=torch.complex64)])
    finally:
        dist.destroy_process_group()


def test_xfail_table_names_tests():
    unknown = set(expectations.XFAIL_DISTRIBUTED) - set(globals())
    assert not unknown, f"XFAIL_DISTRIBUTED: no such test: {sorted(unknown)}"
