"""A GPT training step and inference forward under torch_pjrt's three execution modes
and captured into a ``torch.pjrt.Graph``.

Usage::

    .venv/bin/python benchmarks/modes.py                                  # both workloads
    .venv/bin/python benchmarks/modes.py --workload overhead-bound --steps 30
    .venv/bin/python benchmarks/modes.py --variants "plain JAX,pjrt eager,pjrt fused"
    .venv/bin/python benchmarks/modes.py --variants "plain JAX,pjrt fused,pjrt captured"
    .venv/bin/python benchmarks/modes.py --threads 1 --json /tmp/modes.json

Workloads (``examples/gpt/model.py``, vocabulary 2048), each with two groups of rows:
``train`` (forward, ``loss.backward()``, ``torch.optim.AdamW(lr=1e-3)`` with default
options but pjrt captured's ``capturable=True``, ``zero_grad(set_to_none=True)``) and
``inference`` (``torch.no_grad()``, logits).

``compute-bound``   4 layers, n_embd 256, 4 heads, block 128; batch 8, sequence 128
``overhead-bound``  2 layers, n_embd 64, 2 heads, block 32; batch 1, sequence 32

Variants (rows):

``CPU eager``     the PyTorch model on the CPU
``CPU inductor``  ``torch.compile`` of the step on the CPU (skipped, reason printed, on failure)
``pjrt debug``    model on ``pjrt`` in ``torch_pjrt.mode("debug")``: ops run synchronously
``pjrt eager``    ``torch_pjrt.mode("eager")``: one cached XLA program per op, asynchronous
``pjrt fused``    ``torch_pjrt.mode("fused")``: recorded ops run as one XLA program at the
                  end of ``torch_pjrt.step()`` (or earlier, where a value is needed)
``pjrt compiled`` ``torch.compile(step, backend="pjrt")`` (``compile_step.py``'s row, AdamW
                  with ``capturable=True``), in the default mode
``pjrt captured`` in ``torch_pjrt.mode("fused")``, AdamW made with ``capturable=True``
                  (the same math): 2 ordinary pjrt steps (warm-up: the optimizer makes
                  its state), then the step (inference: the forward under ``no_grad``)
                  captured once into a ``torch.pjrt.Graph`` under ``torch.pjrt.graph``
                  (loss or logits its static output); each step after is one
                  ``replay()``, one XLA program with no per-op host work
``plain JAX``     ``compile_step.py``'s GPT in ``jax.numpy`` from the same parameters: one
                  ``jax.jit`` of forward, ``value_and_grad`` and AdamW with parameters and
                  optimizer state donated (inference: of the forward). The ceiling.

A pjrt step is ``with torch_pjrt.step(): ...`` then ``torch.pjrt.synchronize()``, inside
``torch_pjrt.mode(name)`` from moving the model to the last timed step; a pjrt captured
step is ``g.replay()`` then ``torch.pjrt.synchronize()``; a JAX step ends in
``jax.block_until_ready``; CPU PyTorch is synchronous. Every row feeds the same ``x``,
``y`` to every step (a captured step's static inputs are not refilled).

Columns: ``median ms``, ``p10/p90 ms`` of the timed steps (default 10, after 3 warm-up
steps counting the first; pjrt debug on compute-bound takes fewer, at least 3, where they
would pass ~30 s, and says so); ``x JAX``, median / plain JAX's; ``first s``, the first
step with any tracing and compiling (pjrt captured: its 2 warm-up steps, the capture and
the first replay; its 3 warm-up steps are that first one and 2 replays; runs go plain
JAX, CPU eager, CPU inductor, pjrt fused, captured, eager, debug, train before
inference: debug reuses the per-op programs of eager, inference those of train);
``RSS MiB``, the process's peak resident memory during the variant (peak reset before
it via /proc/self/clear_refs, read with getrusage ru_maxrss) and ``+MiB`` over the RSS
at that reset. RSS is a process number, not a device one:
``dev MiB`` (``torch.pjrt.max_memory_allocated()``, JAX's ``peak_bytes_in_use``) shows
only where the platform reports a peak; on JAX's CPU platform it does not.

Below each group: first-step losses against plain JAX (within 1e-4 relative; inference
compares the cross-entropy of the logits; pjrt captured's first step is its first
uncaptured warm-up step, and its first replay, step 3, is checked against plain JAX's
step 3), pjrt fused's ``torch_pjrt.metrics`` over the timed loop and compilations per
step (0 from the third step on), fused / eager, pjrt captured's host microseconds per
``replay()`` call (the call alone, without ``synchronize``; median over the timed steps)
and capture time (the ``with torch.pjrt.graph(g)`` block), captured / fused, and the
targets: compute-bound, fused <= 1.3x plain JAX and captured <= compiled (issue 18; the
captured / plain JAX ratio printed too); overhead-bound, fused >= 3x faster than eager
and <= 2x plain JAX, captured <= 1.2x plain JAX (issue 18).

The capture targets are judged on paired rounds: after each group's rows, plain JAX,
pjrt compiled and pjrt captured are built again in the same process, warmed up, and
timed in ``--rounds`` alternating rounds (default 5; 3 steps a round compute-bound, 20
overhead-bound; the order reversed every other round); the ratio is the median of the
rounds' ratios. This machine's speed drifts by up to 2x within minutes, so two rows
timed minutes apart, one after the other, do not compare. The other targets use the
rows' medians.

Host memory (``--malloc``): by default the script runs itself again with glibc's malloc
set to keep freed memory for reuse (``compile_step.REUSE_MALLOC``: one arena, no mmap,
no trimming), for every row alike. On JAX's CPU platform each XLA run allocates its
temporary buffer anew on a worker thread, and glibc serves a block over 64 MB there
with a fresh mmap that it unmaps at free: a program with a large temporary buffer
page-faults all of it in again at every run (the compute-bound training step captured
as one program: one ~140 MB block, ~38,000 faults a step, about a third of its time;
plain JAX's one-program step the same; the compiled step's three programs stay under
the limit). ``--malloc system`` leaves malloc as it is. ``--json`` has every row's
numbers (pjrt captured's
``replay_host_us``, ``capture_s``; its ``warmup_losses`` are the 2 uncaptured steps' then
the 3 warm-up replays'). The load average is printed at start and end: numbers
from a busy machine are noisy, and there PyTorch's CPU threads can stall for 100s of ms
a step (large CPU medians or p90s); ``--threads 1`` avoids that.
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import pathlib
import platform
import resource
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch._dynamo
import torch.nn.functional as F

import torch_pjrt

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import compile_step as cs  # noqa: E402
from compile_step import GPT, WORKLOADS  # noqa: E402

VARIANTS = (
    "CPU eager",
    "CPU inductor",
    "pjrt debug",
    "pjrt eager",
    "pjrt fused",
    "pjrt compiled",
    "pjrt captured",
    "plain JAX",
)
RUN_ORDER = (
    "plain JAX",
    "CPU eager",
    "CPU inductor",
    "pjrt fused",
    "pjrt compiled",
    "pjrt captured",
    "pjrt eager",
    "pjrt debug",
)
KINDS = ("train", "inference")
WARMUP = 3
CAPTURE_WARMUP = 2  # ordinary pjrt steps before the capture (< WARMUP: see print_table)
DEBUG_BUDGET_S = 30.0
PAIRED_STEPS = {"compute-bound": 3, "overhead-bound": 20}  # steps per paired round
LOSS_RTOL = 1e-4
FUSED_KEYS = ("fused_compilations", "fused_flushes", "fused_ops", "compilations", "host_syncs")


def reset_peak_rss() -> float | None:
    """Reset the process's peak RSS (Linux >= 4.0); the RSS now in MiB, None if it can't."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return None


