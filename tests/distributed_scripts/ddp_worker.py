"""Run under torchrun: DistributedDataParallel on pjrt against single-process training.

Usage: python -m torch.distributed.run --nproc_per_node N ddp_worker.py [CASE,CASE,...]

Every rank builds the same models from a seed and trains them for ``STEPS`` steps with
``DistributedDataParallel`` over the pjrt process group, each rank on its own shard of a
fixed global batch. Every rank also trains a copy of each model on the CPU, in one
process, on the whole batch. The per-step losses (the ranks' losses all-reduced to their
mean) and the final parameters must agree within ``TOL``. Prints one ``DDP OK`` line per
case and rank with the largest differences measured.
"""

from __future__ import annotations

import copy
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

# RMSNorm and rotary embeddings: the distributed example's (one definition)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "llama_distributed"))
from train import RMSNorm, rotary  # noqa: E402

STEPS = 10
TOL = 1e-4


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 5)
        )

    def forward(self, x):
        return self.net(x)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.heads = heads
        self.attn_norm = RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.mlp_norm = RMSNorm(dim)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        pos = torch.arange(s, device=x.device)
        q, k = rotary(q, pos), rotary(k, pos)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, d))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class TinyLlama(nn.Module):
    def __init__(self, vocab=64, dim=32, heads=4, hidden=64, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def mlp_case(g):
    x = torch.randn(16, 12, generator=g)
    y = torch.randint(0, 5, (16,), generator=g)

    def loss_fn(model, batch):
        xb, yb = batch
        return F.cross_entropy(model(xb), yb)

    return MLP(), (x, y), loss_fn


def llama_case(g):
    tokens = torch.randint(0, 64, (8, 17), generator=g)

    def loss_fn(model, batch):
        (t,) = batch
        logits = model(t[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t[:, 1:].reshape(-1))

    return TinyLlama(), (tokens,), loss_fn


# name -> (case, optimizer, DDP keyword arguments, comm hook)
CASES = {
    "mlp_sgd": (mlp_case, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), {}, None),
    # small buckets: several allreduce calls per step
    "mlp_sgd_buckets": (
        mlp_case,
        lambda p: torch.optim.SGD(p, lr=0.1),
        {"bucket_cap_mb": 0.002},
        None,
    ),
    # gradients are views into the flat buckets that allreduce writes
    "mlp_adamw_bucket_view": (
        mlp_case,
        lambda p: torch.optim.AdamW(p, lr=1e-2),
        {"gradient_as_bucket_view": True, "bucket_cap_mb": 0.002},
        None,
    ),
    "llama_adamw": (llama_case, lambda p: torch.optim.AdamW(p, lr=3e-3), {}, None),
    # a comm hook: the gradients go through dist.all_reduce(async_op=True).get_future()
    "llama_adamw_hook": (
        llama_case,
        lambda p: torch.optim.AdamW(p, lr=3e-3),
        {},
        default_hooks.allreduce_hook,
    ),
}


def shard(batch, rank: int, world: int):
    n = batch[0].shape[0]
    assert n % world == 0, (n, world)
    per = n // world
    return tuple(t[rank * per : (rank + 1) * per] for t in batch)


def run_case(name: str, rank: int, world: int, dev) -> tuple[float, float, float]:
    make, make_opt, ddp_kwargs, hook = CASES[name]
    torch.manual_seed(1234)
    g = torch.Generator().manual_seed(5678)
    model, batch, loss_fn = make(g)
    reference = copy.deepcopy(model)
    ref_opt = make_opt(reference.parameters())

    # rank-dependent initial weights: DDP's construction must broadcast rank 0's
    pjrt_model = copy.deepcopy(model)
    if rank:
        with torch.no_grad():
            for p in pjrt_model.parameters():
                p.add_(float(rank))
    pjrt_model = pjrt_model.to(dev)
    ddp = DDP(pjrt_model, **ddp_kwargs)
    if hook is not None:
        ddp.register_comm_hook(None, hook)
    opt = make_opt(ddp.parameters())
    buckets = None
    local = tuple(t.to(dev) for t in shard(batch, rank, world))

    start = time.perf_counter()
    loss_diff = 0.0
    for step in range(STEPS):
        opt.zero_grad()
        loss = loss_fn(ddp, local)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)

        ref_opt.zero_grad()
        ref_loss = loss_fn(reference, batch)
        ref_loss.backward()
        ref_opt.step()
        loss_diff = max(loss_diff, abs(mean.item() - ref_loss.item()))
        if step == 1:  # DDP rebuilds its buckets in the second step's forward
            buckets = len(ddp.reducer._get_zeros_like_grad_buckets())
            if "bucket_cap_mb" in ddp_kwargs and buckets < 2:
                raise AssertionError(f"{name}: expected several gradient buckets, got {buckets}")
    seconds = time.perf_counter() - start

    param_diff = 0.0
    for (pname, p), (_, r) in zip(
        pjrt_model.named_parameters(), reference.named_parameters(), strict=True
    ):
        assert p.device.type == "pjrt", (pname, p.device)
        param_diff = max(param_diff, (p.detach().cpu() - r.detach()).abs().max().item())
    if loss_diff > TOL or param_diff > TOL:
        raise AssertionError(
            f"{name}: DDP on pjrt differs from single-process training: losses by "
            f"{loss_diff:.3g}, parameters by {param_diff:.3g}"
        )
    return loss_diff, param_diff, seconds, buckets


def main() -> None:
    dist.init_process_group("pjrt")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("pjrt")
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else list(CASES)
    for name in names:
        loss_diff, param_diff, seconds, buckets = run_case(name, rank, world, dev)
        print(
            f"DDP OK case={name} rank={rank} world={world} loss_diff={loss_diff:.2e} "
            f"param_diff={param_diff:.2e} buckets={buckets} seconds={seconds:.1f}",
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
