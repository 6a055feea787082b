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
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import (
    parallelize_module,
)

import torch_pjrt

# the model and TorchTitan's TP plan: the example's (one definition)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "llama_distributed"))
from train import BLOCK_PLAN, ROOT_PLAN, Llama  # noqa: E402

STEPS = 10
TOL = 1e-4


def make_model() -> nn.Module:
    """The example's Llama (4 heads of 8), small."""
    return Llama(vocab=64, dim=32, heads=4, hidden=64, layers=2)


def loss_fn(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def parallelize(model: nn.Module, plan: str, world: int, compiled: bool):
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
    for block in model.layers:
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
    model = make_model()
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
