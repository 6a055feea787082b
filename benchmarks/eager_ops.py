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

``eager/jnp`` the ratio the op-coverage issue targets (at most 3): the median, over the
              rounds, of the eager round's time over the jnp round's just before it.

Every result of a round is kept until the round ends (fused mode would otherwise skip
the dead ones), and the default ``--repeat`` keeps the medium rows under ~150 MB.

Sizes: ``small`` (8x8) shows the fixed cost per call; ``medium`` (256x256) adds real
work. Machines are noisy: the rounds of an op alternate between the columns (CPU, jnp,
eager, fused, CPU, jnp, ...), so that a burst of load from elsewhere lands on every
column rather than on one, and the load average is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
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


def _round(fn: Callable[[], None], repeat: int, finish: Callable) -> float:
    """Microseconds per call of ``fn`` over one round of ``repeat`` calls, with Python's
    cyclic garbage collector collected before and paused during the round, as
    ``timeit`` does: its passes cost in proportion to the whole heap, so they would
    land on whichever column happens to cross a threshold."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        finish()
        return (time.perf_counter() - start) / repeat * 1e6
    finally:
        gc.enable()


def time_interleaved(variants: dict, repeat: int, rounds: int) -> dict[str, list[float]]:
    """Per-round microseconds per call of each variant (name -> (fn, finish, context)).

    Each variant is warmed up with a whole round (compile, fill caches); then the rounds
    alternate between the variants, so that a burst of load on a shared machine lands
    on all of them rather than on one column."""
    for fn, finish, context in variants.values():
        with context():
            _round(fn, repeat, finish)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (fn, finish, context) in variants.items():
            with context():
                times[name].append(_round(fn, repeat, finish))
    return times


def measure(size: int, repeat: int, rounds: int) -> dict[str, dict[str, float]]:
    """op -> column -> median us per call, and ``eager/jnp``: the median over rounds of
    the ratio within a round (the two measured back to back)."""
    g = torch.Generator().manual_seed(0)
    a_cpu, b_cpu = torch.randn(size, size, generator=g), torch.randn(size, size, generator=g)
    idx_cpu = torch.randint(0, size, (size // 2,), generator=g)
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

    def mode(name: str) -> Callable:
        return lambda: torch_pjrt.mode(name)

    cpu_ops, jax_ops = ops(torch, False), ops(jnp, True)
    a_j, b_j, i_j = (jnp.asarray(t.numpy()) for t in (a_cpu, b_cpu, idx_cpu))
    a, b, idx = a_cpu.to("pjrt"), b_cpu.to("pjrt"), idx_cpu.to("pjrt")
    cuda = torch.cuda.is_available()
    if cuda:
        a_c, b_c, i_c = a_cpu.cuda(), b_cpu.cuda(), idx_cpu.cuda()
    rows: dict[str, dict[str, float]] = {}
    for name, fn in cpu_ops.items():
        for m in ("eager", "fused"):  # the answer is right, not just fast
            with torch_pjrt.mode(m):
                np.testing.assert_allclose(
                    fn(a, b, idx).cpu().numpy(),
                    fn(a_cpu, b_cpu, idx_cpu).numpy(),
                    rtol=1e-4,
                    atol=1e-4,
                )
        variants = {
            "CPU": (keep(fn, a_cpu, b_cpu, idx_cpu), done(_none), contextlib.nullcontext),
            "jnp": (
                keep(jax_ops[name], a_j, b_j, i_j),
                done(lambda: jax.block_until_ready(kept)),
                contextlib.nullcontext,
            ),
            "eager": (keep(fn, a, b, idx), done(torch.pjrt.synchronize), mode("eager")),
            "fused": (keep(fn, a, b, idx), done(torch.pjrt.synchronize), mode("fused")),
        }
        if cuda:
            variants["CUDA"] = (
                keep(fn, a_c, b_c, i_c),
                done(torch.cuda.synchronize),
                contextlib.nullcontext,
            )
        times = time_interleaved(variants, repeat, rounds)
        rows[name] = {column: statistics.median(t) for column, t in times.items()}
        rows[name]["eager/jnp"] = statistics.median(
            e / j for e, j in zip(times["eager"], times["jnp"])
        )
    return rows


def _none() -> None:
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=500, help="calls per round")
    parser.add_argument("--rounds", type=int, default=9, help="rounds (the median is kept)")
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
                f"{r['fused']:8.1f} {r['eager/jnp']:10.2f}" + (f" {r['CUDA']:8.1f}" if cuda else "")
            )
        ratios = [r["eager/jnp"] for r in rows.values()]
        print(f"  eager/jnp: median {statistics.median(ratios):.2f}, max {max(ratios):.2f}")
    print("\nload average at end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
