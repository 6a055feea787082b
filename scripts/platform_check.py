"""Numbers that say whether pjrt computes like PyTorch on the chip it runs on.

Usage::

    .venv/bin/python scripts/platform_check.py                  # the default platform
    PJRT_DEVICE=CUDA python scripts/platform_check.py --json out.json

Checks, each against a reference computed here:

- **float32 matmul precision.** A 1024x1024 float32 product on pjrt against the float64
  product on the CPU, at PyTorch's default (``"highest"``) and at ``"high"``. The
  default must be float32-accurate on every chip (relative error near 1e-6); ``"high"``
  may be TensorFloat-32 or bfloat16 passes (near 1e-3) where the chip has them.
- **convolution precision**, likewise.
- **a training step**: the GPT of ``examples/gpt`` (forward, backward; the loss and
  every gradient) on pjrt, eager and compiled, against CPU PyTorch, and CUDA PyTorch
  against the same CPU reference where PyTorch sees a CUDA GPU (the "same results as
  on CUDA" claim, measured). Gradients, not an optimizer step: Adam's first step is
  ``lr * sign(grad)`` for small gradients, which turns rounding noise into ``2 * lr``.
- **autocast**: the same forward under ``torch.autocast(dtype=torch.bfloat16)`` on pjrt
  against CPU autocast.

Exit status 1 when a check is outside its bound. Prints one line per check.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import sys

import torch

import torch_pjrt

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples" / "gpt"))
from model import GPT, GPTConfig  # noqa: E402

# float32 accuracy: a 1024-term dot product in float32 is off by ~1e-6 relative; TF32
# (10-bit mantissa) by ~1e-3. The bound sits between them.
FLOAT32_BOUND = 1e-4
STEP_BOUND = 1e-4  # loss and gradients, relative to their largest magnitude
AUTOCAST_BOUND = 2e-2  # bfloat16 has an 8-bit mantissa


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.detach().cpu().double(), ref.detach().cpu().double()
    return float((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def matmul_precision() -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(1024, 1024, generator=g), torch.randn(1024, 1024, generator=g)
    ref = a.double() @ b.double()
    out = {}
    for setting in ("highest", "high"):
        torch.set_float32_matmul_precision(setting)
        try:
            out[setting] = rel_err(a.to("pjrt") @ b.to("pjrt"), ref)
        finally:
            torch.set_float32_matmul_precision("highest")
    return out


def conv_precision() -> dict[str, float]:
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(8, 64, 32, 32, generator=g), torch.randn(128, 64, 3, 3, generator=g)
    ref = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    out = {}
    for setting in ("highest", "high"):
        torch.set_float32_matmul_precision(setting)
        try:
            y = torch.nn.functional.conv2d(x.to("pjrt"), w.to("pjrt"), padding=1)
            out[setting] = rel_err(y, ref)
        finally:
            torch.set_float32_matmul_precision("highest")
    return out


def _gpt_step(device: str, compiled: bool) -> tuple[float, torch.Tensor]:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=256, block_size=64, n_layer=2, n_head=4, n_embd=128)
    model = GPT(cfg).to(device)
    g = torch.Generator().manual_seed(2)
    x = torch.randint(0, 256, (8, 64), generator=g).to(device)
    y = torch.randint(0, 256, (8, 64), generator=g).to(device)

    def step():
        _, loss = model(x, y)
        loss.backward()
        return loss.detach()

    fn = torch.compile(step, backend="pjrt") if compiled else step
    loss = fn()
    grads = torch.cat([p.grad.reshape(-1).cpu() for p in model.parameters()])
    return float(loss), grads


def training_step() -> dict[str, float]:
    ref_loss, ref_grads = _gpt_step("cpu", compiled=False)
    out = {}
    for label, device, compiled in (
        ("pjrt eager vs CPU", "pjrt", False),
        ("pjrt compiled vs CPU", "pjrt", True),
        *((("CUDA vs CPU", "cuda", False),) if torch.cuda.is_available() else ()),
    ):
        with torch_pjrt.mode("eager") if device == "pjrt" else contextlib.nullcontext():
            loss, grads = _gpt_step(device, compiled)
        out[f"{label}: loss"] = abs(loss - ref_loss) / abs(ref_loss)
        out[f"{label}: gradients"] = rel_err(grads, ref_grads)
    return out


def autocast_forward() -> dict[str, float]:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=256, block_size=64, n_layer=2, n_head=4, n_embd=128)
    model = GPT(cfg).eval()
    x = torch.randint(0, 256, (4, 64), generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref, _ = model(x)
    model = model.to("pjrt")
    with torch.no_grad(), torch.autocast("pjrt", dtype=torch.bfloat16):
        logits, _ = model(x.to("pjrt"))
    return {"bf16 autocast logits vs CPU autocast": rel_err(logits.float(), ref.float())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=pathlib.Path, help="also write the numbers here")
    args = ap.parse_args(argv)
    torch_pjrt.init()
    print(
        f"torch {torch.__version__}, pjrt device {torch.pjrt.get_device_name()} "
        f"({torch.pjrt.device_count()} devices), CUDA PyTorch: {torch.cuda.is_available()}"
    )
    results: dict[str, float] = {}
    failed = []

    def check(name: str, value: float, bound: float | None) -> None:
        results[name] = value
        verdict = "" if bound is None else ("ok" if value <= bound else "FAIL")
        if verdict == "FAIL":
            failed.append(name)
        shown = "" if bound is None else f" (bound {bound:g})"
        print(f"  {name:45s} {value:10.3g} {verdict}{shown}")

    mm = matmul_precision()
    check("matmul rel. error, precision 'highest'", mm["highest"], FLOAT32_BOUND)
    check("matmul rel. error, precision 'high'", mm["high"], None)
    conv = conv_precision()
    check("conv2d rel. error, precision 'highest'", conv["highest"], FLOAT32_BOUND)
    check("conv2d rel. error, precision 'high'", conv["high"], None)
    for name, value in training_step().items():
        # CUDA PyTorch's own distance from the CPU is shown, not judged
        check(name, value, None if name.startswith("CUDA") else STEP_BOUND)
    for name, value in autocast_forward().items():
        check(name, value, AUTOCAST_BOUND)
    if args.json:
        args.json.write_text(json.dumps({"results": results, "failed": failed}, indent=1))
    print("all checks within bounds" if not failed else f"outside bounds: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