def device_peak_mib(variant: str) -> float | None:
    if variant.startswith("pjrt") and torch.pjrt.memory_stats().get("source") == "platform":
        return torch.pjrt.max_memory_allocated() / 2**20
    if variant == "plain JAX":
        peak = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
        return None if peak is None else peak / 2**20
    return None


def to_pjrt(model: GPT) -> GPT:
    model = model.to("pjrt")
    if model.cfg.tie_weights and model.lm_head.weight is not model.tok_emb.weight:
        print('  model.to("pjrt") untied lm_head.weight from tok_emb.weight; tied again')
        model.lm_head.weight = model.tok_emb.weight
    return model


def torch_step(
    kind: str, model: torch.nn.Module, x, y, backend: str | None, capturable: bool = False
) -> Callable:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=capturable)

    def train():
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def inference():
        with torch.no_grad():
            return model(x)[0]

    step = train if kind == "train" else inference
    if backend is not None:
        torch._dynamo.reset()
        step = torch.compile(step, backend=backend)
    return step


def pjrt_step(step: Callable) -> Callable:
    def run():
        with torch_pjrt.step():
            out = step()
        torch.pjrt.synchronize()
        return out

    return run


def captured_step(kind: str, model: torch.nn.Module, x, y) -> tuple[Callable, dict]:
    """The step captured into a ``torch.pjrt.Graph``: the first call runs
    ``CAPTURE_WARMUP`` ordinary pjrt steps (the optimizer makes its state), the capture
    and the first replay; every call after, one ``replay()`` then ``synchronize()``.
    The dict collects the warm-up steps' outputs, the capture's seconds and each
    ``replay()`` call's host seconds."""
    step = torch_step(kind, model, x, y, None, capturable=True)
    graph, static = torch.pjrt.Graph(), []
    info: dict[str, Any] = {"warmup_outputs": [], "capture_s": None, "replay_s": []}

    def run():
        if not static:
            info["warmup_outputs"] = [pjrt_step(step)() for _ in range(CAPTURE_WARMUP)]
            t0 = time.perf_counter()
            with torch.pjrt.graph(graph):
                static.append(step())
            info["capture_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        graph.replay()
        info["replay_s"].append(time.perf_counter() - t0)
        torch.pjrt.synchronize()
        return static[0]

    return run, info


def jax_step(kind: str, base: GPT, x: torch.Tensor, y: torch.Tensor) -> Callable:
    cfg = base.cfg
    params = {k: jnp.asarray(v.detach().numpy()) for k, v in base.named_parameters()}
    jx, jy = jnp.asarray(x.numpy(), jnp.int32), jnp.asarray(y.numpy(), jnp.int32)
    if kind == "inference":
        forward = jax.jit(lambda p, idx: cs.gpt_logits(p, idx, cfg))
        return lambda: jax.block_until_ready(forward(params, jx))
    defaults = torch.optim.AdamW([torch.zeros(1)], lr=1e-3).defaults
    jstep = cs.make_jax_step(cfg, {k: defaults[k] for k in ("lr", "betas", "eps", "weight_decay")})
    state = [params, cs.adamw_init(params)]

    def train():
        state[0], state[1], loss = jax.block_until_ready(jstep(state[0], state[1], jx, jy))
        return loss

    return train


def check_value(kind: str, y: torch.Tensor) -> Callable[[Any], float]:
    """The loss of a step's output: the loss itself, or the cross-entropy of the logits."""
    targets = y.flatten()

    def value(out) -> float:
        if kind == "train":
            return out.item()
        logits = torch.tensor(np.asarray(out.cpu() if isinstance(out, torch.Tensor) else out))
        return F.cross_entropy(logits.double().flatten(0, 1), targets).item()

    return value


def _delta(before: dict, after: dict) -> dict:
    out = {}
    for k, v in after.items():
        if isinstance(v, dict):
            d = {n: c - before.get(k, {}).get(n, 0) for n, c in v.items()}
            if any(d.values()):
                out[k] = {n: c for n, c in d.items() if c}
        elif isinstance(v, (int, float)) and v != before.get(k, 0):
            out[k] = v - before.get(k, 0)
    return out


def measure(step: Callable, value: Callable, n: int, budget_s: float | None = None) -> dict:
    """``WARMUP`` steps (losses kept), then ``n`` timed ones, fewer where ``budget_s``
    would be exceeded; torch_pjrt.metrics are read around the timed loop, and the
    fused compilations after every step."""
    torch_pjrt.metrics.reset()
    losses, times, compiles = [], [], []
    for i in range(WARMUP):
        t0 = time.perf_counter()
        out = step()
        times.append(time.perf_counter() - t0)
        losses.append(value(out))
        compiles.append(torch_pjrt.metrics.as_dict().get("fused_compilations", 0))
    first_s = times[0]
    if budget_s is not None:
        n = min(n, max(3, int(budget_s / times[-1])))
    before, times = torch_pjrt.metrics.as_dict(), []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
        compiles.append(torch_pjrt.metrics.as_dict().get("fused_compilations", 0))
    return {
        "median_ms": statistics.median(times),
        "p10_ms": cs._percentile(times, 10),
        "p90_ms": cs._percentile(times, 90),
        "first_step_s": first_s,
        "steps": n,
        "warmup_losses": losses,
        "times_ms": times,
        "metrics_timed": _delta(before, torch_pjrt.metrics.as_dict()),
        "fused_compilations_per_step": np.diff([0, *compiles]).tolist(),
    }


def build_step(variant: str, kind: str, base: GPT, x, y) -> tuple[Callable, dict | None]:
    """The step of a plain JAX, pjrt compiled or pjrt captured row, on its own copy of
    ``base`` (captured: in fused mode, which the caller enters), and captured's info."""
    if variant == "plain JAX":
        return jax_step(kind, base, x, y), None
    model = to_pjrt(copy.deepcopy(base))
    if variant == "pjrt compiled":
        step = torch_step(kind, model, x.to("pjrt"), y.to("pjrt"), "pjrt", capturable=True)
        return pjrt_step(step), None
    return captured_step(kind, model, x.to("pjrt"), y.to("pjrt"))


def run_variant(variant: str, kind: str, base: GPT, x, y, n: int, workload: str) -> dict:
    value = check_value(kind, y)
    rss0 = reset_peak_rss()
    if variant == "plain JAX":
        r = measure(build_step(variant, kind, base, x, y)[0], value, n)
    elif variant.startswith("CPU"):
        backend = "inductor" if variant == "CPU inductor" else None
        r = measure(torch_step(kind, copy.deepcopy(base), x, y, backend), value, n)
    elif variant == "pjrt compiled":
        torch.pjrt.reset_peak_memory_stats()
        r = measure(build_step(variant, kind, base, x, y)[0], value, n)
    elif variant == "pjrt captured":
        with torch_pjrt.mode("fused"):
            torch.pjrt.reset_peak_memory_stats()
            step, info = build_step(variant, kind, base, x, y)
            r = measure(step, value, n)
            r["warmup_losses"][:0] = [value(out) for out in info["warmup_outputs"]]
        r["capture_s"] = info["capture_s"]
        r["replay_host_us"] = statistics.median(info["replay_s"][-r["steps"] :]) * 1e6
    else:
        mode = variant.split()[1]
        budget = DEBUG_BUDGET_S if mode == "debug" and workload == "compute-bound" else None
        with torch_pjrt.mode(mode):
            torch.pjrt.reset_peak_memory_stats()
            model = to_pjrt(copy.deepcopy(base))
            step = torch_step(kind, model, x.to("pjrt"), y.to("pjrt"), None)
            r = measure(pjrt_step(step), value, n, budget)
    r["rss_peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    r["rss_at_reset_mib"] = rss0
    r["device_peak_mib"] = device_peak_mib(variant)
    return r


# the rows the capture targets compare, measured again in alternating rounds
PAIRED = ("plain JAX", "pjrt compiled", "pjrt captured")


def paired_rounds(kind: str, base: GPT, x, y, variants: list[str], rounds: int, k: int) -> dict:
    """Steps of the :data:`PAIRED` rows in ``variants``, built afresh in one process and
    warmed up, then timed in ``rounds`` rounds of ``k`` steps each, the rows in turn (in
    reverse order every other round). The machine's speed drifts by up to 2x within
    minutes; rows timed one after the other minutes apart do not compare, rows
    alternating within seconds do. Returns each row's per-round medians (ms) and, for
    captured, the per-round ratios to the others and their medians."""
    rows = [v for v in PAIRED if v in variants]
    if "pjrt captured" not in rows or len(rows) < 2 or rounds < 1:
        return {}
    with torch_pjrt.mode("fused"):
        steps = {v: build_step(v, kind, base, x, y)[0] for v in rows}
        for step in steps.values():
            for _ in range(WARMUP):
                step()
        per_round: dict[str, list[float]] = {v: [] for v in rows}
        for r in range(rounds):
            for v in rows if r % 2 == 0 else reversed(rows):
                times = []
                for _ in range(k):
                    t0 = time.perf_counter()
                    steps[v]()
                    times.append((time.perf_counter() - t0) * 1e3)
                per_round[v].append(statistics.median(times))
    out: dict[str, Any] = {"rounds": rounds, "steps_per_round": k, "round_ms": per_round}
    ours = per_round["pjrt captured"]
    for v in rows[:-1]:
        ratios = [a / b for a, b in zip(ours, per_round[v])]
        out[f"pjrt captured / {v}"] = {"rounds": ratios, "median": statistics.median(ratios)}
    return out


def print_paired(paired: dict) -> None:
    if not paired:
        return
    rounds, k = paired["rounds"], paired["steps_per_round"]
    print(f"  paired: {rounds} alternating rounds of {k} steps (median ms per round):")
    for v, ms in paired["round_ms"].items():
        print(f"    {v:<14}" + " ".join(f"{m:8.2f}" for m in ms))
    for key, r in paired.items():
        if key.startswith("pjrt captured / "):
            spread = f"{min(r['rounds']):.2f}-{max(r['rounds']):.2f}"
            print(f"    {key}: median of the rounds' ratios {r['median']:.2f} ({spread})")


def run_group(workload: str, kind: str, variants: list[str], n: int, rounds: int = 0) -> dict:
    spec = WORKLOADS[workload]
    cfg, batch, seq = spec["cfg"], spec["batch"], spec["seq"]
    torch.manual_seed(0)
    base = GPT(cfg)
    g = torch.Generator().manual_seed(1234)
    x, y = (torch.randint(0, cfg.vocab_size, (batch, seq), generator=g) for _ in range(2))
    shape = f"batch {batch}, sequence {seq}, {base.num_params():,} parameters"
    print(f"\n== {workload}, {kind}: {cfg}, {shape}", flush=True)
    results, errors = {}, {}
    for variant in (v for v in RUN_ORDER if v in variants):
        print(f"  running {variant} ...", flush=True)
        try:
            results[variant] = run_variant(variant, kind, base, x, y, n, workload)
        except Exception as e:
            errors[variant] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
            print(f"  {variant} FAILED, row skipped: {errors[variant]}")
            if variant != "CPU inductor":
                tail = traceback.format_exc().strip().splitlines()[-15:]
                print("\n".join("    " + line for line in tail))
        torch._dynamo.reset()
    out = {"variants": results, "errors": errors}
    out["loss_checks"] = print_table(results, errors, n)
    ok = [v for v in variants if v in results]
    out["paired"] = paired_rounds(kind, base, x, y, ok, rounds, PAIRED_STEPS[workload])
    torch._dynamo.reset()
    print_paired(out["paired"])
    out["targets"] = print_targets(workload, results, out["paired"])
    return out


def print_table(results: dict, errors: dict, n: int) -> dict:
    jax_ms = results.get("plain JAX", {}).get("median_ms")
    cols = (("variant", 14), ("median ms", 11), ("p10 ms", 9), ("p90 ms", 9), ("x JAX", 7))
    cols += (("first s", 9), ("RSS MiB", 9), ("+MiB", 7), ("dev MiB", 9))
    head = "  " + "".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(cols))
    print(f"\n{head}\n  {'-' * (len(head) - 2)}")
    for v in VARIANTS:
        if v in errors:
            print(f"  {v:<14}failed: {errors[v][:80]}")
        if v not in results:
            continue
        r = results[v]
        ratio = f"{r['median_ms'] / jax_ms:7.2f}" if jax_ms else f"{'-':>7}"
        rss0 = r["rss_at_reset_mib"]
        grow = "-" if rss0 is None else f"{max(0.0, r['rss_peak_mib'] - rss0):.0f}"
        dev = "-" if r["device_peak_mib"] is None else f"{r['device_peak_mib']:.1f}"
        note = f"  ({r['steps']} timed steps, not {n})" if r["steps"] != n else ""
        print(
            f"  {v:<14}{r['median_ms']:>11.3f}{r['p10_ms']:>9.3f}{r['p90_ms']:>9.3f}{ratio}"
            f"{r['first_step_s']:>9.2f}{r['rss_peak_mib']:>9.0f}{grow:>7}{dev:>9}{note}"
        )
    if any(r["rss_at_reset_mib"] is None for r in results.values()):
        print("  (peak RSS could not be reset: RSS MiB is the process peak since start)")
    checks = {}
    if "plain JAX" not in results:
        print("  first-step loss check skipped: no plain JAX row")
        return checks
    ref = results["plain JAX"]["warmup_losses"][0]
    print(f"  first-step loss, plain JAX: {ref:.7f}")
    for v in VARIANTS:
        if v in results and v != "plain JAX":
            loss = results[v]["warmup_losses"][0]
            rel = abs(loss - ref) / abs(ref)
            checks[v] = {"loss": loss, "rel_diff": rel, "ok": rel <= LOSS_RTOL}
            ok = "ok" if rel <= LOSS_RTOL else f"FAIL (> {LOSS_RTOL:g})"
            print(f"  first-step loss, {v:<13}: {loss:.7f}  rel diff {rel:.1e}  {ok}")
    if "pjrt captured" in results:
        # its first step is an uncaptured warm-up; its first replay is step
        # CAPTURE_WARMUP + 1, checked against plain JAX's step of that number
        i = CAPTURE_WARMUP
        ref = results["plain JAX"]["warmup_losses"][i]
        loss = results["pjrt captured"]["warmup_losses"][i]
        rel = abs(loss - ref) / abs(ref)
        checks["pjrt captured, first replay"] = {
            "step": i + 1,
            "loss": loss,
            "plain_jax_loss": ref,
            "rel_diff": rel,
            "ok": rel <= LOSS_RTOL,
        }
        ok = "ok" if rel <= LOSS_RTOL else f"FAIL (> {LOSS_RTOL:g})"
        print(
            f"  step-{i + 1} loss, plain JAX {ref:.7f}, pjrt captured's first replay "
            f"{loss:.7f}  rel diff {rel:.1e}  {ok}"
        )
    return checks


def print_fused(fused: dict, ms: dict) -> None:
    m = fused["metrics_timed"]
    counters = ", ".join(f"{k} {m.get(k, 0)}" for k in FUSED_KEYS)
    print(f"  pjrt fused, torch_pjrt.metrics over the {fused['steps']} timed steps: {counters}")
    print(f"    flush reasons {m.get('fused_flush_reasons')}, fallbacks {m.get('fallbacks', {})}")
    per_step = fused["fused_compilations_per_step"]
    late = sum(per_step[2:])
    verdict = "ok" if late == 0 else "FAIL, must be 0"
    print(f"  pjrt fused compilations per step {per_step}: from step 3 on {late} ({verdict})")
    if "pjrt eager" in ms:
        ratio = ms["pjrt fused"] / ms["pjrt eager"]
        print(f"  fused / eager: {ratio:.3f} (fused {1 / ratio:.2f}x faster than eager)")


def print_captured(captured: dict, ms: dict) -> None:
    host = f"{captured['replay_host_us']:.0f} us host per replay() call"
    print(
        f"  pjrt captured: {host} (median over the {captured['steps']} timed steps, "
        f"without synchronize), capture {captured['capture_s'] * 1e3:.1f} ms"
    )
    if "pjrt fused" in ms:
        ratio = ms["pjrt captured"] / ms["pjrt fused"]
        print(f"  captured / fused: {ratio:.3f} (captured {1 / ratio:.2f}x faster than fused)")


def print_targets(workload: str, results: dict, paired: dict | None = None) -> dict:
    ms = {v: r["median_ms"] for v, r in results.items()}
    paired = paired or {}
    if "pjrt fused" in results:
        print_fused(results["pjrt fused"], ms)
    if "pjrt captured" in results:
        print_captured(results["pjrt captured"], ms)
    wanted = [("fused <= 1.3x plain JAX", "pjrt fused", "plain JAX", 1.3)]
    if workload == "overhead-bound":
        wanted = [
            ("fused >= 3x faster than eager", "pjrt fused", "pjrt eager", 1 / 3),
            ("fused <= 2x plain JAX", "pjrt fused", "plain JAX", 2.0),
            ("captured <= 1.2x plain JAX", "pjrt captured", "plain JAX", 1.2),
        ]
    else:
        wanted.append(("captured <= compiled", "pjrt captured", "pjrt compiled", 1.0))
        if "pjrt captured" in ms and "plain JAX" in ms:
            ratio = ms["pjrt captured"] / ms["plain JAX"]
            print(f"  pjrt captured / plain JAX = {ratio:.2f}")
    targets = {}
    for label, a, b, limit in wanted:
        if a not in ms or b not in ms:
            targets[label] = None
            print(f"  target {label}: not evaluated ({a} or {b} not run)")
            continue
        ratio, how = ms[a] / ms[b], "the rows' medians"
        if f"{a} / {b}" in paired:  # (the alternating rounds, where they ran)
            ratio, how = paired[f"{a} / {b}"]["median"], "paired rounds"
        targets[label] = ratio <= limit
        met = "met" if targets[label] else "NOT met"
        print(f"  target {label}: {met} ({a} / {b} = {ratio:.2f}, {how})")
    return targets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads for CPU PyTorch")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated rows")
    ap.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="alternating rounds of plain JAX, pjrt compiled and pjrt captured after each "
        "group, for the capture targets (default 5; 0: none)",
    )
    ap.add_argument("--json", type=pathlib.Path, help="write the numbers here")
    ap.add_argument(
        "--malloc",
        choices=("reuse", "system"),
        default="reuse",
        help="host memory for every row: glibc's malloc keeping freed memory (default; "
        "the script runs itself again with compile_step.REUSE_MALLOC), or as it is",
    )
    args = ap.parse_args(argv)
    malloc = cs.reuse_malloc(args.malloc == "reuse" and argv is None)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if unknown := [v for v in variants if v not in VARIANTS]:
        ap.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    print(
        f"torch {torch.__version__}, jax {jax.__version__}, pjrt device "
        f"{torch.pjrt.get_device_name()} (JAX {jax.devices()[0]}), python "
        f"{platform.python_version()}, {os.cpu_count()} CPUs, PyTorch CPU threads "
        f"{torch.get_num_threads()}, host malloc {malloc}\nload average at start: "
        + " ".join(f"{x:.2f}" for x in load_start),
        flush=True,
    )
    out: dict[str, Any] = {"torch": torch.__version__, "jax": jax.__version__}
    out |= {"torch_threads": torch.get_num_threads(), "load_start": load_start, "workloads": {}}
    out |= {"malloc": malloc}
    for workload in WORKLOADS if args.workload == "all" else [args.workload]:
        out["workloads"][workload] = {
            kind: run_group(workload, kind, variants, args.steps, args.rounds) for kind in KINDS
        }
    return cs.finish(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
