"""torch.distributed on pjrt: all-reduce bandwidth against gloo, and FSDP2 step time.

Usage::

    .venv/bin/python benchmarks/distributed.py                  # both parts, 4 processes
    .venv/bin/python benchmarks/distributed.py --json /tmp/dist.json
    .venv/bin/python benchmarks/distributed.py --skip-train --iters 50

One command: the script launches ``python -m torch.distributed.run`` itself, on JAX's
CPU platform (``JAX_PLATFORMS=cpu``, ``PJRT_DEVICE=CPU``, one CPU device per process), and
prints two tables.

All-reduce (``--nproc`` processes, default 4), by message size (float32 zeros, 4 KiB to
16 MiB): ``dist.all_reduce`` (SUM) of a pjrt tensor through the pjrt group, and of a CPU
tensor through a gloo group (``dist.new_group(backend="gloo")``) in the same processes.
Each iteration starts after a gloo barrier and ends when the result is ready
(``torch.pjrt.synchronize()`` for pjrt; gloo's CPU all-reduce is synchronous); 3 warm-up
iterations first (the pjrt program is compiled once per shape). Columns: the median time
over the iterations (the slowest rank's median), the algorithm bandwidth ``bytes / time``
and the bus bandwidth ``algbw * 2 (n - 1) / n``, as nccl-tests define it (the traffic
per rank of a ring all-reduce, comparable across process counts).

Training step (``--train-procs``, default 1, 2 and 4 processes): the example
``examples/llama_distributed/train.py`` with FSDP2 over every process (``--dp n``; one
process: the plain model), compiled (``torch.compile(backend="pjrt")``, the example's
default without TP), its default model and the same batch per process: weak scaling, so
ideal scaling keeps the step time constant while the tokens per step grow with n. The
step time is the example's own ``step_ms`` (forward, backward, AdamW, the loss's
all-reduce and reading it), median over the steps after ``--train-warmup`` warm-up steps
(compilation happens in the first two).

The machine's load average is printed at the start and the end. On a machine with fewer
cores than processes the processes share cores: the numbers then measure contention as
much as communication.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import time
from pathlib import Path

from torch_pjrt.runtime.launch import local_cpu_env, local_torchrun_command

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "llama_distributed" / "train.py"
SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]
WARMUP = 3
RESULT = "ALLREDUCE_RESULT "


# --- launching --------------------------------------------------------------------------


def torchrun(nproc: int, *args: str, timeout: float = 1200) -> str:
    """``args`` under torchrun with ``nproc`` processes, one CPU device each; the output."""
    cmd = local_torchrun_command(nproc, *args)
    done = subprocess.run(cmd, env=local_cpu_env(), capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{output[-4000:]}")
    return output


# --- the all-reduce worker (runs under torchrun) ----------------------------------------


def _time_all_reduce(tensor, group, sync, barrier, iters: int) -> float:
    import torch.distributed as dist

    times = []
    for i in range(WARMUP + iters):
        barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        sync()
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def all_reduce_worker(sizes: list[int], iters: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("pjrt")
    gloo = dist.new_group(backend="gloo")
    world = dist.get_world_size()

    def barrier():
        dist.barrier(group=gloo)

    rows = []
    for nbytes in sizes:
        n = nbytes // 4
        pjrt = torch.zeros(n, device="pjrt")  # zeros: the sum stays finite
        cpu = torch.zeros(n)
        medians = [
            _time_all_reduce(pjrt, None, torch.pjrt.synchronize, barrier, iters),
            _time_all_reduce(cpu, gloo, lambda: None, barrier, iters),
        ]
        slowest = torch.tensor(medians, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=gloo)
        rows.append({"bytes": nbytes, "pjrt_s": slowest[0].item(), "gloo_s": slowest[1].item()})
    if dist.get_rank() == 0:
        print(RESULT + json.dumps({"world": world, "rows": rows}), flush=True)
    dist.destroy_process_group()


# --- the parent -------------------------------------------------------------------------


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def bench_all_reduce(nproc: int, iters: int) -> dict:
    sizes = ",".join(map(str, SIZES))
    output = torchrun(nproc, __file__, "--worker", "--sizes", sizes, "--iters", str(iters))
    line = next(ln for ln in output.splitlines() if ln.startswith(RESULT))
    result = json.loads(line[len(RESULT) :])
    factor = 2 * (nproc - 1) / nproc
    for row in result["rows"]:
        for name in ("pjrt", "gloo"):
            algbw = row["bytes"] / row[f"{name}_s"] / 1e9
            row[f"{name}_algbw_GBps"] = algbw
            row[f"{name}_busbw_GBps"] = algbw * factor
    return result


def bench_train(nproc: int, warmup: int, steps: int) -> dict:
    args = ["--dp", str(nproc), "--steps", str(warmup + steps)]
    output = torchrun(nproc, str(EXAMPLE), *args)
    found = re.findall(r"step (\d+)/\d+ loss \S+ lr \S+ step_ms (\S+) tok/s (\S+)", output)
    timed = [(float(ms), float(tps)) for step, ms, tps in found if int(step) > warmup]
    if len(timed) != steps:
        raise RuntimeError(f"expected {steps} timed steps, got {len(timed)}:\n{output[-4000:]}")
    first = next(float(ms) for step, ms, _ in found if int(step) == 1)
    return {
        "processes": nproc,
        "median_ms": statistics.median(ms for ms, _ in timed),
        "tokens_per_s": statistics.median(tps for _, tps in timed),
        "first_step_s": first / 1e3,
    }


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def print_all_reduce(result: dict) -> None:
    print(f"\nall_reduce (SUM, float32), {result['world']} processes, median of each rank, slowest")
    print(f"{'size':>8} | {'pjrt ms':>8} {'busbw GB/s':>10} | {'gloo ms':>8} {'busbw GB/s':>10}")
    for r in result["rows"]:
        print(
            f"{_size(r['bytes']):>8} | {r['pjrt_s'] * 1e3:8.3f} {r['pjrt_busbw_GBps']:10.3f}"
            f" | {r['gloo_s'] * 1e3:8.3f} {r['gloo_busbw_GBps']:10.3f}"
        )


def print_train(rows: list[dict]) -> None:
    print("\ntraining step (examples/llama_distributed, FSDP2, compiled, same batch per rank)")
    print(f"{'processes':>9} | {'median ms':>9} | {'tokens/s':>9} | {'first step s':>12}")
    for r in rows:
        print(
            f"{r['processes']:>9} | {r['median_ms']:9.1f} | {r['tokens_per_s']:9.0f}"
            f" | {r['first_step_s']:12.1f}"
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=4, help="processes for the all-reduce part")
    ap.add_argument("--iters", type=int, default=20, help="timed all-reduces per size")
    ap.add_argument("--train-procs", default="1,2,4", help="process counts for the step time")
    ap.add_argument("--train-warmup", type=int, default=5)
    ap.add_argument("--train-steps", type=int, default=10, help="timed steps")
    ap.add_argument("--skip-all-reduce", action="store_true")
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        all_reduce_worker([int(s) for s in args.sizes.split(",")], args.iters)
        return

    import torch

    results: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs"}
    results["torch"] = torch.__version__
    results["load_start"] = load()
    print(results["load_start"], flush=True)
    if not args.skip_all_reduce:
        results["all_reduce"] = bench_all_reduce(args.nproc, args.iters)
        print_all_reduce(results["all_reduce"])
    if not args.skip_train:
        procs = [int(n) for n in args.train_procs.split(",")]
        results["train"] = [bench_train(n, args.train_warmup, args.train_steps) for n in procs]
        print_train(results["train"])
    results["load_end"] = load()
    print(f"\n{results['load_end']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
