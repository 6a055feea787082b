"""TorchTitan-style Llama pretraining on pjrt: FSDP2 + TP + compile + DCP checkpoints.

Launch one process per device with torchrun (here: 4 processes on the CPU platform)::

    JAX_PLATFORMS=cpu PJRT_DEVICE=CPU python -m torch.distributed.run --nproc_per_node 4 \\
        examples/llama_distributed/train.py --dp 2 --tp 2 --steps 20 \\
        --checkpoint-dir /tmp/llama_ckpt --checkpoint-every 10

    # later, or after a crash: continue from the newest complete checkpoint
    ... train.py --dp 2 --tp 2 --steps 40 --checkpoint-dir /tmp/llama_ckpt --resume

What it does, in TorchTitan's order:

1. ``dist.init_process_group("pjrt")`` and a 2-D ``DeviceMesh`` ``("dp", "tp")`` on
   device ``"pjrt"``; ``dp * tp`` must equal the number of processes.
2. A Llama (token embedding, blocks of RMSNorm + causal attention with RoPE and separate
   q/k/v projections + RMSNorm + SwiGLU feed-forward, final norm, output head), built on
   the CPU from ``--seed`` and moved to pjrt.
3. Tensor parallel over ``tp`` (``parallelize_module``): TorchTitan's plan, with
   sequence-parallel norms and residual stream, q/k/v/gate/up split colwise and o/down
   rowwise, the embedding rowwise and the head colwise.
4. ``torch.compile(backend="pjrt")`` of the whole model (``model.compile``), then FSDP2
   over ``dp`` (``fully_shard`` on each block and on the root). NOTE: PyTorch 2.13 cannot
   compile the FSDP2 x TP model (AOTAutograd: "Mixing fake modes NYI", on the CPU with
   gloo too), so the default ``--compile auto`` compiles when ``dp == 1`` or ``tp == 1``
   and runs eager on a 2-D mesh; ``--compile`` on a 2-D mesh is refused.
5. AdamW with linear warm-up and cosine decay (``LambdaLR``), on a synthetic token
   stream made in the script (a random Markov chain: every token has 4 likely
   successors, so the loss falls from ln(vocab) towards ln(4)). The batch of step ``s``
   depends only on ``--seed`` and ``s``: a resumed run sees the same data.
6. Every ``--checkpoint-every`` steps, ``torch.distributed.checkpoint`` saves the model
   and optimizer (``get_state_dict``: sharded DTensors, each rank writes its shards), the
   LR scheduler and the step to ``CHECKPOINT_DIR/step-NNNNNN``. ``--resume`` loads the
   newest one with a ``.metadata`` file (DCP writes it last, so a save cut short is
   skipped) through ``set_state_dict`` and continues: its losses equal, bit for bit, an
   uninterrupted run's (tests/test_example_distributed.py checks it).

Rank 0 logs one line per step: ``step S/N loss L lr LR step_ms T tok/s R`` (``L`` the
loss averaged over the data-parallel ranks, 9 significant digits, which round-trip a
float32 exactly; ``tok/s`` the whole job's tokens, ``dp * batch * seq_len``, per second).
``--stop-after K`` ends the run after step K as if it were interrupted (the schedule
still spans ``--steps``). Only the CPU platform has been run; see docs/distributed.md for
multi-host TPU and Trainium launches.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

log = logging.getLogger("llama_distributed")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="total training steps")
    ap.add_argument("--dp", type=int, default=None, help="data-parallel (FSDP2) size")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    ap.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help='torch.compile(backend="pjrt") the model (default: unless dp > 1 and tp > 1)',
    )
    ap.add_argument("--checkpoint-dir", type=Path, default=None)
    ap.add_argument("--checkpoint-every", type=int, default=0, help="0: no checkpoints")
    ap.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    ap.add_argument("--stop-after", type=int, default=None, help="stop after this step")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps (default steps/10)")
    ap.add_argument("--batch-size", type=int, default=4, help="sequences per data-parallel rank")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=192, help="feed-forward width")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--stream-tokens", type=int, default=1 << 16, help="synthetic data size")
    args = ap.parse_args(argv)
    if args.checkpoint_every and args.checkpoint_dir is None:
        ap.error("--checkpoint-every needs --checkpoint-dir")
    if args.resume and args.checkpoint_dir is None:
        ap.error("--resume needs --checkpoint-dir")
    return args


# --- the model --------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x, positions):
    """Rotary position embedding of (batch, heads, seq, head_dim)."""
    half = x.shape[-1] // 2
    freqs = 1.0 / (10000 ** (torch.arange(half, device=x.device, dtype=x.dtype) / half))
    angles = positions[:, None].to(x.dtype) * freqs[None, :]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    """Causal self-attention. Shapes come from the (maybe local) tensors, so the same
    code runs whole or with its heads split across tensor-parallel ranks."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.head_dim = dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (
            w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv)
        )
        pos = torch.arange(s, device=x.device)
        q, k = rotary(q, pos), rotary(k, pos)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = Attention(dim, heads)
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, hidden: int, layers: int):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(TransformerBlock(dim, heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


# --- parallelism ------------------------------------------------------------------------

# TorchTitan's plan: the residual stream is sequence-sharded (Shard(1)) between blocks,
# norms run on their sequence shard, attention and feed-forward gather it
ROOT_PLAN = {
    "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
    "norm": SequenceParallel(),
    "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
}
_GATHER = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
BLOCK_PLAN = {
    "attention_norm": SequenceParallel(),
    "attention": _GATHER,
    "attention.wq": ColwiseParallel(),
    "attention.wk": ColwiseParallel(),
    "attention.wv": ColwiseParallel(),
    "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
    "ffn_norm": SequenceParallel(),
    "feed_forward": _GATHER,
    "feed_forward.w1": ColwiseParallel(),
    "feed_forward.w3": ColwiseParallel(),
    "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
}


def check_sizes(args: argparse.Namespace, world: int) -> None:
    """Raise ValueError naming the first size that does not fit the mesh."""
    if args.dp * args.tp != world:
        raise ValueError(f"--dp {args.dp} x --tp {args.tp} must equal the {world} processes")
    if args.dim % args.heads or (args.dim // args.heads) % 2:
        raise ValueError(f"--dim {args.dim} / --heads {args.heads} must be an even head size")
    for name in ("heads", "hidden", "vocab", "seq_len"):
        if getattr(args, name) % args.tp:
            raise ValueError(f"--{name.replace('_', '-')} must be a multiple of --tp {args.tp}")


def parallelize(model: Llama, mesh: DeviceMesh, compile_model: bool) -> Llama:
    """TP over mesh["tp"], then compile, then FSDP2 over mesh["dp"] (in place)."""
    tp_mesh, dp_mesh = mesh["tp"], mesh["dp"]
    if tp_mesh.size() > 1:
        parallelize_module(model, tp_mesh, ROOT_PLAN)
        for layer in model.layers:
            parallelize_module(layer, tp_mesh, BLOCK_PLAN)
    if compile_model:
        # NOTE: the whole model: compiling each TP block alone fails in PyTorch 2.13's
        # DTensor backward (Redistribute.backward gets a plain tensor). model.compile
        # keeps the parameter names (torch.compile(model) would add "_orig_mod.")
        model.compile(backend="pjrt")
    if dp_mesh.size() > 1:
        for layer in model.layers:
            fully_shard(layer, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
    return model


# --- data -------------------------------------------------------------------------------


def synthetic_stream(vocab: int, length: int, seed: int) -> torch.Tensor:
    """A token stream from a random Markov chain: each token has 4 likely successors."""
    g = torch.Generator().manual_seed(seed)
    successors = torch.randint(0, vocab, (vocab, 4), generator=g).tolist()
    picks = torch.randint(0, 4, (length,), generator=g).tolist()
    tokens, tok = [], 0
    for pick in picks:
        tok = successors[tok][pick]
        tokens.append(tok)
    return torch.tensor(tokens, dtype=torch.long)


def batch_for_step(stream, step: int, seed: int, dp: int, dp_rank: int, batch: int, seq: int):
    """This data-parallel rank's (inputs, targets) of ``step``: windows of the stream at
    offsets drawn from (seed, step) alone, so a resumed run reads the same batches."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, stream.numel() - seq - 1, (dp * batch,), generator=g)
    starts = starts[dp_rank * batch : (dp_rank + 1) * batch]
    windows = stream[starts[:, None] + torch.arange(seq + 1)]
    return windows[:, :-1], windows[:, 1:]


def lr_lambda(steps: int, warmup: int):
    """Linear warm-up to the peak, then cosine decay to a tenth of it."""

    def factor(step: int) -> float:  # LambdaLR's step: 0 for the first training step
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


# --- checkpoints ------------------------------------------------------------------------


class TrainState(Stateful):
    """What a checkpoint holds; DCP calls state_dict() on save and load_state_dict() on
    load. Model and optimizer go through get_state_dict/set_state_dict, which give the
    sharded (DTensor) layout with parameter-name keys, independent of FSDP2/TP wrapping."""

    def __init__(self, model, optimizer, scheduler):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.step = 0

    def state_dict(self):
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {
            "model": model_sd,
            "optimizer": optim_sd,
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
        }

    def load_state_dict(self, state):
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
        )
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = int(state["step"])


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete ``step-NNNNNN`` folder (DCP writes ``.metadata`` last)."""
    if not root.is_dir():
        return None
    done = [p for p in root.iterdir() if re.fullmatch(r"step-\d+", p.name)]
    done = [p for p in done if (p / ".metadata").exists()]
    return max(done, key=lambda p: int(p.name[5:]), default=None)


# --- training ---------------------------------------------------------------------------


def train(args: argparse.Namespace) -> list[float]:
    world = dist.get_world_size()
    args.dp = args.dp or world // args.tp
    check_sizes(args, world)
    two_d = args.dp > 1 and args.tp > 1
    if args.compile and two_d:
        raise ValueError(
            "--compile with dp > 1 and tp > 1: PyTorch 2.13 cannot compile an FSDP2 x TP "
            "model (AOTAutograd: 'Mixing fake modes NYI'); use --no-compile, or dp or tp 1"
        )
    compile_model = not two_d if args.compile is None else args.compile
    mesh = init_device_mesh("pjrt", (args.dp, args.tp), mesh_dim_names=("dp", "tp"))
    dp_rank = mesh["dp"].get_local_rank()

    torch.manual_seed(args.seed)
    model = Llama(args.vocab, args.dim, args.heads, args.hidden, args.layers).to("pjrt")
    model = parallelize(model, mesh, compile_model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    warmup = args.warmup if args.warmup is not None else max(1, args.steps // 10)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(args.steps, warmup))
    state = TrainState(model, optimizer, scheduler)

    if args.resume:
        path = latest_checkpoint(args.checkpoint_dir)
        if path is None:
            log.info("no checkpoint in %s: starting from step 0", args.checkpoint_dir)
        else:
            dcp.load({"train": state}, checkpoint_id=str(path))
            log.info("resumed from %s (step %d)", path, state.step)

    stream = synthetic_stream(args.vocab, args.stream_tokens, args.seed)
    log.info(
        "world %d: dp %d x tp %d, %s, %.2fM parameters, %d tokens per step",
        world,
        args.dp,
        args.tp,
        "compiled" if compile_model else "eager",
        sum(p.numel() for p in model.parameters()) / 1e6,  # a DTensor's numel is global
        args.dp * args.batch_size * args.seq_len,
    )
    last = args.steps if args.stop_after is None else min(args.steps, args.stop_after)
    losses = []
    while state.step < last:
        start = time.perf_counter()
        inputs, targets = batch_for_step(
            stream, state.step, args.seed, args.dp, dp_rank, args.batch_size, args.seq_len
        )
        logits = model(inputs.to("pjrt"))
        loss = F.cross_entropy(logits.flatten(0, 1), targets.to("pjrt").flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        lr = scheduler.get_last_lr()[0]
        scheduler.step()
        state.step += 1
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)  # tensor-parallel ranks agree already
        value = mean.item()  # waits for the step
        seconds = time.perf_counter() - start
        losses.append(value)
        tokens = args.dp * args.batch_size * args.seq_len
        log.info(
            "step %d/%d loss %.9g lr %.3g step_ms %.1f tok/s %.0f",
            state.step,
            args.steps,
            value,
            lr,
            seconds * 1e3,
            tokens / seconds,
        )
        if args.checkpoint_every and state.step % args.checkpoint_every == 0:
            path = args.checkpoint_dir / f"step-{state.step:06d}"
            start = time.perf_counter()
            dcp.save({"train": state}, checkpoint_id=str(path))
            log.info("saved %s in %.1f s", path, time.perf_counter() - start)
    return losses


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if "WORLD_SIZE" not in os.environ:  # a plain `python train.py`: a world of one
        os.environ.update(WORLD_SIZE="1", RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
    dist.init_process_group("pjrt")
    logging.basicConfig(
        level=logging.INFO if dist.get_rank() == 0 else logging.WARNING,
        format="%(message)s",
    )
    try:
        train(args)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
