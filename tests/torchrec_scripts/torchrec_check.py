"""TorchRec on pjrt against the CPU, in a process of its own (importing torchrec loads
fbgemm's operator library). Prints one JSON line of the largest differences found:

- ``KeyedJaggedTensor`` on pjrt: ``to_dict``, ``permute``, ``split``, ``lengths`` and
  ``offsets`` equal to the CPU's;
- ``EmbeddingBagCollection`` (sum and mean pooling, and a weighted one): forward values
  and the weights' gradients;
- a small DLRM (torchrec.models.dlrm: dense MLP, embedding bags, interaction, over-arch)
  trained 20 steps with Adagrad: each step's loss and the final parameters.
"""

from __future__ import annotations

import copy
import json

import torch
import torchrec
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.models.dlrm import DLRM

from torch_pjrt import metrics

B, D, KEYS = 8, 8, ["f0", "f1", "f2"]
ROWS = [20, 25, 30]


def batches(steps: int, weighted: bool = False) -> list[tuple]:
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(steps):
        lengths = torch.randint(0, 4, (len(KEYS) * B,), generator=g)
        values = torch.cat(
            [torch.randint(0, ROWS[i // B], (int(n),), generator=g) for i, n in enumerate(lengths)]
        )
        weights = torch.rand(len(values), generator=g) if weighted else None
        dense = torch.randn(B, 5, generator=g)
        out.append(
            (dense, lengths, values, weights, torch.randint(0, 2, (B,), generator=g).float())
        )
    return out


def kjt(lengths, values, weights, device) -> KeyedJaggedTensor:
    return KeyedJaggedTensor.from_lengths_sync(
        keys=KEYS,
        values=values.to(device),
        lengths=lengths.to(device),
        weights=None if weights is None else weights.to(device),
    )


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.device.type == "pjrt" and b.device.type == "cpu", (a.device, b.device)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    return (a.cpu().double() - b.double()).abs().max().item() if a.numel() else 0.0


def jagged() -> float:
    _, lengths, values, weights, _ = batches(1, weighted=True)[0]
    on, off = kjt(lengths, values, weights, "pjrt"), kjt(lengths, values, weights, "cpu")
    worst = max(diff(on.lengths(), off.lengths()), diff(on.offsets(), off.offsets()))
    for key in KEYS:
        a, b = on.to_dict()[key], off.to_dict()[key]
        worst = max(worst, diff(a.values(), b.values()), diff(a.lengths(), b.lengths()))
        worst = max(worst, diff(a.weights(), b.weights()))
    a, b = on.permute([2, 0, 1]), off.permute([2, 0, 1])
    assert a.keys() == b.keys() == ["f2", "f0", "f1"]
    worst = max(worst, diff(a.values(), b.values()), diff(a.lengths(), b.lengths()))
    for a, b in zip(on.split([1, 2]), off.split([1, 2]), strict=True):
        assert a.keys() == b.keys()
        worst = max(worst, diff(a.values(), b.values()), diff(a.weights(), b.weights()))
    return worst


def tables(weighted: bool = False) -> list[EmbeddingBagConfig]:
    """Sum, mean and sum pooling (PyTorch weighs samples in sum pooling only)."""
    mean = torchrec.PoolingType.SUM if weighted else torchrec.PoolingType.MEAN
    pooling = [torchrec.PoolingType.SUM, mean, torchrec.PoolingType.SUM]
    return [
        EmbeddingBagConfig(
            name=f"t{i}",
            embedding_dim=D,
            num_embeddings=ROWS[i],
            feature_names=[key],
            pooling=pooling[i],
        )
        for i, key in enumerate(KEYS)
    ]


def embedding_bags(weighted: bool) -> float:
    torch.manual_seed(0)
    cpu = EmbeddingBagCollection(
        tables=tables(weighted), is_weighted=weighted, device=torch.device("cpu")
    )
    on = copy.deepcopy(cpu).to("pjrt")
    _, lengths, values, weights, _ = batches(1, weighted=weighted)[0]
    a, b = on(kjt(lengths, values, weights, "pjrt")), cpu(kjt(lengths, values, weights, "cpu"))
    assert a.keys() == b.keys() == KEYS
    worst = diff(a.values(), b.values())
    (a.values() * torch.arange(a.values().shape[1], device="pjrt")).sum().backward()
    (b.values() * torch.arange(b.values().shape[1])).sum().backward()
    for p, q in zip(on.parameters(), cpu.parameters(), strict=True):
        worst = max(worst, diff(p.grad, q.grad))
    return worst


def dlrm() -> dict:
    torch.manual_seed(0)
    model = DLRM(
        embedding_bag_collection=EmbeddingBagCollection(
            tables=tables(), device=torch.device("cpu")
        ),
        dense_in_features=5,
        dense_arch_layer_sizes=[16, D],
        over_arch_layer_sizes=[16, 1],
    )
    data = batches(20)

    def train(model, device) -> list[float]:
        optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)
        losses = []
        for dense, lengths, values, _, label in data:
            optimizer.zero_grad()
            logits = model(dense.to(device), kjt(lengths, values, None, device)).squeeze(-1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, label.to(device))
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses

    on, cpu = copy.deepcopy(model).to("pjrt"), copy.deepcopy(model)
    metrics.reset()
    on_losses, cpu_losses = train(on, "pjrt"), train(cpu, "cpu")
    counters = metrics.as_dict()
    return {
        "steps": len(on_losses),
        "loss": max(abs(a - b) for a, b in zip(on_losses, cpu_losses, strict=True)),
        "params": max(
            diff(p.detach(), q.detach())
            for p, q in zip(on.parameters(), cpu.parameters(), strict=True)
        ),
        "first_loss": on_losses[0],
        "last_loss": on_losses[-1],
        "fallbacks": counters["fallbacks"],
        "compilations": counters["compilations"],
    }


if __name__ == "__main__":
    result = {
        "jagged": jagged(),
        "ebc": embedding_bags(weighted=False),
        "ebc_weighted": embedding_bags(weighted=True),
        "dlrm": dlrm(),
    }
    print("RESULT " + json.dumps(result), flush=True)
