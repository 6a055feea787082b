"""Every OpInfo op through ``torch.compile(backend="pjrt")``, against CPU eager.

For each ``op_db`` entry that passes eagerly on pjrt (not listed in
``tests/expectations.py``), the first samples are run through one compiled function
(the same one for every sample, so later samples also exercise Dynamo's automatic
dynamic shapes and the bucket padding of ``torch_pjrt/compile/buckets.py``) with
``TORCH_PJRT_FALLBACK=error``, and compared with the CPU like ``tests/test_ops.py``.

    .venv/bin/python scripts/compile_coverage.py               # all ops, 2 workers
    .venv/bin/python scripts/compile_coverage.py --ops 'split*,as_strided' --samples 3

Prints the failures and the pass count; ``--json PATH`` keeps the results. A fast subset
runs in ``make test`` (``tests/test_compile.py::test_op_through_compile``).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import multiprocessing
import os
import sys
import warnings
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TORCH_PJRT_CACHE", "0")
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]


def check(key: str, n_samples: int) -> str:
    """'pass', 'skip' (nothing to compare), or the first failure's message."""
    import test_ops as T  # tests/test_ops.py: samples, moving, comparing
    import torch
    import torch._dynamo

    import torch_pjrt

    op = T.ops_by_key()[key]
    dtype = T.dtype_for(op)
    if dtype is None:
        return "skip"
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a, **k: op(*a, **k), backend="pjrt")
    compared = 0
    for sample in T.samples(op, dtype, limit=n_samples):
        args, kwargs = [sample.input, *sample.args], dict(sample.kwargs)
        dev_args, dev_kwargs = T.to_pjrt(args, kwargs)
        cpu_args, cpu_kwargs = T.cpu_copy(args, kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                expected = op(*cpu_args, **cpu_kwargs)
            except Exception:  # noqa: BLE001  (the CPU rejects this sample)
                continue
            untied = next(T._tensors([args, kwargs]), None) is None and "device" not in kwargs
            try:
                with torch_pjrt.config(fallback="error"):
                    with torch.device("pjrt") if untied else nullcontext():
                        actual = compiled(*dev_args, **dev_kwargs)
                tol = T.tolerances(op, dtype)
                T.compare(actual, expected, tol)
                for a, e in zip(T._tensors(dev_args), T._tensors(cpu_args)):
                    T.compare(a, e, tol, path="argument after the op")
            except Exception as exc:  # noqa: BLE001  (reported)
                first = next((ln for ln in str(exc).splitlines() if ln.strip()), "")
                return f"sample {compared}: {type(exc).__name__}: {first}"[:300]
        compared += 1
    return "pass" if compared else "skip"


def keys(patterns: str | None) -> list[str]:
    import test_ops as T
    from expectations import SHAPE_ONLY, SKIP, XFAIL, XFAIL_EAGER, XFAIL_FUSED

    excluded = set(SKIP) | set(XFAIL) | set(XFAIL_EAGER) | set(XFAIL_FUSED) | set(SHAPE_ONLY)
    found = [k for k in sorted(T.ops_by_key()) if k not in excluded]
    if patterns:
        globs = [p.strip() for p in patterns.split(",")]
        found = [k for k in found if any(fnmatch.fnmatch(k, g) for g in globs)]
    return found


def _worker(args):
    part, jobs, selected, n_samples = args
    return {k: check(k, n_samples) for k in selected[part::jobs]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", help="comma-separated op keys or globs")
    p.add_argument("--samples", type=int, default=2, help="samples per op (default 2)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--json", metavar="PATH")
    opts = p.parse_args(argv)
    import expectations  # noqa: F401  (fail early if tests/ is not importable)

    selected = keys(opts.ops)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(opts.jobs) as pool:
        work = [(i, opts.jobs, selected, opts.samples) for i in range(opts.jobs)]
        parts = pool.map(_worker, work)
    results = {k: v for part in parts for k, v in part.items()}
    failed = {k: v for k, v in sorted(results.items()) if v not in ("pass", "skip")}
    for k, v in failed.items():
        print(f"FAIL {k}: {v}")
    ran = sum(v != "skip" for v in results.values())
    print(f"{ran - len(failed)} of {ran} ops pass through torch.compile(backend='pjrt')")
    if opts.json:
        Path(opts.json).write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
