"""``torch.multiprocessing.spawn`` with a ``file://`` or ``tcp://`` init_method: no launcher
environment, so the pjrt process group names JAX's coordinator through its own store. Each rank
all-reduces, broadcasts and all-gathers pjrt tensors and checks them against the values
every rank can compute; then trains two DDP steps on pjrt and compares the parameters
with one process training on the whole batch on the CPU.

Usage: python spawn_worker.py WORLD_SIZE INIT (a file's path, or a tcp://host:port URL)
"""

from __future__ import annotations

import copy
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _ddp_matches_cpu(rank: int, world: int) -> float:
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    model = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(reference).to("pjrt"))
    x = torch.randn(2 * world, 4, generator=torch.Generator().manual_seed(1))
    y = torch.randn(2 * world, 1, generator=torch.Generator().manual_seed(2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    cpu_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    mine = slice(2 * rank, 2 * rank + 2)
    for _ in range(2):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x[mine].to("pjrt")), y[mine].to("pjrt")).backward()
        optimizer.step()
        cpu_optimizer.zero_grad()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        cpu_optimizer.step()
    return max(
        (p.detach().cpu() - q.detach()).abs().max().item()
        for p, q in zip(model.module.parameters(), reference.parameters(), strict=True)
    )


def worker(rank: int, world: int, init: str) -> None:
    method = init if init.startswith("tcp://") else f"file://{init}"
    dist.init_process_group("pjrt", init_method=method, rank=rank, world_size=world)
    total = torch.full((3,), float(rank + 1), device="pjrt")
    dist.all_reduce(total)
    assert total.cpu().tolist() == [world * (world + 1) / 2] * 3, total
    source = torch.arange(4.0, device="pjrt") * (rank + 1)
    dist.broadcast(source, src=world - 1)
    assert source.cpu().tolist() == [i * world for i in range(4)], source
    gathered = [torch.empty(2, device="pjrt") for _ in range(world)]
    dist.all_gather(gathered, torch.full((2,), float(rank), device="pjrt"))
    assert [g.cpu().tolist() for g in gathered] == [[float(r)] * 2 for r in range(world)]
    diff = _ddp_matches_cpu(rank, world)
    assert diff <= 1e-5, diff
    print(f"SPAWN OK rank={rank} world={world} param_diff={diff:.2e}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    world, init = int(sys.argv[1]), sys.argv[2]
    mp.spawn(worker, args=(world, init), nprocs=world)
