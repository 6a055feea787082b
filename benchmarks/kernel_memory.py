"""Flash attention's memory against the XLA path's, from XLA's compiled memory analysis.

Usage::

    .venv/bin/python benchmarks/kernel_memory.py                 # sequences 2048-8192
    .venv/bin/python benchmarks/kernel_memory.py --seq 1024 16384

For each sequence length: the temporary memory of the compiled forward and backward
programs of ``torch_pjrt.kernels.flash_attention`` (one batch, one head, head size 64,
causal, float32) on its two paths: ``reference`` (the XLA path: plain ``jax.numpy`` that
materializes the ``[S, S]`` scores, as the SDPA lowering does) and ``pallas`` (the
blocked kernel; on the CPU platform its interpret-mode program, whose temporaries are
the blocks). Programs are compiled, not run. Quadratic against linear is the claim.
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp

import torch_pjrt  # noqa: F401  (the platform)
from torch_pjrt.kernels import flash_attention as fa


def temp_mib(fn, *specs) -> float:
    return jax.jit(fn).lower(*specs).compile().memory_analysis().temp_size_in_bytes / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, nargs="+", default=[2048, 4096, 8192])
    ap.add_argument("--head-dim", type=int, default=64)
    args = ap.parse_args(argv)
    d = args.head_dim
    features = dict(causal=True, scale=d**-0.5, window=None, softcap=None)
    blocks = dict(block_q=128, block_k=128)
    print(f"platform {jax.devices()[0].platform}; temporary MiB of the compiled programs")
    print(f"  {'seq':>6s} {'reference fwd':>14s} {'bwd':>8s} {'pallas fwd':>11s} {'bwd':>8s}")
    for s in args.seq:
        spec = jax.ShapeDtypeStruct((1, 1, s, d), jnp.float32)
        row = []
        for impl in ("reference", "pallas"):
            row.append(
                temp_mib(
                    lambda q, k, v, impl=impl: fa._attention(
                        q, k, v, None, impl=impl, **blocks, **features
                    ),
                    spec,
                    spec,
                    spec,
                )
            )
            row.append(
                temp_mib(
                    lambda q, k, v, g, impl=impl: fa._attention_backward(
                        q, k, v, None, g, impl=impl, **blocks, **features
                    ),
                    spec,
                    spec,
                    spec,
                    spec,
                )
            )
        print(f"  {s:6d} {row[0]:14.1f} {row[1]:8.1f} {row[2]:11.1f} {row[3]:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
