"""SPMD in one process (torch_pjrt.distributed.spmd): meshes, placements, GSPMD.

The test process has two CPU devices (conftest.py), enough for the API and a 1-d mesh;
the data- plus model-parallel training step on a 2x4 mesh of 8 devices runs in a
subprocess (tests/spmd_scripts/train_step.py) with eight.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch
from torch.distributed.tensor import Partial, Replicate, Shard

import torch_pjrt
from torch_pjrt.device.tensor import cell_of
from torch_pjrt.distributed import (
    device_mesh,
    distribute_module,
    distribute_tensor,
    mark_sharding,
    sharding_of,
)
from torch_pjrt.runtime import executor

SCRIPT = pathlib.Path(__file__).parent / "spmd_scripts" / "train_step.py"


@pytest.fixture(autouse=True, scope="module")
def _no_mesh_afterwards():
    """A mesh turns on the SPMD checks for the whole process; other test modules that
    share this worker should not pay for them."""
    yield
    executor.mesh_in_use = False


@pytest.fixture
def mesh():
    return device_mesh((2,), ("x",))


@pytest.fixture(params=["fused", "eager"])
def mode(request):
    with torch_pjrt.modes.mode(request.param):
        yield request.param


def _shard_shape(t: torch.Tensor) -> tuple:
    return tuple(cell_of(t).array.addressable_shards[0].data.shape)


def test_distribute_tensor(mesh):
    cpu = torch.randn(4, 6, requires_grad=True)
    t = distribute_tensor(cpu, mesh, [Shard(1)])
    assert t.device == torch.device("pjrt:0") and t.requires_grad
    assert sharding_of(t) == (mesh, (Shard(1),))
    assert _shard_shape(t) == (4, 3)
    torch.testing.assert_close(t.cpu(), cpu.detach())  # .cpu() gathers the shards
    replicated = distribute_tensor(cpu.to("pjrt"), mesh)
    assert sharding_of(replicated).placements == (Replicate(),)
    assert _shard_shape(replicated) == (4, 6)
    assert sharding_of(torch.ones(3, device="pjrt")) is None  # one device


def test_mark_sharding_keeps_the_parameter(mesh, mode):
    torch.manual_seed(0)
    cpu = torch.nn.Linear(4, 6)
    model = torch.nn.Linear(4, 6).to("pjrt")
    model.load_state_dict(cpu.state_dict())
    weight = model.weight
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    assert mark_sharding(model.weight, mesh, [Shard(0)]) is weight
    x = torch.randn(8, 4)
    cpu_opt = torch.optim.SGD(cpu.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        for m, o, inp in ((cpu, cpu_opt, x), (model, opt, x.to("pjrt"))):
            o.zero_grad()
            m(inp).square().sum().backward()
            o.step()
    # the in-place updates keep the parameter sharded, and the numerics
    assert sharding_of(model.weight).placements == (Shard(0),)
    assert _shard_shape(model.weight) == (3, 4)
    torch.testing.assert_close(model.weight.detach().cpu(), cpu.weight.detach())
    torch.testing.assert_close(model.bias.detach().cpu(), cpu.bias.detach())


def test_sharded_meets_one_device_tensors(mesh, mode):
    a = torch.randn(4, 6)
    b = torch.randn(4, 6)
    x = distribute_tensor(a, mesh, [Shard(0)])
    y = b.to("pjrt")  # on pjrt:0 only: replicated over the mesh when they meet
    out = (x + y) * torch.tensor(2.0) + torch.tensor(1.0, device="pjrt")
    torch.testing.assert_close(out.cpu(), (a + b) * 2 + 1)
    assert sharding_of(out) is not None
    total = x.sum(0)  # a reduction across shards
    torch.testing.assert_close(total.cpu(), a.sum(0))
    view = x[1:3, ::2]  # views of a sharded storage
    torch.testing.assert_close(view.cpu(), a[1:3, ::2])
    x[0].fill_(5.0)  # writes through views, from the device and from the host
    x[1] = torch.full((6,), 2.0, device="pjrt")
    x[2] = torch.ones(6)
    a[0], a[1], a[2] = 5.0, 2.0, 1.0
    torch.testing.assert_close(x.cpu(), a)
    assert sharding_of(x).placements == (Shard(0),)


def test_compiled_graph_runs_partitioned(mesh):
    w = torch.randn(6, 4)
    x = torch.randn(8, 6)
    xs = distribute_tensor(x, mesh, [Shard(0)])

    @torch.compile(backend="pjrt")
    def f(x, w):
        return torch.relu(x @ w).sum(1)

    out = f(xs, w.to("pjrt"))  # (the one-device weight is replicated over the mesh)
    torch.testing.assert_close(out.cpu(), torch.relu(x @ w).sum(1))
    assert sharding_of(out).placements == (Shard(0),)  # GSPMD kept the batch split
    assert _shard_shape(out) == (4,)


def test_writes_keep_the_layout(mesh, mode):
    model = torch.nn.Linear(4, 6).to("pjrt")
    mark_sharding(model.weight, mesh, [Shard(1)])
    state = {k: torch.randn_like(v.cpu()) for k, v in model.state_dict().items()}
    model.load_state_dict(state)  # copy_ of one-device values into the sharded weight
    assert sharding_of(model.weight).placements == (Shard(1),)
    assert _shard_shape(model.weight) == (6, 2)
    torch.testing.assert_close(model.weight.detach().cpu(), state["weight"])
    with torch.no_grad():
        model.weight.fill_(3.0)
    assert sharding_of(model.weight).placements == (Shard(1),)
    torch.testing.assert_close(model.weight.detach().cpu(), torch.full((6, 4), 3.0))


def test_distribute_module(mesh):
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model.load_state_dict(cpu.state_dict())
    model = model.to("pjrt")

    def partition(name, sub, mesh):
        if name == "0":
            mark_sharding(sub.weight, mesh, [Shard(0)])

    def shard_batch(module, inputs, mesh):
        return tuple(distribute_tensor(x, mesh, [Shard(0)]) for x in inputs)

    distribute_module(model, mesh, partition, input_fn=shard_batch)
    assert sharding_of(model[0].weight).placements == (Shard(0),)
    assert sharding_of(model[2].weight).placements == (Replicate(),)
    x = torch.randn(6, 4)
    torch.testing.assert_close(model(x.to("pjrt")).detach().cpu(), cpu(x).detach())


def test_errors(mesh):
    t = torch.randn(4, 6).to("pjrt")
    with pytest.raises(ValueError, match="same length as `device_mesh.ndim`"):
        mark_sharding(t, mesh, [Shard(0), Replicate()])
    with pytest.raises(IndexError, match="Dimension out of range"):
        mark_sharding(t, mesh, [Shard(2)])
    with pytest.raises(ValueError, match="not divisible by 2"):
        distribute_tensor(torch.randn(3, 4), mesh, [Shard(0)])
    with pytest.raises(NotImplementedError, match="only Shard"):
        mark_sharding(t, mesh, [Partial()])
    with pytest.raises(RuntimeError, match="expected a tensor on a pjrt device"):
        mark_sharding(torch.randn(4, 6), mesh, [Shard(0)])
    with pytest.raises(RuntimeError, match="whole storage"):
        mark_sharding(t[:2], mesh, [Shard(0)])
    with pytest.raises(RuntimeError, match=r"needs 8 devices, but the 'cpu' platform has 2"):
        device_mesh((2, 4))
    with pytest.raises(TypeError, match="expected a torch_pjrt Mesh"):
        mark_sharding(t, "x", [Shard(0)])
    assert sharding_of(t) is None  # nothing was changed by the failed calls


def test_training_step_on_8_devices(tmp_path):
    """A data- (batch Shard(0) on "data") plus model-parallel (Megatron-style linears
    on "model") training step on a 2x4 mesh matches one device and the CPU, compiled
    and op by op; the compiled programs are really partitioned by GSPMD."""
    dump = tmp_path / "hlo"
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        "--xla_force_host_platform_device_count=8 "
        f"--xla_dump_to={dump} --xla_dump_hlo_module_re=graph_.*"
    )
    env["TORCH_PJRT_CACHE"] = "0"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "compiled:adamw", "eager:sgd"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for config, r in results.items():
        assert r["devices"] == 8
        losses = r["losses"]
        for run in ("single", "sharded"):
            torch.testing.assert_close(losses[run], losses["cpu"], atol=1e-5, rtol=1e-5)
            assert r["max_param_diff"][run] < 1e-5, (config, run, r["max_param_diff"])
        assert losses["cpu"][-1] < losses["cpu"][0]  # it trains
        assert r["placements"] == {
            "fc1.weight": ["R", "S(0)"],
            "fc1.bias": ["R", "S(0)"],
            "fc2.weight": ["R", "S(1)"],
            "fc2.bias": ["R", "R"],
        }, config
        # the per-device pieces: fc1 (32, 16) and fc2 (8, 32) split four ways
        assert r["shard_shapes"]["fc1.weight"] == [8, 16]
        assert r["shard_shapes"]["fc2.weight"] == [8, 8]
        assert r["batch_placements"] == ["S(0)", "R"]
        assert r["fallbacks"] == {}
    assert results["compiled:adamw"]["state_placements"] == ["R", "S(0)"]

    # XLA's optimized HLO of the compiled graphs (the one-device run's, then the mesh's):
    # the mesh's forward is an SPMD-partitioned program on per-device shapes with an
    # all-reduce (the row-parallel fc2), and its backward all-reduces the data-parallel
    # gradients; the one-device programs have neither
    forwards, backwards = _optimized_hlo(dump, "forward"), _optimized_hlo(dump, "backward")
    (single, single_params), (sharded, sharded_params) = map(_entry, forwards)
    assert not single.endswith("_spmd") and sharded.endswith("_spmd"), (single, sharded)
    assert "f32[32,16]" in single_params  # fc1.weight, whole
    assert "f32[32,16]" not in sharded_params and "f32[8,16]" in sharded_params  # shards
    assert "all-reduce(" not in forwards[0] and "all-reduce(" in forwards[1]
    assert "all-reduce(" not in backwards[0] and "all-reduce(" in backwards[1]


def _optimized_hlo(dump: pathlib.Path, kind: str) -> list:
    files = sorted(dump.glob(f"*graph_*_{kind}.cpu_after_optimizations.txt"))
    assert len(files) == 2, sorted(p.name for p in dump.iterdir())  # one device, then mesh
    return [f.read_text() for f in files]


def _entry(hlo: str) -> tuple:
    """(name, parameters) of an HLO module's entry computation."""
    found = re.search(r"^ENTRY %(\S+) \(([^)]*)\)", hlo, re.MULTILINE)
    assert found, hlo[:2000]
    return found.group(1), found.group(2)
