"""Ray Train's own TorchTrainer, 2 workers, DDP on pjrt (TorchConfig(backend="pjrt")), with
torch_pjrt.ray_train's prepare_model and prepare_data_loader; then the same steps in one
process on the CPU. Prints one JSON line: the trainer's metrics and the reference.

Usage: python ray_trainer.py STORAGE_DIR (rank 0 writes its metrics there, as metrics.json:
Ray Train 2.60 keeps a report's metrics in the result only with a checkpoint)
"""

from __future__ import annotations

import json
import sys

import torch

WORLD, BATCH, STEPS, LR = 2, 4, 6, 0.1


def data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(WORLD * BATCH * STEPS, 8, generator=g)
    return x, x[:, :1].sin() + 0.1 * torch.randn(len(x), 1, generator=g)


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def train_loop(config: dict) -> None:
    import ray.train
    import ray.train.torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset

    from torch_pjrt import ray_train

    model = ray_train.prepare_model(build_model())
    loader = ray_train.prepare_data_loader(DataLoader(TensorDataset(*data()), batch_size=BATCH))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    loader.sampler.set_epoch(0)  # the wrapped loader's sampler: Ray's DistributedSampler
    placed, losses = set(), []
    for xb, yb in loader:
        placed |= {xb.device.type, yb.device.type, next(model.parameters()).device.type}
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)  # the whole batch's loss
        losses.append(mean.item())
    metrics = {
        "losses": losses,
        "placed": sorted(placed),
        "device": str(ray_train.get_device()),
        "rays_device": str(ray.train.torch.get_device()),
        "backend": dist.get_backend(),
        "ddp": isinstance(model, torch.nn.parallel.DistributedDataParallel),
        "epoch_set": type(loader.sampler).__name__ == "DistributedSampler",
        "params": [p.detach().cpu().flatten().tolist() for p in model.parameters()],
    }
    ray.train.report(metrics)
    if ray.train.get_context().get_world_rank() == 0:
        with open(config["out"], "w") as f:
            json.dump(metrics, f)


def reference() -> dict:
    """One process, the CPU, each step on the batch the two workers share."""
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = data()
    losses = []
    for step in range(STEPS):
        rows = slice(step * WORLD * BATCH, (step + 1) * WORLD * BATCH)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[rows]), y[rows])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses, "params": [p.detach().flatten().tolist() for p in model.parameters()]}


def main() -> None:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.init(num_cpus=WORLD, include_dashboard=False)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"out": f"{sys.argv[1]}/metrics.json"},
        scaling_config=ScalingConfig(num_workers=WORLD, use_gpu=False),
        torch_config=TorchConfig(backend="pjrt"),
        run_config=RunConfig(storage_path=sys.argv[1], name="pjrt"),
    )
    trainer.fit()
    ray.shutdown()
    with open(f"{sys.argv[1]}/metrics.json") as f:
        trained = json.load(f)
    print("RESULT " + json.dumps({"trained": trained, "reference": reference()}), flush=True)


if __name__ == "__main__":
    main()
