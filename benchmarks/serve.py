"""Serving throughput: ``vllm serve`` on pjrt against transformers' ``generate`` on CPU.

Usage::

    .venv/bin/python benchmarks/serve.py
    .venv/bin/python benchmarks/serve.py --concurrency 1 4 16 --new-tokens 64 --json /tmp/s.json
    .venv/bin/python benchmarks/serve.py --models 512x8 --enforce-eager  # vLLM's eager path

The models are the tests' tiny Llama (``tests/vllm_scripts/tiny_models.py``: built from
a config, a tokenizer trained on the spot, random weights from a fixed seed) at two sizes,
``--models`` (hidden size x layers): 64x2, where the time of a step is all host work,
and 512x8 (26M parameters), where the device work is a real share of it; float32.

Rows:

``CPU transformers``  ``generate`` on CPU PyTorch eager, one stream, greedy,
                      ``--new-tokens`` tokens (``eos_token_id`` off), torch pinned to
                      ``--threads`` threads (1 by default: the machine is shared)
``pjrt vllm c=N``     ``vllm serve`` on pjrt (127.0.0.1), N streaming
                      ``/v1/completions`` requests sent at once, each ``--new-tokens``
                      greedy tokens (``ignore_eos``), distinct prompts; vLLM's default
                      asynchronous scheduling (step n+1 prepared on the host while
                      step n runs on the device)
``pjrt vllm c=N sync`` with ``--compare-sync``: the same with ``--no-async-scheduling``
                      (each step waits for the last one's tokens), a second server

Columns: ``tok/s`` (output tokens of all requests over the wall time from the first
request sent to the last token received; median over ``--runs`` rounds after
``--warmup-rounds`` warm-up rounds per concurrency, 1 by default, which compiles the
prefill's programs and the decode graph of the whole batch; the decode graph of each
other (requests, blocks) bucket an arrival pattern reaches is captured at its first
step, up to a second or so, so that with one warm-up round a measured round that meets a
new bucket is slower: more warm-up rounds measure the steady state), ``x CPU`` (tok/s
over CPU transformers' single-stream tok/s), ``TTFT ms`` (the median over the requests
of the time to the first streamed token; for CPU, ``generate`` of one token), ``rounds``
(the slowest and the fastest round's tok/s). The targets of issue 21 item 4: c=16 at
least 4x CPU, c=1 at least 1x. The load average is printed at start and end.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "vllm_scripts"))

import launch  # noqa: E402
import tiny_models  # noqa: E402

PROMPTS = tiny_models.SHORT_PROMPTS


def cpu_transformers(path, new_tokens: int, runs: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    ids = tok(PROMPTS[0], return_tensors="pt").input_ids

    def gen(n):
        with torch.no_grad():
            return model.generate(
                ids,
                max_new_tokens=n,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
                attention_mask=torch.ones_like(ids),
            )

    gen(new_tokens)  # warm-up
    rates, firsts = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = gen(new_tokens)
        rates.append((out.shape[1] - ids.shape[1]) / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        gen(1)
        firsts.append(time.perf_counter() - t0)
    return {
        "tok_s": statistics.median(rates),
        "range": (min(rates), max(rates)),
        "ttft_ms": 1e3 * statistics.median(firsts),
    }


def start_server(
    path, max_seqs: int, eager: bool, log, sync: bool = False
) -> tuple[subprocess.Popen, str]:
    args = [
        "--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", str(max_seqs),
        "--kv-cache-memory-bytes", str(64 << 20), "--seed", "0",
    ]  # fmt: skip
    args += ["--enforce-eager"] * eager + ["--no-async-scheduling"] * sync
    proc, url = launch.start(path, args, log)
    try:
        launch.wait_healthy(proc, url, 600)
    except AssertionError as e:
        proc.kill()
        raise RuntimeError(f"{e}; log: {log.name}") from None
    return proc, url


def one_request(url: str, model: str, prompt: str, new_tokens: int, t_start: float):
    import httpx

    body = {
        "model": model, "prompt": prompt, "max_tokens": new_tokens, "temperature": 0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    first = None
    tokens = 0
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if first is None and chunk.get("choices"):
                first = time.perf_counter() - t_start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return first, tokens, time.perf_counter()


def round_at(url: str, model: str, concurrency: int, new_tokens: int) -> dict:
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        futures = [
            pool.submit(
                one_request, url, model, PROMPTS[i % len(PROMPTS)] + f" {i}", new_tokens, t0
            )
            for i in range(concurrency)
        ]
        results = [f.result() for f in futures]
    end = max(r[2] for r in results)
    tokens = sum(r[1] for r in results)
    assert tokens == concurrency * new_tokens, (tokens, concurrency, new_tokens)
    return {"tok_s": tokens / (end - t0), "ttft_ms": 1e3 * statistics.median(r[0] for r in results)}


def bench_model(hidden: int, layers: int, args, work: pathlib.Path) -> dict:
    """The rows of one model: CPU transformers, then vllm serve on pjrt at each
    concurrency."""
    path = tiny_models.build("llama", work / f"llama_{hidden}x{layers}", hidden, layers)
    rows = {"CPU transformers": cpu_transformers(path, args.new_tokens, args.runs)}
    for sync in (False, True) if args.compare_sync else (False,):
        name = f"serve_{hidden}x{layers}{'_sync' * sync}.log"
        with open(work / name, "w") as log:
            proc, url = start_server(path, max(args.concurrency), args.enforce_eager, log, sync)
            try:
                for c in args.concurrency:
                    for _ in range(args.warmup_rounds):  # (compiles)
                        round_at(url, str(path), c, args.new_tokens)
                    rounds = [
                        round_at(url, str(path), c, args.new_tokens) for _ in range(args.runs)
                    ]
                    rates = [r["tok_s"] for r in rounds]
                    rows[f"pjrt vllm c={c}{' sync' * sync}"] = {
                        "tok_s": statistics.median(rates),
                        "range": (min(rates), max(rates)),
                        "ttft_ms": statistics.median(r["ttft_ms"] for r in rounds),
                    }
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
    return rows


def _size(text: str) -> tuple[int, int]:
    hidden, layers = text.lower().split("x")
    return int(hidden), int(layers)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup-rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--models", type=_size, nargs="+", default=[(64, 2), (512, 8)],
        help="Llama sizes as HIDDENxLAYERS (default: 64x2 512x8)",
    )  # fmt: skip
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument(
        "--compare-sync", action="store_true",
        help="also serve with --no-async-scheduling (rows 'c=N sync')",
    )  # fmt: skip
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    print("load average at start: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    work = pathlib.Path(tempfile.mkdtemp(prefix="serve_bench_"))
    results = {}
    for hidden, layers in args.models:
        results[f"{hidden}x{layers}"] = bench_model(hidden, layers, args, work)

    mode = "eager" if args.enforce_eager else "compiled"
    for (hidden, layers), rows in zip(args.models, results.values()):
        base = rows["CPU transformers"]["tok_s"]
        print(
            f"\nLlama hidden {hidden}, {layers} layers, {args.new_tokens} new tokens a "
            f"request, vLLM {mode}, torch threads {args.threads}"
        )
        print(f"{'':20} {'tok/s':>9} {'x CPU':>7} {'TTFT ms':>9} {'rounds':>11}")
        for name, row in rows.items():
            lo, hi = row["range"]
            print(
                f"{name:20} {row['tok_s']:9.1f} {row['tok_s'] / base:7.2f} "
                f"{row['ttft_ms']:9.1f} {lo:5.0f}-{hi:<5.0f}"
            )
    print("\nload average at end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    if args.json:
        payload = {"args": {**vars(args), "models": list(results)}, "models": results}
        pathlib.Path(args.json).write_text(json.dumps(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
