"""Train a small CNN on pjrt, then export it twice: a StableHLO directory that a
process with only jax and numpy serves (serve_jax.py), and LiteRT files (float32 and
dynamic-range int8) for phones and embedded boards. docs/export.md walks through it.

    python examples/export/train_and_export.py [--steps 150] [--out examples/export/out]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.export import Dim, export

import torch_pjrt.export

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model import QuadrantNet, batch  # noqa: E402


def accuracy(run, images, labels) -> float:
    return (run(images).argmax(-1).cpu() == labels.cpu()).float().mean().item()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out")
    args = ap.parse_args(argv)

    # 1. train on pjrt: plain PyTorch
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(0)
    model = QuadrantNet().to("pjrt")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(args.steps):
        images, labels = batch(64, data, device="pjrt")
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}")
    model.eval()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), args.out / "classifier.pt")

    test_images, test_labels = batch(512, torch.Generator().manual_seed(1))
    with torch.no_grad():
        trained = accuracy(model, test_images.to("pjrt"), test_labels)
    print(f"pjrt model            accuracy {trained:.3f}")

    # 2. StableHLO: any batch size, for the CPU and for GPUs (served by serve_jax.py)
    example = torch.zeros(2, 1, 16, 16, device="pjrt")
    program = export(model, (example,), dynamic_shapes={"x": {0: Dim("batch", max=1024)}})
    saved = torch_pjrt.export.save(program, args.out / "classifier", platforms=("cpu", "cuda"))
    loaded = torch_pjrt.export.load(saved)
    print(f"StableHLO ({saved})  accuracy {accuracy(loaded, test_images, test_labels):.3f}")

    # 3. LiteRT: float32, and int8 weights with activations quantized at run time
    for name, quantize in (("classifier.tflite", None), ("classifier-int8.tflite", "dynamic_int8")):
        path = torch_pjrt.export.to_litert(model, (example,), args.out / name, quantize=quantize)
        tflite = torch_pjrt.export.load_litert(path)
        got = torch.cat([tflite(test_images[i : i + 2]) for i in range(0, 512, 2)])
        with torch.no_grad():
            expected = model(test_images.to("pjrt")).cpu()
        print(
            f"LiteRT {name:<23} accuracy {accuracy(lambda _: got, None, test_labels):.3f}  "
            f"largest logit difference {(got - expected).abs().max().item():.2e}  "
            f"{path.stat().st_size} bytes"
        )


if __name__ == "__main__":
    main()
