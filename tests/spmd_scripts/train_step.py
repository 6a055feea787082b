"""A data- plus model-parallel training step on a 2x4 mesh of 8 CPU devices, against
one device and CPU PyTorch; run by tests/test_spmd.py as a subprocess (the test process
has two devices). Prints one JSON line of results.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python train_step.py MODE:OPT ...

MODE: compiled (torch.compile(backend="pjrt")) or eager (op by op, in the execution mode
TORCH_PJRT_MODE chooses); OPT: sgd (with momentum) or adamw. One result per argument.
"""

from __future__ import annotations

import json
import sys

import torch
from torch.distributed.tensor import Replicate, Shard

import torch_pjrt
from torch_pjrt.device.tensor import cell_of
from torch_pjrt.distributed import device_mesh, distribute_tensor, mark_sharding, sharding_of

STEPS = 3


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def make_optimizer(params, name):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)


def train(model, x, y, opt_name, compiled):
    opt = make_optimizer(model.parameters(), opt_name)

    def step(x, y):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    if compiled:
        step = torch.compile(step, backend="pjrt")
    losses = [step(x, y).item() for _ in range(STEPS)]
    return losses, opt


def run(mode: str, opt_name: str) -> dict:
    compiled = mode == "compiled"
    torch.manual_seed(0)
    reference = MLP()
    x, y = torch.randn(16, 16), torch.randn(16, 8)
    results = {"devices": torch.pjrt.device_count()}

    cpu = MLP()
    cpu.load_state_dict(reference.state_dict())
    cpu_losses, _ = train(cpu, x, y, opt_name, compiled=False)

    single = MLP()
    single.load_state_dict(reference.state_dict())
    single = single.to("pjrt")
    single_losses, _ = train(single, x.to("pjrt"), y.to("pjrt"), opt_name, compiled)

    mesh = device_mesh((2, 4), ("data", "model"))
    sharded = MLP()
    sharded.load_state_dict(reference.state_dict())
    sharded = sharded.to("pjrt")
    # Megatron-style: fc1 split by output features, fc2 by input features
    plan = {
        "fc1.weight": [Replicate(), Shard(0)],
        "fc1.bias": [Replicate(), Shard(0)],
        "fc2.weight": [Replicate(), Shard(1)],
        "fc2.bias": [Replicate(), Replicate()],
    }
    for name, p in sharded.named_parameters():
        mark_sharding(p, mesh, plan[name])
    xs = distribute_tensor(x, mesh, [Shard(0), Replicate()])
    ys = distribute_tensor(y, mesh, [Shard(0), Replicate()])
    sharded_losses, opt = train(sharded, xs, ys, opt_name, compiled)

    results["losses"] = {"cpu": cpu_losses, "single": single_losses, "sharded": sharded_losses}
    results["max_param_diff"] = {
        "single": max(
            (a.detach().cpu() - b.detach()).abs().max().item()
            for a, b in zip(single.parameters(), cpu.parameters())
        ),
        "sharded": max(
            (a.detach().cpu() - b.detach()).abs().max().item()
            for a, b in zip(sharded.parameters(), cpu.parameters())
        ),
    }
    results["placements"] = {
        name: [str(p) for p in s.placements] if (s := sharding_of(p)) else None
        for name, p in sharded.named_parameters()
    }
    results["shard_shapes"] = {
        name: list(cell_of(p).array.addressable_shards[0].data.shape)
        for name, p in sharded.named_parameters()
    }
    state = opt.state[sharded.fc1.weight]
    buffer = state.get("momentum_buffer", state.get("exp_avg"))
    results["state_placements"] = [str(p) for p in sharding_of(buffer).placements]
    results["batch_placements"] = [str(p) for p in sharding_of(xs).placements]
    results["fallbacks"] = torch_pjrt.metrics.as_dict()["fallbacks"]
    return results


def main():
    out = {}
    for config in sys.argv[1:]:
        mode, opt_name = config.split(":")
        out[config] = run(mode, opt_name)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
