"""Greedy generation, tokens per second: a small GPT-2 on CPU PyTorch and on pjrt, in one run.

Usage::

    .venv/bin/python benchmarks/generate.py
    .venv/bin/python benchmarks/generate.py --new-tokens 64 --runs 5 --json /tmp/gen.json

The model is ``transformers.GPT2LMHeadModel`` from a config (no download): 4 layers,
n_embd 128, 4 heads, vocabulary 1000, random weights (seeded). One prompt of
``--prompt`` tokens, ``--new-tokens`` greedy tokens (``min_new_tokens`` forces the
length), batch 1, ``torch.no_grad()``.

Rows:

``CPU eager``             the model on the CPU, dynamic cache
``CPU inductor static``   ``cache_implementation="static"``, forward compiled by inductor
``pjrt eager``            ``torch_pjrt.mode("eager")``, dynamic cache: one program per op
``pjrt fused``            ``torch_pjrt.mode("fused")``, dynamic cache: each decoding step's
                          ops recorded and run as one program when the next token is read
``pjrt compiled dynamic`` the default dynamic cache, the forward replaced by
                          ``torch.compile(model.forward, backend="pjrt")`` (as a user
                          compiles a model for ``generate``): the growing cache's graph
                          runs padded to buckets of its length, one program per bucket
``pjrt compiled static``  ``cache_implementation="static"``, the forward compiled with
                          ``torch.compile(backend="pjrt")`` (transformers' own compile
                          path, ``CompileConfig(backend="pjrt", mode=None)``), in the
                          default mode (fused: ``generate()``'s own small ops per token,
                          logits processors, stopping criteria, the mask, are recorded
                          and run as one program where a value is read)
``pjrt reduce-overhead static``  the same with ``CompileConfig(backend="pjrt",
                          mode="reduce-overhead")``: each decoding graph is captured at
                          its second call and replayed (``torch_pjrt/compile/replay.py``)
``pjrt captured static``  ``torch_pjrt.mode("eager")``, a ``transformers.StaticCache``, no
                          ``generate()``: the prompt is prefilled uncaptured, then one
                          one-token decoding step is captured into a ``torch.pjrt.Graph``
                          and replayed per token, each replay one XLA program: the
                          forward, the argmax, the token fed back into the static input
                          (``tokens.copy_``) and written into a preallocated device buffer
                          of the sequence at a device-side position (``index_copy_``,
                          ``add_``), as a CUDA-graphs decoding loop does; the buffer is
                          read once at the end (no host read per token)

Columns: ``tok/s`` (median over ``--runs`` timed runs after one warm-up run, which
compiles), ``first s`` (the warm-up run), ``x CPU`` (tok/s over CPU eager's), and
whether the tokens equal CPU eager's. ``--threads`` pins CPU PyTorch's threads (1 by
default: the machine is shared). The load average is printed at start and end.

The captured row: the cache is allocated once (``early_initialization``) and written in
place, so the graph's inputs and outputs (the cache's key and value tensors, its position
counter, ``tokens``) are the same tensors in every run. Each run begins with
``cache.reset()``, which zeroes them on the device, then prefills; the graph is captured
once, in the warm-up run, after its prefill, and replayed unchanged by the timed runs (no
recapture). The positions come from the cache's device-side counter
(``cumulative_length``, advanced in place by the captured ``update``); this transformers
has no ``cache_position`` argument. A timed run is what ``generate()`` is for the other
rows: the reset, the prefill (the first new token), ``--new-tokens`` - 1 replays, and the
read of the tokens. The row also prints the capture's seconds (in the warm-up run) and the
host microseconds of one ``replay()`` call (median over the timed runs' replays). A timed
run waits for its prefill's device work before the replay loop, as the JAX loop does.

Below the table (when the captured row runs, or when no ``--variants`` are chosen), the
one-token decoding step alone, in microseconds per step, against the same step written
directly in JAX (``benchmarks/decode_jax.py``: jax.numpy, the HF model's weights converted
with numpy, a static cache of shape (layers, 2, batch, heads, max_len, head_dim), one
``jax.jit`` with the cache donated, the greedy argmax in it, the position a device scalar
it advances). Both are timed the same way: the replay loop alone, after the prefill, from
before its first step to after the device has finished its last (``--new-tokens`` - 1
steps, no host read or wait in between), divided by the steps; the median over the timed
runs. The captured loop is what the row runs per token (one ``replay()``), closed by
one ``torch.pjrt.synchronize()``; the JAX
loop is the jitted call per token (its output token fed back as the next input, kept in a
list), closed by ``jax.block_until_ready``. The JAX step is checked first against the HF
model on the CPU: its logits at every prompt position and the first 4 decoding steps (fed
CPU eager's tokens) within 1e-4, and its greedy tokens (the prompt prefilled one token at
a time through the step) equal CPU eager's. The ``call us host`` is one jitted call's host
time (the counterpart of ``replay()``'s). The last line is captured / JAX, the target of
issue 18 item 5 being at most 1.3x: ``--rounds`` runs of each, alternating (a captured
run, then a JAX run), the median of the rounds' ratios (this machine's speed drifts by
up to 2x within minutes, so two medians taken minutes apart do not compare).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

import torch

import torch_pjrt


def build(vocab: int):
    import transformers as hf

    torch.manual_seed(0)
    config = hf.GPT2Config(
        n_layer=4,
        n_embd=128,
        n_head=4,
        vocab_size=vocab,
        n_positions=256,
        bos_token_id=0,
        eos_token_id=0,
    )
    return hf.GPT2LMHeadModel(config).eval()


def generate(model, ids, new_tokens: int, **extra) -> torch.Tensor:
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
            **extra,
        )
    return out.cpu()


def variants():
    from transformers import CompileConfig

    def pjrt_compile_config(mode=None):
        config = CompileConfig(backend="pjrt", mode=mode)
        # NOTE: transformers compiles by itself only on the device types it knows;
        # this flag of CompileConfig extends that to every device
        config._compile_all_devices = True
        return config

    def inductor_config():
        config = CompileConfig(backend="inductor", mode="default")
        config._compile_all_devices = True
        return config

    return {
        "CPU eager": ("cpu", None, {}),
        "CPU inductor static": (
            "cpu",
            None,
            lambda: {"cache_implementation": "static", "compile_config": inductor_config()},
        ),
        "pjrt eager": ("pjrt", "eager", {}),
        "pjrt fused": ("pjrt", "fused", {}),
        "pjrt compiled dynamic": ("pjrt", None, COMPILED_FORWARD),
        "pjrt compiled static": (
            "pjrt",
            None,  # (the default mode: generate()'s own ops recorded, as a user runs it)
            lambda: {"cache_implementation": "static", "compile_config": pjrt_compile_config()},
        ),
        "pjrt reduce-overhead static": (
            "pjrt",
            None,
            lambda: {
                "cache_implementation": "static",
                "compile_config": pjrt_compile_config("reduce-overhead"),
            },
        ),
        "pjrt captured static": ("pjrt", "eager", CAPTURED),
    }


CAPTURED = "captured"  # the row's extra: run_captured() rather than generate()
COMPILED_FORWARD = "compiled forward"  # the row's extra: the forward compiled, no kwargs


def run(name, device, mode, extra, base, ids, new_tokens: int, runs: int) -> dict:
    model = base if device == "cpu" else build(base.config.vocab_size).to(device)
    x = ids.to(device)
    if extra == CAPTURED:
        with torch_pjrt.mode(mode), torch.no_grad():
            return run_captured(model, x, new_tokens, runs)
    if extra == COMPILED_FORWARD:
        model.forward = torch.compile(model.forward, backend="pjrt")
        extra = {}
    kwargs = extra() if callable(extra) else extra
    context = torch_pjrt.mode(mode) if mode else _null()
    with context:
        start = time.perf_counter()
        tokens = generate(model, x, new_tokens, **kwargs)
        first = time.perf_counter() - start
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            generate(model, x, new_tokens, **kwargs)
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {"tok_s": new_tokens / median, "first_s": first, "tokens": tokens}


def run_captured(model, x, new_tokens: int, runs: int) -> dict:
    from transformers import StaticCache

    config, (batch, prompt) = model.config, x.shape
    length = prompt + new_tokens
    cache = StaticCache(config=config, max_cache_len=length)
    # allocated now, so that every run's reset() zeroes the same (device) tensors
    cache.early_initialization(
        batch, config.n_head, config.n_embd // config.n_head, torch.float32, x.device
    )
    out = torch.zeros(batch, length, dtype=torch.long, device=x.device)
    out[:, :prompt].copy_(x)
    tokens = torch.zeros(batch, 1, dtype=torch.long, device=x.device)  # the static input
    at = torch.zeros(1, dtype=torch.long, device=x.device)  # where the next token goes
    graph, captured, replays, steps = torch.pjrt.Graph(), {}, [], []

    def once(timed: bool) -> torch.Tensor:
        cache.reset()
        tokens.copy_(model(x, cache=cache).logits[:, -1:].argmax(-1))
        out[:, prompt : prompt + 1].copy_(tokens)
        at.fill_(prompt + 1)
        if not captured:
            start = time.perf_counter()
            with torch.pjrt.graph(graph):
                logits = model(tokens, cache=cache).logits
                tokens.copy_(logits[:, -1:].argmax(-1))  # fed back, as a CUDA graph would
                out.index_copy_(1, at, tokens)
                at.add_(1)
            captured["s"] = time.perf_counter() - start
        if timed:  # (the prefill's device work done first, as the JAX loop's)
            torch.pjrt.synchronize()
        loop = time.perf_counter()
        for _ in range(prompt + 1, length):
            start = time.perf_counter()
            graph.replay()
            if timed:
                replays.append(time.perf_counter() - start)
        if timed and length > prompt + 1:
            torch.pjrt.synchronize()  # the replays' device work done, then the clock read
            steps.append((time.perf_counter() - loop) / (length - prompt - 1))
        return out.cpu()

    start = time.perf_counter()
    tokens_out = once(timed=False)
    first = time.perf_counter() - start
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        again = once(timed=True)
        times.append(time.perf_counter() - start)
        if not torch.equal(again, tokens_out):
            raise RuntimeError("a replayed run's tokens differ from the warm-up run's")

    def decode_round() -> float:  # one timed run; its replay loop's us per step
        once(timed=True)
        return steps[-1] * 1e6

    return {
        "tok_s": new_tokens / statistics.median(times),
        "first_s": first,
        "tokens": tokens_out,
        "capture_s": captured["s"],
        "replay_us": statistics.median(replays) * 1e6 if replays else float("nan"),
        "step_us": statistics.median(steps) * 1e6 if steps else float("nan"),
        "round": decode_round,
    }


def run_jax(base, ids, new_tokens: int, runs: int, check_steps: int = 4) -> dict:
    """The one-token decoding step in plain JAX (``benchmarks/decode_jax.py``), on the
    pjrt platform's first device: checked against the HF model on the CPU, then timed as
    the captured row's replay loop is (see the module docstring)."""
    import decode_jax
    import jax
    import numpy as np

    config, (batch, prompt) = base.config, ids.shape
    length = prompt + new_tokens
    device = jax.devices(torch_pjrt.current_platform())[0]
    params = jax.device_put(decode_jax.params_from(base), device)
    step, logits_fn = decode_jax.compile_step(config), decode_jax.compile_logits(config)
    prompt_ids = jax.device_put(ids.numpy().astype(np.int32), device)

    # the check: the greedy tokens equal CPU eager's, and the logits of every position of
    # the prompt and of the first ``check_steps`` decoding steps (fed CPU eager's tokens)
    # equal the HF model's on the CPU within 1e-4
    expected = generate(base, ids, new_tokens)
    with torch.no_grad():
        hf_logits = base(expected).logits[0].numpy()
    cache, pos = decode_jax.empty_cache(config, batch, length, device), jnp_int(0, device)
    fed = jax.device_put(expected.numpy().astype(np.int32), device)
    ours = []
    for i in range(prompt + check_steps):
        logits, cache = logits_fn(params, cache, fed[:, i], pos)
        ours.append(np.asarray(logits)[0])
        pos = pos + 1
    logit_diff = float(np.abs(np.stack(ours) - hf_logits[: prompt + check_steps]).max())
    if logit_diff > 1e-4:
        raise RuntimeError(f"the JAX step's logits differ from the HF model's by {logit_diff}")

    def once():
        cache = decode_jax.empty_cache(config, batch, length, device)
        pos, token = jnp_int(0, device), None
        for i in range(prompt):  # the prefill, one token at a time through the same step
            token, cache, pos = step(params, cache, prompt_ids[:, i], pos)
        out = [token]  # the new tokens, (batch,) each: joined after the loop
        jax.block_until_ready(token)
        loop, hosts = time.perf_counter(), []
        for _ in range(prompt + 1, length):
            start = time.perf_counter()
            token, cache, pos = step(params, cache, token, pos)
            hosts.append(time.perf_counter() - start)
            out.append(token)
        jax.block_until_ready(token)
        per_step = (time.perf_counter() - loop) / max(length - prompt - 1, 1)
        new = np.stack([np.asarray(t) for t in out], axis=1)
        return np.concatenate([ids.numpy(), new], axis=1), per_step, hosts

    start = time.perf_counter()
    tokens, _, _ = once()
    first = time.perf_counter() - start
    steps, hosts = [], []
    for _ in range(runs):
        again, per_step, host = once()
        steps.append(per_step)
        hosts.extend(host)
        if not np.array_equal(again, tokens):
            raise RuntimeError("a timed run's tokens differ from the warm-up run's")
    return {
        "step_us": statistics.median(steps) * 1e6,
        "host_us": statistics.median(hosts) * 1e6 if hosts else float("nan"),
        "first_s": first,
        "logit_diff": logit_diff,
        "tokens_equal": bool(np.array_equal(tokens, expected.numpy())),
        "round": lambda: once()[1] * 1e6,
    }


