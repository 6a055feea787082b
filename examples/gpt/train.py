"""Train a small character-level GPT on the bundled corpus, then sample from it.

    python examples/gpt/train.py                  # on the pjrt device (torch_pjrt)
    python examples/gpt/train.py --device cpu     # the same run on the PyTorch CPU backend
    PJRT_DEVICE=TPU python examples/gpt/train.py  # pjrt on a TPU

The only device-specific input is ``--device``; the model and the loop are plain PyTorch.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

try:  # run as a script, the example's directory is already on sys.path
    from model import GPT, GPTConfig, generate
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from model import GPT, GPTConfig, generate

try:
    from tqdm import tqdm
except ImportError:  # the progress bar is a nicety, not a requirement
    tqdm = None

HERE = Path(__file__).resolve().parent
DEFAULT_DATA = HERE / "data" / "corpus.txt"
PROMPT = "The wind "


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="pjrt", help='torch device, e.g. "pjrt", "pjrt:0", "cpu"')
    ap.add_argument("--steps", type=int, default=300, help="training steps")
    ap.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (AdamW)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--sample-tokens", type=int, default=300, help="characters to sample at the end"
    )
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU runs)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--eval-batches", type=int, default=20, help="batches for the final val loss")
    ap.add_argument("--log-every", type=int, default=10, help="steps between loss reads")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="training text file")
    ap.add_argument(
        "--compile",
        action="store_true",
        help='compile the training step with torch.compile (backend "pjrt" on pjrt)',
    )
    return ap.parse_args(argv)


def setup_device(name: str) -> torch.device:
    if name.startswith("pjrt"):
        try:
            import torch_pjrt  # noqa: F401  (registers the "pjrt" device)
        except ImportError as e:
            sys.exit(
                f"--device {name} needs the torch_pjrt package, which could not be imported "
                f"({e}).\nInstall it with `make demo` (or `pip install -e .` in the repository "
                "root), or run on another device, e.g. `--device cpu`."
            )
    device = torch.device(name)
    print(f"device: {device}")
    if device.type == "pjrt":
        backend = getattr(torch, "pjrt", None)
        if backend is not None and hasattr(backend, "get_device_name"):
            print(f"pjrt device name: {backend.get_device_name()}")
    return device


class CharTokenizer:
    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> list[int]:
        return [self.stoi[c] for c in s if c in self.stoi]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids)


def get_batch(
    data: torch.Tensor, batch_size: int, block_size: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random (input, target) windows, built on the CPU."""
    ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=gen)
    x = torch.stack([data[i : i + block_size] for i in ix.tolist()])
    y = torch.stack([data[i + 1 : i + 1 + block_size] for i in ix.tolist()])
    return x, y


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(model, data, args, gen, device) -> float:
    model.eval()
    total = torch.zeros((), device=device)
    for _ in range(args.eval_batches):
        x, y = get_batch(data, args.batch_size, args.block_size, gen)
        _, loss = model(x.to(device), y.to(device))
        total += loss
    model.train()
    return total.item() / args.eval_batches


def _compilations(device: torch.device) -> int | None:
    """XLA programs compiled so far on pjrt (torch_pjrt's metrics), None elsewhere."""
    if device.type != "pjrt":
        return None
    import torch_pjrt

    return torch_pjrt.metrics.as_dict().get("compilations", 0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = setup_device(args.device)

    text = args.data.read_text(encoding="utf-8")
    tok = CharTokenizer(text)
    data = torch.tensor(tok.encode(text), dtype=torch.long)
    n_train = int(0.9 * len(data))
    train_data, val_data = data[:n_train], data[n_train:]
    print(
        f"data: {len(text):,} chars, vocab {tok.vocab_size}, "
        f"train {len(train_data):,} / val {len(val_data):,} tokens"
    )

    cfg = GPTConfig(
        vocab_size=tok.vocab_size,
        block_size=args.block_size,
        n_layer=args.n_layer,
        n_head=args.n_head,
        n_embd=args.n_embd,
    )
    model = GPT(cfg).to(device)
    print(
        f"model: {model.num_params() / 1e6:.2f}M params, {cfg.n_layer} layers, "
        f"{cfg.n_head} heads, d_model {cfg.n_embd}, block {cfg.block_size}, "
        f"batch {args.batch_size}, {args.steps} steps"
    )
    # compiled: the learning rate is a tensor updated in place, and the optimizer keeps
    # its step count on the device (capturable), so the schedule recompiles nothing
    lr = torch.tensor(args.lr, device=device) if args.compile else args.lr
    opt = torch.optim.AdamW(
        model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, capturable=args.compile
    )
    warmup = max(1, min(50, args.steps // 10))

    def train_step(x, y):
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    if args.compile:
        train_step = torch.compile(
            train_step, backend="pjrt" if device.type == "pjrt" else "inductor"
        )

    gen = torch.Generator().manual_seed(args.seed)  # batch sampling, always on the CPU
    tokens_per_step = args.batch_size * args.block_size
    first_loss = last_loss = float("nan")
    steps = range(args.steps)
    bar = tqdm(steps, desc="train", unit="step", dynamic_ncols=True) if tqdm else steps

    model.train()
    t0 = t_log = time.perf_counter()
    step_log = -1
    for step in bar:
        for group in opt.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr_at(step, args.steps, args.lr, warmup))
            else:
                group["lr"] = lr_at(step, args.steps, args.lr, warmup)
        x, y = get_batch(train_data, args.batch_size, args.block_size, gen)
        loss = train_step(x.to(device), y.to(device))

        # Reading the loss synchronises with the device, so only do it every few steps.
        if step == 0 or (step + 1) % args.log_every == 0 or step == args.steps - 1:
            last_loss = loss.item()
            if step == 0:
                first_loss = last_loss
            now = time.perf_counter()
            tok_s = (step - step_log) * tokens_per_step / max(now - t_log, 1e-9)
            t_log, step_log = now, step
            if tqdm:
                bar.set_postfix(loss=f"{last_loss:.3f}", tok_s=f"{tok_s:,.0f}")
            else:
                print(f"step {step + 1}/{args.steps} loss {last_loss:.3f} tok/s {tok_s:,.0f}")
    train_time = time.perf_counter() - t0
    if tqdm:
        bar.close()

    val_loss = evaluate(model, val_data, args, gen, device)
    print(
        f"train: {args.steps} steps in {train_time:.1f}s "
        f"({1000 * train_time / max(1, args.steps):.0f} ms/step, "
        f"{args.steps * tokens_per_step / train_time:,.0f} tok/s)"
    )
    print(f"loss: first {first_loss:.3f}, last {last_loss:.3f}, val {val_loss:.3f}")

    torch.manual_seed(args.seed)
    compiled_before = _compilations(device)
    t0 = time.perf_counter()
    prompt = torch.tensor([tok.encode(PROMPT)], dtype=torch.long, device=device)
    out = generate(
        model, prompt, args.sample_tokens, temperature=0.8, top_k=20, pad_token=tok.encode(" ")[0]
    )
    text = tok.decode(out[0].tolist())
    sample_time = time.perf_counter() - t0
    compiled = ""
    if compiled_before is not None:
        compiled = f", {_compilations(device) - compiled_before} XLA programs compiled"
    print(f"sample: {args.sample_tokens} characters in {sample_time:.1f}s{compiled}")
    print("-" * 72)
    print(text)
    print("-" * 72)
    return 0


if __name__ == "__main__":
    sys.exit(main())
