"""One GPT training step (forward, backward, AdamW), measured five ways.

Usage::

    .venv/bin/python benchmarks/compile_step.py                        # both workloads
    .venv/bin/python benchmarks/compile_step.py --workload overhead-bound --steps 30
    .venv/bin/python benchmarks/compile_step.py --threads 1 --json /tmp/step.json

The model is ``examples/gpt/model.py`` (``GPT``); the step is::

    def step(x, y):
        logits, loss = model(x, y)
        loss.backward()
        opt.step()                      # torch.optim.AdamW(lr=1e-3, capturable=True on pjrt)
        opt.zero_grad(set_to_none=True)
        return loss

Variants (rows of the table):

``pjrt compiled``
    ``torch.compile(step, backend="pjrt")`` with the model on the ``pjrt`` device.
``plain JAX``
    The same GPT and AdamW written by hand in ``jax.numpy``: one ``jax.jit`` over
    forward, ``jax.value_and_grad`` and the AdamW update, parameters and optimizer state
    donated. Its parameters are the PyTorch model's, so both compute the same function;
    the first-step losses of the two are checked to agree within 1e-4 (relative). This
    is the floor for ``pjrt compiled``: the same XLA device, no PyTorch on the host.
``CPU eager``
    The PyTorch model on the CPU, eager (AdamW without ``capturable``: eager PyTorch
    rejects it for CPU parameters; the arithmetic is the same).
``CPU inductor``
    ``torch.compile(step)`` (inductor, C++ codegen) on the CPU. If inductor fails (no C++
    compiler, ...), the reason is printed and the row is skipped. AdamW as for CPU eager.
``pjrt eager``
    The model on ``pjrt`` without compile in ``torch_pjrt.mode("eager")``, one XLA
    program per op (overhead-bound workload only: it is slow; ``benchmarks/modes.py``
    compares the execution modes, fused included).

Columns:

``median ms``   median wall time of one step over the timed steps (``time.perf_counter``,
                each step synchronised: ``torch.pjrt.synchronize()`` for pjrt,
                ``jax.block_until_ready`` on every output for JAX; CPU PyTorch is synchronous)
``p10/p90 ms``  10th and 90th percentile of the same steps
``x JAX``       median / median of plain JAX (1.00 = as fast as hand-written JAX)
``first s``     the first step of the variant, in seconds: for compiled variants this is
                tracing and compiling (Dynamo + AOT autograd + XLA or inductor, or jit)

Below each table: the host overhead of pjrt compiled per step,
median(pjrt compiled) - median(plain JAX) in microseconds; the cost of one
``torch.pjrt.synchronize()`` with nothing pending (part of that overhead); the *host
floor*, the same compiled step with each pjrt graph answering at once with its previous
outputs (no device work, no JAX call: what Dynamo, AOT autograd, the autograd engine and
the optimizer's Python cost by themselves, a floor for any backend of this shape); and
``torch_pjrt.metrics`` counters (``graph_*``, ``dynamo_*``, eager ops, host syncs) for
the warm-up (where compilation happens) and for the timed loop (should show no
compilation and 3 graph executions a step: forward, backward, optimizer).

Each step is warmed up before timing (3 steps eager, 5 compiled). Steps default to 20
(compute-bound) and 100 (overhead-bound). PyTorch's CPU thread count is left at its
default unless ``--threads`` is given; JAX's CPU client (used by both pjrt and plain JAX)
has its own thread pool either way. The machine's load average is printed at the start
and the end: on a shared machine, numbers taken under load are noisy. In particular,
inductor's OpenMP kernels with more than one thread can stall for 100s of ms when other
processes hold the cores (large p90 in the CPU inductor row); ``--threads 1`` avoids it.
Inductor caches compiled kernels on disk (``/tmp/torchinductor_$USER``), so its first
step is much shorter on a second run with the same settings.

The pjrt model is moved with ``model.to("pjrt")``; if that unties ``lm_head.weight``
from ``tok_emb.weight`` (it does with torch_pjrt at the time of writing), the script
says so and ties them again, so that every variant trains the same model.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import pathlib
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch._dynamo

import torch_pjrt

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "gpt"))

from model import GPT, GPTConfig  # noqa: E402

# The two GPT workloads of the execution-modes benchmark (benchmarks/modes.py uses these)
WORKLOADS = {
    "compute-bound": dict(
        cfg=GPTConfig(vocab_size=2048, block_size=128, n_layer=4, n_head=4, n_embd=256),
        batch=8,
        seq=128,
        steps=20,
    ),
    "overhead-bound": dict(
        cfg=GPTConfig(vocab_size=2048, block_size=32, n_layer=2, n_head=2, n_embd=64),
        batch=1,
        seq=32,
        steps=100,
    ),
}
VARIANTS = ("pjrt compiled", "plain JAX", "CPU eager", "CPU inductor", "pjrt eager")
WARMUP_EAGER = 3
WARMUP_COMPILED = 5
LOSS_RTOL = 1e-4


# --- the model in plain JAX ------------------------------------------------------------


def _linear(x, w, b=None):
    # On (rows, in) like PyTorch's Linear after AOT autograd (view + addmm): XLA's CPU
    # backend runs the weight gradient of a 3-d x @ w.T (two contracting dimensions)
    # about 2x slower than the same gradient of the 2-d product.
    y = x.reshape(-1, x.shape[-1]) @ w.T  # torch's Linear weight is (out, in)
    if b is not None:
        y = y + b
    return y.reshape(*x.shape[:-1], w.shape[0])


def _layer_norm(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * w + b


def gpt_logits(params: dict, idx, cfg: GPTConfig):
    """``GPT.forward(idx)[0]`` in jax.numpy; ``params`` as ``named_parameters``."""
    B, T = idx.shape
    C, nh = cfg.n_embd, cfg.n_head
    hd = C // nh
    x = params["tok_emb.weight"][idx] + params["pos_emb.weight"][:T]
    causal = jnp.tril(jnp.ones((T, T), dtype=bool))
    for i in range(cfg.n_layer):
        p = {k[len(f"blocks.{i}.") :]: v for k, v in params.items() if k.startswith(f"blocks.{i}.")}
        h = _layer_norm(x, p["ln1.weight"], p["ln1.bias"])
        q, k, v = jnp.split(_linear(h, p["attn.qkv.weight"], p["attn.qkv.bias"]), 3, axis=-1)
        q, k, v = (t.reshape(B, T, nh, hd).transpose(0, 2, 1, 3) for t in (q, k, v))
        scores = (q @ k.transpose(0, 1, 3, 2)) / math.sqrt(hd)
        att = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + _linear(y, p["attn.proj.weight"], p["attn.proj.bias"])
        h = _layer_norm(x, p["ln2.weight"], p["ln2.bias"])
        h = jax.nn.gelu(_linear(h, p["mlp.fc.weight"], p["mlp.fc.bias"]), approximate=False)
        x = x + _linear(h, p["mlp.proj.weight"], p["mlp.proj.bias"])
    x = _layer_norm(x, params["ln_f.weight"], params["ln_f.bias"])
    return _linear(x, params["tok_emb.weight"])  # lm_head tied to the token embedding


def gpt_loss(params: dict, idx, targets, cfg: GPTConfig):
    """``GPT.forward(idx, targets)[1]`` in jax.numpy."""
    logp = jax.nn.log_softmax(gpt_logits(params, idx, cfg), axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()


def adamw_init(params: dict) -> dict:
    def zeros():  # distinct buffers: m and v are donated separately
        return {k: jnp.zeros_like(v) for k, v in params.items()}

    return {"step": jnp.zeros((), jnp.float32), "m": zeros(), "v": zeros()}


def adamw_update(params, grads, state, *, lr, betas, eps, weight_decay):
    """torch.optim.AdamW (not amsgrad, not maximize), as its single-tensor loop does it."""
    b1, b2 = betas
    step = state["step"] + 1
    bc1 = 1 - b1**step
    bc2_sqrt = jnp.sqrt(1 - b2**step)
    new_p, new_m, new_v = {}, {}, {}
    for k, p in params.items():
        g = grads[k]
        p = p * (1 - lr * weight_decay)
        m = state["m"][k] + (g - state["m"][k]) * (1 - b1)  # m.lerp_(g, 1 - b1)
        v = state["v"][k] * b2 + g * g * (1 - b2)
        new_p[k] = p - (lr / bc1) * m / (jnp.sqrt(v) / bc2_sqrt + eps)
        new_m[k], new_v[k] = m, v
    return new_p, {"step": step, "m": new_m, "v": new_v}


def make_jax_step(cfg: GPTConfig, hyper: dict):
    def train_step(params, state, idx, targets):
        loss, grads = jax.value_and_grad(gpt_loss)(params, idx, targets, cfg)
        params, state = adamw_update(params, grads, state, **hyper)
        return params, state, loss

    return jax.jit(train_step, donate_argnums=(0, 1))


# --- timing ------------------------------------------------------------------------------


def _percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def measure(step: Callable[[], float], warmup: int, n: int) -> dict:
    """Run ``step`` (which synchronises and returns the loss) 1 + warmup + n times."""
    t0 = time.perf_counter()
    losses = [step()]
    first_s = time.perf_counter() - t0
    for _ in range(warmup - 1):
        losses.append(step())
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    return {
        "median_ms": statistics.median(times),
        "p10_ms": _percentile(times, 10),
        "p90_ms": _percentile(times, 90),
        "first_step_s": first_s,
        "warmup_losses": losses,
        "times_ms": times,
    }


def to_pjrt(model: GPT) -> GPT:
    """``model.to("pjrt")``; the lm head must stay tied to the token embedding, or the
    model is no longer the GPT that the JAX mirror computes."""
    model = model.to("pjrt")
    if model.cfg.tie_weights and model.lm_head.weight is not model.tok_emb.weight:
        raise SystemExit('model.to("pjrt") untied lm_head.weight from tok_emb.weight')
    return model


def torch_step(model: torch.nn.Module, compile_backend: str | None):
    # capturable=True is for device tensors (the step count stays on the device, no host
    # sync); PyTorch's eager AdamW rejects it for CPU parameters, so the CPU rows go without
    on_cpu = next(model.parameters()).device.type == "cpu"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=not on_cpu)

    def step(x, y):
        logits, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    if compile_backend is not None:
        torch._dynamo.reset()  # each compiled variant starts from an empty Dynamo cache
        step = torch.compile(step, backend=compile_backend)
    return step, opt


def host_floor_ms(pjrt_compiled: Callable[[], float], steps: int) -> float:
    """Median ms of the compiled step when each pjrt graph returns, at once, the outputs
    of its previous call: what Dynamo's guards, AOT autograd's wrappers, the autograd
    engine and the optimizer's Python cost by themselves, the floor under any backend
    that keeps this structure (the values computed are meaningless)."""
    from torch_pjrt.compile.program import GraphProgram

    real = GraphProgram.__call__
    last: dict = {}

    def remember(self, *args):
        out = last[self.id] = real(self, *args)
        return out

    def replay(self, *args):
        return list(last[self.id])

    try:
        GraphProgram.__call__ = remember
        pjrt_compiled()
        GraphProgram.__call__ = replay
        return measure(pjrt_compiled, 3, steps)["median_ms"]
    finally:
        GraphProgram.__call__ = real


def _graph_metrics() -> dict:
    d = torch_pjrt.metrics.as_dict()
    out = {k: v for k, v in sorted(d.items()) if k.startswith(("graph_", "dynamo_"))}
    out["host_syncs"] = d["host_syncs"]
    # programs built outside the graphs (the ops between them: eager or fused mode)
    out["op_compilations"] = d.get("eager_compilations", 0) + d.get("fused_compilations", 0)
    out["eager_ops"] = d["ops"]
    out["fallbacks"] = d["fallbacks"]
    return out


# --- one workload --------------------------------------------------------------------------


def run_workload(name: str, spec: dict, steps: int, first_compile_in_process: bool) -> dict:
    cfg, batch, seq = spec["cfg"], spec["batch"], spec["seq"]
    assert cfg.bias and cfg.tie_weights and cfg.dropout == 0.0, "the JAX mirror assumes these"
    torch.manual_seed(0)
    base = GPT(cfg)
    g = torch.Generator().manual_seed(1234)
    x_cpu = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
    y_cpu = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
    print(
        f"\n== {name}: GPTConfig(vocab_size={cfg.vocab_size}, block_size={cfg.block_size}, "
        f"n_layer={cfg.n_layer}, n_head={cfg.n_head}, n_embd={cfg.n_embd}), "
        f"batch {batch}, sequence {seq}, {base.num_params():,} parameters, "
        f"{steps} timed steps",
        flush=True,
    )
    results: dict[str, dict] = {}
    errors: dict[str, str] = {}
    metrics: dict[str, dict] = {}

    # 1. pjrt compiled (first, so that its first step is as cold as this process allows)
    model = to_pjrt(copy.deepcopy(base))
    step, _ = torch_step(model, "pjrt")
    x, y = x_cpu.to("pjrt"), y_cpu.to("pjrt")

    def pjrt_compiled():
        loss = step(x, y)
        torch.pjrt.synchronize()
        return loss.item()

    torch_pjrt.metrics.reset()
    t0 = time.perf_counter()
    first = [pjrt_compiled()]
    first_s = time.perf_counter() - t0
    first += [pjrt_compiled() for _ in range(WARMUP_COMPILED - 1)]
    metrics["warm-up"] = _graph_metrics()
    torch_pjrt.metrics.reset()
    r = measure(pjrt_compiled, 1, steps)  # already warm: its own "first" step is a warm one
    metrics["timed loop"] = _graph_metrics()
    r["first_step_s"], r["warmup_losses"] = first_s, first
    r["first_step_cold_process"] = first_compile_in_process
    results["pjrt compiled"] = r
    sync_times = []
    for _ in range(20):
        t0 = time.perf_counter()
        torch.pjrt.synchronize()
        sync_times.append((time.perf_counter() - t0) * 1e6)
    sync_us = statistics.median(sync_times)
    floor_ms = host_floor_ms(pjrt_compiled, steps)
    del model, step, x, y

    # 2. plain JAX, from the same initial parameters
    params = {
        k: jnp.asarray(v.detach().numpy(), dtype=jnp.float32) for k, v in base.named_parameters()
    }
    hyper = torch.optim.AdamW([torch.zeros(1)], lr=1e-3, capturable=True).defaults
    hyper = {k: hyper[k] for k in ("lr", "betas", "eps", "weight_decay")}
    jstep = make_jax_step(cfg, hyper)
    state = {"params": params, "opt": adamw_init(params)}
    jx, jy = jnp.asarray(x_cpu.numpy(), jnp.int32), jnp.asarray(y_cpu.numpy(), jnp.int32)

    def plain_jax():
        state["params"], state["opt"], loss = jax.block_until_ready(
            jstep(state["params"], state["opt"], jx, jy)
        )
        return float(loss)

    results["plain JAX"] = measure(plain_jax, WARMUP_COMPILED, steps)
    state.clear()

    a, b = results["pjrt compiled"]["warmup_losses"][0], results["plain JAX"]["warmup_losses"][0]
    rel = abs(a - b) / abs(b)
    print(f"first-step loss: pjrt compiled {a:.7f}  plain JAX {b:.7f}  (rel diff {rel:.1e})")
    if not rel <= LOSS_RTOL:
        raise SystemExit(
            f"FAIL: first-step losses differ by {rel:.2e} (> {LOSS_RTOL:g} relative): "
            "the JAX mirror and the PyTorch model do not compute the same function"
        )
    a, b = results["pjrt compiled"]["warmup_losses"][-1], results["plain JAX"]["warmup_losses"][-1]
    print(
        f"loss after {WARMUP_COMPILED - 1} AdamW steps: pjrt compiled {a:.7f}  "
        f"plain JAX {b:.7f}  (rel diff {abs(a - b) / abs(b):.1e}, informational)"
    )

    # 3. CPU eager, 4. CPU inductor
    for variant, backend, warmup in (
        ("CPU eager", None, WARMUP_EAGER),
        ("CPU inductor", "inductor", WARMUP_COMPILED),
    ):
        model = copy.deepcopy(base)
        step, _ = torch_step(model, backend)

        def cpu_step(step=step):
            return step(x_cpu, y_cpu).item()

        try:
            results[variant] = measure(cpu_step, warmup, steps)
        except Exception as e:  # inductor needs a working C++ toolchain
            errors[variant] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
            print(f"{variant} failed, skipped: {errors[variant]}", flush=True)
            if os.environ.get("BENCH_TRACEBACK"):
                traceback.print_exc()
        del model, step
    torch._dynamo.reset()

    # 5. pjrt eager (only where the model is small)
    if name == "overhead-bound":
        with torch_pjrt.mode("eager"):  # (benchmarks/modes.py compares the modes)
            model = to_pjrt(copy.deepcopy(base))
            step, _ = torch_step(model, None)
            x, y = x_cpu.to("pjrt"), y_cpu.to("pjrt")

            def pjrt_eager():
                loss = step(x, y)
                torch.pjrt.synchronize()
                return loss.item()

            results["pjrt eager"] = measure(pjrt_eager, WARMUP_EAGER, steps)
        del model, step, x, y

    b = results["plain JAX"]["warmup_losses"][0]
    for variant in ("CPU eager", "CPU inductor", "pjrt eager"):
        if variant in results:
            loss = results[variant]["warmup_losses"][0]
            rel = abs(loss - b) / abs(b)
            print(f"first-step loss: {variant} {loss:.7f}  (rel diff to plain JAX {rel:.1e})")

    jax_ms = results["plain JAX"]["median_ms"]
    pc_ms = results["pjrt compiled"]["median_ms"]
    summary = {
        "pjrt_compiled_first_step_s": results["pjrt compiled"]["first_step_s"],
        "host_overhead_us": (pc_ms - jax_ms) * 1e3,
        "pjrt_compiled_over_plain_jax": pc_ms / jax_ms,
        "pjrt_synchronize_idle_us": sync_us,
        "host_floor_ms": floor_ms,
    }
    print_table(name, results, errors, summary, metrics)
    return {
        "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        "batch": batch,
        "sequence": seq,
        "parameters": base.num_params(),
        "steps": steps,
        "variants": results,
        "errors": errors,
        "summary": summary,
        "pjrt_compiled_metrics": metrics,
    }


def print_table(name, results, errors, summary, metrics) -> None:
    jax_ms = results["plain JAX"]["median_ms"]
    print(f"\n{name}")
    head = "  " + "".join(
        f"{c:{w}}"
        for c, w in (
            ("variant", "<15"),
            ("median ms", ">11"),
            ("p10 ms", ">10"),
            ("p90 ms", ">10"),
            ("x JAX", ">8"),
            ("first s", ">10"),
        )
    )
    print(head)
    print("  " + "-" * (len(head) - 2))
    for variant in VARIANTS:
        if variant in results:
            r = results[variant]
            print(
                f"  {variant:<15}{r['median_ms']:>11.3f}{r['p10_ms']:>10.3f}{r['p90_ms']:>10.3f}"
                f"{r['median_ms'] / jax_ms:>8.2f}{r['first_step_s']:>10.2f}"
            )
        elif variant in errors:
            print(f"  {variant:<15}{'failed: ' + errors[variant][:70]:>11}")
    cold = "cold process"
    if not results["pjrt compiled"]["first_step_cold_process"]:
        cold = "Dynamo reset, but not the first compile in this process"

    print(
        f"  pjrt compiled first step: {summary['pjrt_compiled_first_step_s']:.2f} s ({cold})\n"
        f"  host overhead per compiled step: {summary['host_overhead_us']:.0f} us "
        f"(median pjrt compiled - median plain JAX); pjrt compiled / plain JAX = "
        f"{summary['pjrt_compiled_over_plain_jax']:.2f}\n"
        f"  of which torch.pjrt.synchronize() with nothing pending: "
        f"{summary['pjrt_synchronize_idle_us']:.0f} us\n"
        f"  host floor: the compiled step with every pjrt graph answering from a cache "
        f"(no device work, no JAX call): {summary['host_floor_ms']:.3f} ms = "
        f"{summary['host_floor_ms'] / jax_ms:.2f}x plain JAX"
    )
    for phase, d in metrics.items():
        print(f"  torch_pjrt.metrics, pjrt compiled {phase}:")
        for k, v in d.items():
            print(f"    {k}: {v}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), help="default: both")
    ap.add_argument("--steps", type=int, help="timed steps (default: 20 / 100)")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads for CPU PyTorch")
    ap.add_argument("--json", type=pathlib.Path, help="write the numbers here")
    args = ap.parse_args(argv)

    load_start = os.getloadavg()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = "set by --threads" if args.threads is not None else "PyTorch default"
    print(
        f"torch {torch.__version__}, jax {jax.__version__}, pjrt device "
        f"{torch.pjrt.get_device_name()} (JAX {jax.devices()[0]}), python "
        f"{platform.python_version()}, {os.cpu_count()} CPUs\n"
        f"PyTorch CPU threads: {torch.get_num_threads()} ({threads})\n"
        f"load average at start: {' '.join(f'{x:.2f}' for x in load_start)}",
        flush=True,
    )
    names = [args.workload] if args.workload else list(WORKLOADS)
    out = {
        "torch": torch.__version__,
        "jax": jax.__version__,
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_start": load_start,
        "workloads": {},
    }
    for i, name in enumerate(names):
        spec = WORKLOADS[name]
        out["workloads"][name] = run_workload(name, spec, args.steps or spec["steps"], i == 0)
    return finish(out, args.json)


# glibc's malloc set to keep the memory a process frees for its next allocations (one
# arena, no mmap, no trimming). On JAX's CPU platform every XLA run allocates its
# temporary buffer anew, on a worker thread; glibc serves a block over 64 MB there with a
# fresh mmap and unmaps it at free, so each run page-faults it in again (the
# compute-bound training step: one ~140 MB block, ~38,000 faults, a third of the step;
# a program half that size stays under the limit and reuses its memory). The variables
# are read when a process starts: :func:`reuse_malloc` runs the script again with them.
REUSE_MALLOC = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1),
}


def reuse_malloc(wanted: bool) -> str:
    """Run this script again with :data:`REUSE_MALLOC` in its environment (where
    ``wanted``, on glibc, and not done yet); returns how host memory is allocated now:
    ``"reuse"`` or ``"system"``."""
    done = all(os.environ.get(k) == v for k, v in REUSE_MALLOC.items())
    if done or not wanted or platform.libc_ver()[0] != "glibc":
        return "reuse" if done else "system"
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **REUSE_MALLOC})
    raise AssertionError("unreachable")  # (execve does not return)


def finish(out: dict, json_path: pathlib.Path | None) -> int:
    """Print the load average at the end, write the results as JSON if asked."""
    out["load_end"] = os.getloadavg()
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in out['load_end'])}")
    if json_path:
        json_path.write_text(json.dumps(out, indent=1, default=str))
        print(f"wrote {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