def jnp_int(value: int, device):
    import jax
    import numpy as np

    return jax.device_put(np.int32(value), device)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=32, help="greedy tokens generated")
    parser.add_argument("--runs", type=int, default=3, help="timed runs (the median is kept)")
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1, help="CPU PyTorch threads")
    parser.add_argument("--variants", help="comma-separated subset of the rows")
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here")
    parser.add_argument(
        "--rounds", type=int, default=15, help="alternating rounds of the decode-step ratio"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, pjrt platform {torch_pjrt.current_platform()}, "
        f"{os.cpu_count()} CPUs, CPU threads {args.threads}; load average at start: "
        + " ".join(f"{x:.2f}" for x in os.getloadavg()),
        flush=True,
    )
    base = build(args.vocab)
    ids = torch.randint(1, args.vocab, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    chosen = variants()
    if args.variants:
        chosen = {k: v for k, v in chosen.items() if k in args.variants.split(",")}
    results, reference, rounds = {}, None, {}
    print(f"\nGPT-2 (4 layers, n_embd 128), prompt {args.prompt}, {args.new_tokens} new tokens")
    print(f"  {'variant':27} {'tok/s':>8} {'first s':>8} {'x CPU':>6}  tokens")
    for name, (device, mode, extra) in chosen.items():
        try:
            r = run(name, device, mode, extra, base, ids, args.new_tokens, args.runs)
        except Exception as exc:  # noqa: BLE001  (a row that fails is reported, not fatal)
            print(f"  {name:27} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            continue
        if reference is None and name == "CPU eager":
            reference = r
        same = "?" if reference is None else str(torch.equal(r["tokens"], reference["tokens"]))
        ratio = r["tok_s"] / reference["tok_s"] if reference else float("nan")
        line = f"  {name:27} {r['tok_s']:8.1f} {r['first_s']:8.2f} {ratio:6.2f}  equal: {same}"
        if "capture_s" in r:
            line += f"  (capture {r['capture_s']:.3f} s, replay() {r['replay_us']:.0f} us host)"
        print(line)
        results[name] = {
            "tok_s": r["tok_s"],
            "first_s": r["first_s"],
            "x_cpu": ratio,
            "tokens_equal": same,
        }
        for key in ("capture_s", "replay_us", "step_us"):
            if key in r:
                results[name][key] = r[key]
        if "round" in r:
            rounds[name] = r["round"]
    captured = results.get("pjrt captured static", {}).get("step_us")
    if captured is not None or not args.variants:
        print("\none-token decode step, us per step (replay loop alone, synchronized at its end)")
        try:
            j = run_jax(base, ids, args.new_tokens, args.runs)
        except Exception as exc:  # noqa: BLE001
            print(f"  plain JAX step failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")
        else:
            print(
                f"  {'plain JAX jit (donated)':27} {j['step_us']:8.1f}  (call {j['host_us']:.0f}"
                f" us host; first {j['first_s']:.2f} s; tokens equal: {j['tokens_equal']}, "
                f"logits max diff {j['logit_diff']:.1e})"
            )
            results["plain JAX decode step"] = {k: v for k, v in j.items() if k != "round"}
            if captured is not None:
                ours_round = rounds["pjrt captured static"]
                ours, plain, ratios = [], [], []
                for _ in range(args.rounds):  # (alternating: the machine's speed drifts)
                    ours.append(ours_round())
                    plain.append(j["round"]())
                    ratios.append(ours[-1] / plain[-1])
                ratio = statistics.median(ratios)
                print(
                    f"  {'pjrt captured static':27} {captured:8.1f}  (the timed runs above)\n"
                    f"  alternating, {args.rounds} rounds of each: captured "
                    f"{statistics.median(ours):.1f}, JAX {statistics.median(plain):.1f}; "
                    f"captured / JAX {ratio:.2f}x, rounds {min(ratios):.2f}-{max(ratios):.2f} "
                    f"(target <= 1.3x: {'met' if ratio <= 1.3 else 'not met'})"
                )
                results["captured_over_jax"] = ratio
                results["captured_over_jax_rounds"] = ratios
    print("\nload average at end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
