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
``pjrt compiled static``  ``cache_implementation="static"``, the forward compiled with
                          ``torch.compile(backend="pjrt")`` (transformers' own compile
                          path, ``CompileConfig(backend="pjrt", mode=None)``)

Columns: ``tok/s`` (median over ``--runs`` timed runs after one warm-up run, which
compiles), ``first s`` (the warm-up run), ``x CPU`` (tok/s over CPU eager's), and
whether the tokens equal CPU eager's. ``--threads`` pins CPU PyTorch's threads (1 by
default: the machine is shared). The load average is printed at start and end.
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

    def pjrt_compile_config():
        config = CompileConfig(backend="pjrt", mode=None)  # (reduce-overhead is CUDA graphs)
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
        "pjrt compiled static": (
            "pjrt",
            "eager",
            lambda: {"cache_implementation": "static", "compile_config": pjrt_compile_config()},
        ),
    }


def run(name, device, mode, extra, base, ids, new_tokens: int, runs: int) -> dict:
    model = base if device == "cpu" else build(base.config.vocab_size).to(device)
    x = ids.to(device)
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
    results, reference = {}, None
    print(f"\nGPT-2 (4 layers, n_embd 128), prompt {args.prompt}, {args.new_tokens} new tokens")
    print(f"  {'variant':22} {'tok/s':>8} {'first s':>8} {'x CPU':>6}  tokens")
    for name, (device, mode, extra) in chosen.items():
        try:
            r = run(name, device, mode, extra, base, ids, args.new_tokens, args.runs)
        except Exception as exc:  # noqa: BLE001  (a row that fails is reported, not fatal)
            print(f"  {name:22} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            continue
        if reference is None and name == "CPU eager":
            reference = r
        same = "?" if reference is None else str(torch.equal(r["tokens"], reference["tokens"]))
        ratio = r["tok_s"] / reference["tok_s"] if reference else float("nan")
        print(f"  {name:22} {r['tok_s']:8.1f} {r['first_s']:8.2f} {ratio:6.2f}  equal: {same}")
        results[name] = {
            "tok_s": r["tok_s"],
            "first_s": r["first_s"],
            "x_cpu": ratio,
            "tokens_equal": same,
        }
    print("\nload average at end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
