"""What the value checks cost: the same work with checks on and off, alternating in one
process (``torch_pjrt.config(checks=...)``, the runtime form of ``TORCH_PJRT_CHECKS``).

Usage::

    .venv/bin/python benchmarks/checks_cost.py                  # ops and both GPT workloads
    .venv/bin/python benchmarks/checks_cost.py --op-rounds 101 --only ops

Rows:

``ops``        eager 8x8 ``x + y``, ``x @ y``, ``x.sum()`` (no checks), ``x[i]`` with one
               index tensor (checked once; after that its inputs passed, docs/semantics.md)
               and ``x[i]`` with a fresh index tensor every call (checked every call):
               microseconds per call over ``--op-rounds`` rounds of ``--calls`` calls
               and a synchronize (many short rounds: this machine's speed drifts by more
               than the 3% measured, over seconds)
``<workload> <mode>``  the GPT train step of ``modes.py`` (forward, backward, AdamW) in
               pjrt eager, fused, compiled and captured (a ``torch.pjrt.Graph``
               replayed): milliseconds per step, each step synchronized. Two copies of
               the model, one run with checks on, one off (a compiled or captured graph
               is traced under the setting of its first call) alternate every step
               (on, off, off, on, ...), ``--rounds`` x ``--steps`` of each (four times as
               many for the overhead-bound workload, whose steps are short); the ratio is
               the median over the pairs of neighbouring steps of on / off (as the op
               rows': a drift of the machine's speed moves both steps of a pair)

An op round measures on then off (then swaps the order next round); an op row's ratio is
the median over rounds of on / off within a round, so a machine that changes speed
between rounds moves both. The load average is printed at start and end.
"""

from __future__ import annotations

import argparse
import copy
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable

import torch

import torch_pjrt

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import modes  # noqa: E402
from compile_step import GPT, WORKLOADS  # noqa: E402


def _paired(run: Callable[[bool], float], rounds: int) -> tuple[float, float, float]:
    """Median on, median off, median of the per-round ratios on / off."""
    on, off = [], []
    for r in range(rounds):
        for checks in (True, False) if r % 2 == 0 else (False, True):
            with torch_pjrt.config(checks=checks):
                (on if checks else off).append(run(checks))
    ratios = [a / b for a, b in zip(on, off)]
    return statistics.median(on), statistics.median(off), statistics.median(ratios)


def op_rows(rounds: int, calls: int) -> dict:
    torch.manual_seed(0)
    x, y = torch.randn(8, 8, device="pjrt"), torch.randn(8, 8, device="pjrt")
    i = torch.tensor([0, 3, 5, 7], device="pjrt")
    fresh = {}

    def per_call(fn: Callable[[], object], prepare: Callable[[], None] | None = None):
        def run(checks: bool) -> float:
            if prepare is not None:
                prepare()
            torch.pjrt.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.pjrt.synchronize()
            return (time.perf_counter() - start) / calls * 1e6

        return run

    def new_indices() -> None:  # (outside the timed loop)
        fresh["all"] = iter([torch.randint(0, 8, (4,), device="pjrt") for _ in range(calls)])

    cases = {
        "x + y": per_call(lambda: x + y),
        "x @ y": per_call(lambda: x @ y),
        "x.sum()": per_call(lambda: x.sum()),
        "x[i], one i": per_call(lambda: x[i]),
        "x[i], fresh i": per_call(lambda: x[next(fresh["all"])], new_indices),
    }
    rows = {}
    with torch_pjrt.mode("eager"):
        for name, run in cases.items():
            for checks in (True, False):  # warm-up: both programs compiled
                with torch_pjrt.config(checks=checks):
                    run(checks)
            rows[name] = _paired(run, rounds)
    return rows


def step_rows(workload: str, rounds: int, steps: int) -> dict:
    spec = WORKLOADS[workload]
    torch.manual_seed(0)
    base = GPT(spec["cfg"])
    x = torch.randint(0, spec["cfg"].vocab_size, (spec["batch"], spec["seq"]))
    y = torch.randint(0, spec["cfg"].vocab_size, (spec["batch"], spec["seq"]))
    rows = {}
    for mode in ("eager", "fused", "compiled", "captured"):
        backend = "pjrt" if mode == "compiled" else None
        run_mode = "eager" if mode == "eager" else "fused"
        made = {}
        for checks in (True, False):
            with torch_pjrt.config(checks=checks), torch_pjrt.mode(run_mode):
                model = modes.to_pjrt(copy.deepcopy(base))
                xs, ys = x.to("pjrt"), y.to("pjrt")
                if mode == "captured":
                    step = modes.captured_step("train", model, xs, ys)[0]
                else:
                    step = modes.pjrt_step(
                        modes.torch_step("train", model, xs, ys, backend, capturable=True)
                    )
                for _ in range(modes.WARMUP):
                    step()
                made[checks] = step

        # on and off alternate every step (on, off, off, on, ...), so a drift of the
        # machine's speed moves both steps of a pair alike
        times: dict = {True: [], False: []}
        with torch_pjrt.mode(run_mode):
            for i in range(rounds * steps):
                for checks in (True, False) if i % 2 == 0 else (False, True):
                    with torch_pjrt.config(checks=checks):
                        start = time.perf_counter()
                        made[checks]()
                        times[checks].append(time.perf_counter() - start)
        on, off = statistics.median(times[True]) * 1e3, statistics.median(times[False]) * 1e3
        pairs = [a / b for a, b in zip(times[True], times[False])]  # (neighbours in time)
        rows[f"{workload} {mode}"] = (on, off, statistics.median(pairs))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7, help="paired rounds (default 7)")
    ap.add_argument("--op-rounds", type=int, default=51, help="op rounds (default 51)")
    ap.add_argument("--calls", type=int, default=200, help="op calls a round (default 200)")
    ap.add_argument("--steps", type=int, default=9, help="GPT steps a round (default 9)")
    ap.add_argument("--only", choices=["ops", "steps"], help="one group of rows")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print("load average at start: " + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    rows = {}
    if args.only != "steps":
        rows.update(op_rows(args.op_rounds, args.calls))
    if args.only != "ops":
        for workload in ("overhead-bound", "compute-bound"):
            steps = args.steps * (4 if workload == "overhead-bound" else 1)
            rows.update(step_rows(workload, args.rounds, steps))
    print(f"\n  {'row':28s} {'checks on':>10s} {'checks off':>11s} {'on / off':>9s}")
    for name, (on, off, ratio) in rows.items():
        unit = "us" if name.startswith("x") else "ms"
        print(f"  {name:28s} {on:8.2f}{unit} {off:9.2f}{unit} {ratio:9.3f}")
    print("\nload average at end: " + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
