"""Per-op host cost: CPU PyTorch, raw ``jax.numpy``, pjrt eager and pjrt fused, in one run.

Usage::

    .venv/bin/python benchmarks/eager_ops.py
    .venv/bin/python benchmarks/eager_ops.py --repeat 2000 --json /tmp/ops.json

Each row is one op at one size, called ``--repeat`` times in a loop; the time per call
is the median over ``--rounds`` rounds, in microseconds. Columns:

``CPU``       CPU PyTorch (``torch.set_num_threads(1)``), synchronous.
``jnp``       the same op in raw ``jax.numpy`` on JAX's default device, each call
              dispatched and left to run asynchronously (the round ends with
              ``block_until_ready``): the floor for a design that dispatches one JAX
              call per op.
``eager``     pjrt in ``torch_pjrt.mode("eager")``: one cached XLA program per op,
              asynchronous (the round ends with ``torch.pjrt.synchronize()``).
``fused``     pjrt in ``torch_pjrt.mode("fused")``: each op recorded; a round's
              recording runs as one program at the closing ``synchronize()``.
``CUDA``      CUDA PyTorch eager, asynchronous (the round ends with
              ``torch.cuda.synchronize()``); only where PyTorch sees a CUDA GPU.

Every result of a round is kept until the round ends (fused mode would otherwise skip
the dead ones), and the default ``--repeat`` keeps the medium rows under ~150 MB.
``eager/jnp`` the ratio the op-coverage issue targets (at most 3).

Sizes: ``small`` (8x8) shows the fixed cost per call; ``medium`` (256x256) adds real
work. Machines are noisy: the load average is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch

import torch_pjrt

SIZES = {"small": 8, "medium": 256}


def ops(xp, is_jax: bool) -> dict[str, Callable]:
    """name -> f(a, b, idx): the same op in torch or jax.numpy."""
    if is_jax:
        return {
            "add": lambda a, b, i: a + b,
            "mul": lambda a, b, i: a * b,
            "mm": lambda a, b, i: a @ b,
            "relu": lambda a, b, i: jax.nn.relu(a),
            "sum": lambda a, b, i: a.sum(),
            "index": lambda a, b, i: a[i],
        }
    return {
        "add": lambda a, b, i: a + b,
        "mul": lambda a, b, i: a * b,
        "mm": lambda a, b, i: a @ b,
        "relu": lambda a, b, i: torch.relu(a),
        "sum": lambda a, b, i: a.sum(),
        "index": lambda a, b, i: a[i],
    }


def time_rounds(fn: Callable[[], None], repeat: int, rounds: int, finish: Callable) -> float:
    """Median microseconds per call of ``fn`` over ``rounds`` rounds of ``repeat`` calls."""
    for _ in range(repeat):  # warm up with a whole round: compile, fill caches
        fn()
    finish()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        finish()
        times.append((time.perf_counter() - start) / repeat * 1e6)
    return statistics.median(times)


def measure(size: int, repeat: int, rounds: int) -> dict[str, dict[str, float]]:
    g = torch.Generator().manual_seed(0)
    a_cpu, b_cpu = torch.randn(size, size, generator=g), torch.randn(size, size, generator=g)
    idx_cpu = torch.randint(0, size, (size // 2,), generator=g)
    rows: dict[str, dict[str, float]] = {}
    # every result of a round is kept until the round ends, so that none is dead code
    # (fused mode would otherwise compute only the last)
    kept: list = []

    def keep(fn, *args):
        def call():
            kept.append(fn(*args))

        return call

    def done(finish: Callable) -> Callable:
        def run():
            finish()
            kept.clear()

        return run

    cpu_ops = ops(torch, False)
    a_j, b_j, i_j = (jnp.asarray(t.numpy()) for t in (a_cpu, b_cpu, idx_cpu))
    jax_ops = ops(jnp, True)
    for name in cpu_ops:
        rows[name] = {
            "CPU": time_rounds(
                keep(cpu_ops[name], a_cpu, b_cpu, idx_cpu), repeat, rounds, done(_none)
            ),
            "jnp": time_rounds(
                keep(jax_ops[name], a_j, b_j, i_j),
                repeat,
                rounds,
                done(lambda: jax.block_until_ready(kept)),
            ),
        }
    a, b, idx = a_cpu.to("pjrt"), b_cpu.to("pjrt"), idx_cpu.to("pjrt")
    for mode in ("eager", "fused"):
        with torch_pjrt.mode(mode):
            for name, fn in cpu_ops.items():
                rows[name][mode] = time_rounds(
                    keep(fn, a, b, idx), repeat, rounds, done(torch.pjrt.synchronize)
                )
                # the answer is right, not just fast
                np.testing.assert_allclose(
                    fn(a, b, idx).cpu().numpy(),
                    fn(a_cpu, b_cpu, idx_cpu).numpy(),
                    rtol=1e-4,
                    atol=1e-4,
                )
    if torch.cuda.is_available():
        a, b, idx = a_cpu.cuda(), b_cpu.cuda(), idx_cpu.cuda()
        for name, fn in cpu_ops.items():
            rows[name]["CUDA"] = time_rounds(
                keep(fn, a, b, idx), repeat, rounds, done(torch.cuda.synchronize)
            )
    return rows


def _none() -> None:
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=500, help="calls per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (the median is kept)")
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(
        f"torch {torch.__version__}, jax {jax.__version__}, pjrt device "
        f"{torch.pjrt.get_device_name()}, {os.cpu_count()} CPUs; load average at start: "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    results = {}
    for label, size in SIZES.items():
        rows = measure(size, args.repeat, args.rounds)
        results[label] = rows
        print(f"\n{label} ({size}x{size} float32), median us per call")
        cuda = torch.cuda.is_available()
        print(
            f"  {'op':8s} {'CPU':>8s} {'jnp':>8s} {'eager':>8s} {'fused':>8s} {'eager/jnp':>10s}"
            + (f" {'CUDA':>8s}" if cuda else "")
        )
        for name, r in rows.items():
            print(
                f"  {name:8s} {r['CPU']:8.1f} {r['jnp']:8.1f} {r['eager']:8.1f} "
                f"{r['fused']:8.1f} {r['eager'] / r['jnp']:10.2f}"
                + (f" {r['CUDA']:8.1f}" if cuda else "")
            )
        ratios = [r["eager"] / r["jnp"] for r in rows.values()]
        print(f"  eager/jnp: median {statistics.median(ratios):.2f}, max {max(ratios):.2f}")
    print("\nload average at end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
