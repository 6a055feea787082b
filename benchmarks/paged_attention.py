"""Paged decode attention: the kernel library's Pallas kernel against its XLA path.

Usage::

    .venv/bin/python benchmarks/paged_attention.py            # the platform JAX starts on
    .venv/bin/python benchmarks/paged_attention.py --batch 1 16 --context 128 1024

Times ``paged_attention_kv`` (the layout of pjrt's vLLM backend: keys and values side by
side, ``[blocks, Hkv, block_size, 2D]``) with ``impl="pallas"`` (our kernel: compiled
through Triton on GPU, interpreted on the CPU) and ``impl="reference"`` (plain
``jax.numpy``: a gather of each sequence's blocks, then a masked softmax, the path the
backend's ``xla`` setting takes in PyTorch ops), each jitted, for one decode token per
sequence over contexts of the given length (every sequence that long, its blocks
shuffled across a cache of twice the blocks needed). Prints the median milliseconds of a
call (after a warm-up call) and pallas / reference: below 1 the kernel pays. The
question this answers is where ``TORCH_PJRT_ATTENTION=auto`` should take the kernel
(docs/serving.md); the CPU's figures only show what interpreting costs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import torch_pjrt  # noqa: F401  (the platform)
from torch_pjrt.kernels import paged_attention as pa


def inputs(batch, context, *, heads, kv_heads, head_size, block_size, dtype, seed=0):
    rng = np.random.default_rng(seed)
    blocks = -(-context // block_size)
    num_blocks = 2 * batch * blocks + 1
    q = rng.standard_normal((batch, heads, head_size), dtype=np.float32)
    kv = rng.standard_normal((num_blocks, kv_heads, block_size, 2 * head_size), np.float32)
    tables = rng.permutation(num_blocks)[: batch * blocks].reshape(batch, blocks)
    lens = np.full((batch,), context)
    return (
        jnp.asarray(q, dtype),
        jnp.asarray(kv, dtype),
        jnp.asarray(tables, jnp.int32),
        jnp.asarray(lens, jnp.int32),
    )


def median_ms(fn, args, repeat: int) -> float:
    jax.block_until_ready(fn(*args))  # (compiles)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--context", type=int, nargs="+", default=[256, 2048])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-size", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args(argv)
    platform = jax.devices()[0].platform
    interpret = platform == "cpu"
    scale = args.head_size**-0.5
    kernel = jax.jit(lambda *a: pa.paged_attention_kv_pallas(*a, scale=scale, interpret=interpret))
    reference = jax.jit(lambda *a: pa.paged_attention_kv_reference(*a, scale=scale))
    print(
        f"platform {platform}{' (the kernel interpreted)' if interpret else ''}; "
        f"Hq {args.heads}, Hkv {args.kv_heads}, D {args.head_size}, block {args.block_size}, "
        f"{args.dtype}; median ms of {args.repeat} calls"
    )
    print(f"  {'batch':>5s} {'context':>7s} {'pallas':>9s} {'reference':>9s} {'ratio':>6s}")
    for batch in args.batch:
        for context in args.context:
            data = inputs(
                batch,
                context,
                heads=args.heads,
                kv_heads=args.kv_heads,
                head_size=args.head_size,
                block_size=args.block_size,
                dtype=jnp.dtype(args.dtype),
            )
            ours, xla = (
                median_ms(kernel, data, args.repeat),
                median_ms(reference, data, args.repeat),
            )
            print(f"  {batch:5d} {context:7d} {ours:9.3f} {xla:9.3f} {ours / xla:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
