"""torch.distributed.checkpoint with FSDP2 on pjrt: save from N ranks, load into M.

Usage (under torchrun, or as a plain script for one process)::

    checkpoint_worker.py save DIR DEVICE   # train 2 steps with FSDP2, save DIR
    checkpoint_worker.py load DIR DEVICE   # FSDP2 over this job's ranks (or one
                                           # process, no FSDP), load DIR, compare

DEVICE is ``pjrt`` (the pjrt group) or ``cpu`` (gloo). ``save`` writes the distributed
checkpoint with ``dcp.save`` and, from rank 0, the whole state (``full_tensor()`` of
every parameter) as ``DIR/expected.pt`` with ``torch.save``. ``load`` builds the same
model on DEVICE (with more than one rank: ``fully_shard`` over the job's ranks), loads
with ``dcp.load`` and requires every parameter to equal ``expected.pt`` bit for bit.
Prints ``CHECKPOINT OK`` per rank.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parallel_worker import loss_fn, make_model  # noqa: E402


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().clone()


def build(device: str, world: int) -> torch.nn.Module:
    torch.manual_seed(1234)
    model = make_model().to(device)
    if world > 1:
        mesh = init_device_mesh(device, (world,))
        for block in model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model


def save(path: str, device: str, rank: int, world: int) -> None:
    model = build(device, world)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, 64, (8, 17), generator=torch.Generator().manual_seed(5678))
    per = tokens.shape[0] // world
    for _ in range(2):  # values that differ from the initialization
        opt.zero_grad()
        loss_fn(model, tokens[rank * per : (rank + 1) * per].to(device)).backward()
        opt.step()
    state = get_model_state_dict(model)
    expected = {k: full(v) for k, v in state.items()}
    dcp.save({"model": state}, checkpoint_id=path)
    if rank == 0:
        torch.save(expected, os.path.join(path, "expected.pt"))


def load(path: str, device: str, rank: int, world: int) -> int:
    model = build(device, world)
    state = get_model_state_dict(model)
    before = {k: full(v) for k, v in state.items()}
    dcp.load({"model": state}, checkpoint_id=path)
    set_model_state_dict(model, state)
    expected = torch.load(os.path.join(path, "expected.pt"))
    loaded = get_model_state_dict(model)
    assert sorted(loaded) == sorted(expected), (sorted(loaded), sorted(expected))
    changed = 0
    for name, value in loaded.items():
        got = full(value)
        if not torch.equal(got, expected[name]):
            raise AssertionError(f"{name}: max diff {(got - expected[name]).abs().max()}")
        local = value.to_local() if isinstance(value, DTensor) else value
        assert local.device.type == device, (name, local.device)
        changed += not torch.equal(before[name], expected[name])
    assert changed == len(expected), f"only {changed} of {len(expected)} tensors changed"
    return len(expected)


def main() -> None:
    mode, path, device = sys.argv[1:4]
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo" if device == "cpu" else "pjrt")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    if mode == "save":
        save(path, device, rank, world)
        print(f"CHECKPOINT OK save {device} rank={rank} world={world}", flush=True)
    else:
        n = load(path, device, rank, world)
        print(f"CHECKPOINT OK load {device} rank={rank} world={world} tensors={n}", flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
