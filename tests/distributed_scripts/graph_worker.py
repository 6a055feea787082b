"""Run under torchrun: a DistributedDataParallel training step captured into one
torch.pjrt.Graph (the gradient all-reduce inside the program), against the same steps
run uncaptured.

Usage: python -m torch.distributed.run --nproc_per_node N graph_worker.py

Every rank trains the same model (seeded) with DDP over the pjrt process group on its
shard of a fixed global batch: 2 warm-up steps, then 4 more steps either uncaptured or
as 4 replays of the captured step. Prints one ``GRAPH OK`` line per rank with the
largest differences of the losses and parameters, the compilations and the replays
during the 4 steps.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from torch_pjrt import metrics

BATCH = 4  # per rank


def main() -> None:
    dist.init_process_group("pjrt")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("pjrt", 0)
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Tanh(), torch.nn.Linear(32, 5))
    g = torch.Generator().manual_seed(1)
    data = [
        (torch.randn(BATCH * world, 12, generator=g), torch.randn(BATCH * world, 5, generator=g))
        for _ in range(6)
    ]
    shard = slice(rank * BATCH, (rank + 1) * BATCH)
    results, counts = [], {}
    for captured in (False, True):
        model = DDP(copy.deepcopy(base).to(device))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sx, sy = torch.zeros(BATCH, 12, device=device), torch.zeros(BATCH, 5, device=device)

        def step():
            loss = F.mse_loss(model(sx), sy)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        losses = []
        for i, (x, y) in enumerate(data):
            sx.copy_(x[shard])
            sy.copy_(y[shard])
            if captured and i == 2:
                graph = torch.pjrt.Graph()
                with torch.pjrt.graph(graph):
                    static_loss = step()
                metrics.reset()
            if captured and i >= 2:
                graph.replay()
                losses.append(static_loss.item())
            else:
                losses.append(step().item())
        if captured:
            counts = metrics.as_dict()
        results.append((losses, [p.detach().cpu() for p in model.parameters()]))
    (losses0, params0), (losses1, params1) = results
    loss_diff = max(abs(a - b) for a, b in zip(losses0, losses1))
    param_diff = max((a - b).abs().max().item() for a, b in zip(params0, params1))
    print(
        f"GRAPH OK rank={rank} world={world} loss_diff={loss_diff:.3g} "
        f"param_diff={param_diff:.3g} compilations={counts.get('compilations', 0)} "
        f"replays={counts.get('graph_replays', 0)}",
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
