"""Run under torchrun: FSDP2, tensor parallel and FSDP2 x TP on pjrt against one process.

Usage: python -m torch.distributed.run --nproc_per_node N parallel_worker.py CASE[,CASE...]

CASE is ``PLAN:EXEC``: PLAN ``fsdp`` (``fully_shard`` over every rank), ``tp``
(``parallelize_module`` over every rank: attention and MLP split colwise then rowwise,
as in Megatron and TorchTitan), or ``fsdp_tp`` (a 2-D mesh, ``dp`` x ``tp``, FSDP2 over
``dp`` on top of TP over ``tp``); EXEC ``eager`` or ``compiled`` (the model under
``torch.compile(backend="pjrt")``). Every rank also trains the same Llama-style model
in one process on the CPU, on the whole batch, with the same AdamW. The per-step losses
(the data-parallel ranks' mean) and the final parameters (gathered with
``full_tensor()``) must agree within ``TOL``. Prints one ``PARALLEL OK`` line per case
and rank with the largest differences measured.
"""

from __future__ import annotations

import copy
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

import torch_pjrt

STEPS = 10
TOL = 1e-4


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x, positions):
    """Rotary position embedding on (batch, heads, seq, head_dim)."""
    half = x.shape[-1] // 2
    freqs = 1.0 / (10000 ** (torch.arange(half, device=x.device, dtype=x.dtype) / half))
    angles = positions[:, None].to(x.dtype) * freqs[None, :]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    """Causal self-attention with rotary embeddings, written for tensor parallelism as
    in TorchTitan: separate q, k, v projections, and every shape taken from the (maybe
    local) tensors, so the same code runs whole or with its heads split across ranks."""

    def __init__(self, dim: int, head_dim: int):
        super().__init__()
        self.head_dim = head_dim
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (
            p(x).view(b, s, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v)
        )
        pos = torch.arange(s, device=x.device)
        q, k = rotary(q, pos), rotary(k, pos)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(a.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, dim: int, head_dim: int, hidden: int):
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = Attention(dim, head_dim)
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, vocab=64, dim=32, head_dim=8, hidden=64, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, head_dim, hidden) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


# TorchTitan's plan: sequence parallel norms and residual stream (Shard(1)), heads and
# hidden units split colwise then rowwise; every parameter becomes a DTensor
ROOT_PLAN = {
    "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
    "norm": SequenceParallel(),
    "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
}
GATHER = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
BLOCK_PLAN = {
    "attention_norm": SequenceParallel(),
    "attention": GATHER,
    "attention.q": ColwiseParallel(),
    "attention.k": ColwiseParallel(),
    "attention.v": ColwiseParallel(),
    "attention.o": RowwiseParallel(output_layouts=Shard(1)),
    "ffn_norm": SequenceParallel(),
    "feed_forward": GATHER,
    "feed_forward.gate": ColwiseParallel(),
    "feed_forward.up": ColwiseParallel(),
    "feed_forward.down": RowwiseParallel(output_layouts=Shard(1)),
}


def loss_fn(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def parallelize(model: Llama, plan: str, world: int, compiled: bool):
    """The model laid out for ``plan``; returns (model, data-parallel rank, dp size)."""
    if plan == "fsdp":
        mesh = init_device_mesh("pjrt", (world,), mesh_dim_names=("dp",))
        dp_mesh, tp_mesh = mesh, None
    elif plan == "tp":
        mesh = init_device_mesh("pjrt", (world,), mesh_dim_names=("tp",))
        dp_mesh, tp_mesh = None, mesh
    else:
        mesh = init_device_mesh("pjrt", (2, world // 2), mesh_dim_names=("dp", "tp"))
        dp_mesh, tp_mesh = mesh["dp"], mesh["tp"]
    if tp_mesh is not None:
        parallelize_module(model, tp_mesh, ROOT_PLAN)
    for block in model.blocks:
        if tp_mesh is not None:
            parallelize_module(block, tp_mesh, BLOCK_PLAN)
        if dp_mesh is not None:
            fully_shard(block, mesh=dp_mesh)
    if compiled:
        # NOTE: the whole model, TP hooks inside: compiling each TP block on its own
        # fails in PyTorch 2.13's DTensor backward (also on the CPU, with gloo and
        # aot_eager: grad_output reaches Redistribute.backward as a plain Tensor)
        model.compile(backend="pjrt")
    if dp_mesh is not None:
        fully_shard(model, mesh=dp_mesh)
        return model, dp_mesh.get_local_rank(), dp_mesh.size()
    return model, 0, 1


def full(p: torch.Tensor) -> torch.Tensor:
    return (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu()


def run_case(case: str, rank: int, world: int) -> tuple[float, float, float]:
    plan, execution = case.split(":")
    torch.manual_seed(1234)
    model = Llama()
    tokens = torch.randint(0, 64, (8, 17), generator=torch.Generator().manual_seed(5678))
    reference = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=3e-3)

    pjrt_model, dp_rank, dp = parallelize(
        copy.deepcopy(model).to("pjrt"), plan, world, execution == "compiled"
    )
    opt = torch.optim.AdamW(pjrt_model.parameters(), lr=3e-3)
    per = tokens.shape[0] // dp
    local = tokens[dp_rank * per : (dp_rank + 1) * per].to("pjrt")

    start = time.perf_counter()
    loss_diff = 0.0
    for _ in range(STEPS):
        opt.zero_grad()
        loss = loss_fn(pjrt_model, local)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)  # (TP ranks hold the same loss)

        ref_opt.zero_grad()
        ref_loss = loss_fn(reference, tokens)
        ref_loss.backward()
        ref_opt.step()
        loss_diff = max(loss_diff, abs(mean.item() - ref_loss.item()))
    seconds = time.perf_counter() - start
    param_diff = max(
        (full(p) - r.detach()).abs().max().item()
        for p, r in zip(pjrt_model.parameters(), reference.parameters())
    )
    tables = torch_pjrt.metrics.as_dict()
    counts = [
        sum(n for op, n in tables.get(table, {}).items() if "_c10d_functional" in op)
        for table in ("graph_eager_ops", "graph_spmd_collectives")
    ]
    if loss_diff > TOL or param_diff > TOL:
        raise AssertionError(f"{case}: loss diff {loss_diff:.3g}, parameter diff {param_diff:.3g}")
    return loss_diff, param_diff, seconds, counts


def main() -> None:
    cases = sys.argv[1].split(",")
    dist.init_process_group("pjrt")
    rank, world = dist.get_rank(), dist.get_world_size()
    for case in cases:
        # NOTE: a fresh Dynamo per case: after compiling one model, compiling the TP
        # model in the same process fails in Dynamo's fake-tensor pass (the embedding's
        # _MaskPartial keeps a real tensor); the same on the CPU with gloo (PyTorch 2.13)
        torch._dynamo.reset()
        torch_pjrt.metrics.reset()
        loss_diff, param_diff, seconds, (eager, spmd) = run_case(case, rank, world)
        print(
            f"PARALLEL OK case={case} rank={rank} world={world} loss_diff={loss_diff:.3g} "
            f"param_diff={param_diff:.3g} seconds={seconds:.1f} "
            f"graph_eager_collectives={eager} graph_spmd_collectives={spmd}",
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
