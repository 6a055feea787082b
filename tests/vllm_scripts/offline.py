"""vllm.LLM on pjrt, as a user runs it: one engine a scenario, results as JSON lines.

    python offline.py MODELS_DIR SCENARIO...

Each scenario prints ``RESULT <json>`` with the token ids vLLM produced; the test
(tests/test_vllm.py) compares them with transformers on CPU. MODELS_DIR holds the
models of tiny_models.py, one directory a kind.
"""

from __future__ import annotations

import json
import os
import sys

import tiny_models
from vllm import LLM, SamplingParams

PROMPTS = tiny_models.PROMPTS
MAX_TOKENS = 12


def _tokens(outputs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


def _metric(llm, name: str) -> float:
    return sum(m.value for m in llm.get_metrics() if m.name == name and hasattr(m, "value"))


_engines: list[LLM] = []


def _engine(models: str, kind: str, **kwargs) -> LLM:
    options = dict(
        model=os.path.join(models, kind),
        dtype="float32",
        max_model_len=128,
        max_num_seqs=4,
        kv_cache_memory_bytes=8 << 20,
        seed=0,
        disable_log_stats=False,
    )
    options.update(kwargs)
    _engines.append(LLM(**options))
    return _engines[-1]


def greedy(models: str, kind: str, **kwargs) -> dict:
    llm = _engine(models, kind, **kwargs)
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return {"greedy": _tokens(llm.generate(PROMPTS, sp))}


def llama(models: str) -> dict:
    """The compiled default, with a prefill budget of 16 tokens (prompts of 19 and 29
    tokens go in chunks), a second round served from the prefix cache, and sampling."""
    llm = _engine(models, "llama", max_num_batched_tokens=16)
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    first = llm.generate(PROMPTS, sp)
    second = llm.generate(PROMPTS, sp)
    sampled = {}
    for name, params in {
        "temperature": dict(temperature=0.8),
        "top_k_top_p": dict(temperature=1.0, top_k=20, top_p=0.9),
        "min_p_penalties": dict(
            temperature=1.0,
            min_p=0.05,
            presence_penalty=0.5,
            frequency_penalty=0.5,
            repetition_penalty=1.2,
        ),
    }.items():
        runs = []
        for seed in (1, 1, 2):
            p = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, seed=seed, **params)
            runs.append(_tokens(llm.generate(PROMPTS, p)))
        sampled[name] = runs
    lp = llm.generate(
        PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=1, logprobs=3, prompt_logprobs=2)
    )[0]
    logprobs = {str(t): v.logprob for t, v in lp.outputs[0].logprobs[0].items()}
    prompt_logprobs = [
        {str(t): v.logprob for t, v in row.items()} for row in lp.prompt_logprobs[1:]
    ]
    return {
        "logprobs": logprobs,
        "prompt_logprobs": prompt_logprobs,
        "greedy": _tokens(first),
        "greedy_again": _tokens(second),
        "cached_tokens_again": [o.num_cached_tokens for o in second],
        "sampled": sampled,
        "prefix_cache_hits": _metric(llm, "vllm:prefix_cache_hits"),
        "async_scheduling": llm.llm_engine.vllm_config.scheduler_config.async_scheduling,
    }


def preemption(models: str) -> dict:
    """A KV cache of 6 blocks (96 tokens) for four requests that need 153: vLLM
    preempts. (A block of the tiny Llama: 16 tokens x 2 layers x K and V x 2 heads x 16
    x 4 bytes = 8192 bytes.)"""
    llm = _engine(
        models, "llama", enforce_eager=True, kv_cache_memory_bytes=6 * 8192, max_model_len=64
    )
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    out = _tokens(llm.generate(PROMPTS, sp))
    return {"greedy": out, "preemptions": _metric(llm, "vllm:num_preemptions")}


def unsupported(models: str) -> dict:
    """Options the plugin does not support: the error each gives, before an engine starts."""
    errors = {}
    for name, options in {
        "lora": dict(enable_lora=True),
        "quantization": dict(quantization="fp8", dtype="bfloat16"),
        "speculative": dict(
            speculative_config={
                "method": "ngram",
                "num_speculative_tokens": 2,
                "prompt_lookup_max": 2,
            }
        ),
    }.items():
        try:
            _engine(models, "llama", **options)
            errors[name] = None
        except Exception as e:  # noqa: BLE001  (the test reads the type and message)
            errors[name] = f"{type(e).__name__}: {e}"
    return {"errors": errors}


def gemma2(models: str) -> dict:
    """Gemma 2 (compiled): the 29-token prompt, past its sliding window of 8, with
    prompt logprobs, then 12 greedy tokens with their logprobs (decode steps captured)."""
    return _logprobs_of_prompt_and_tokens(_engine(models, "gemma2"))


def gemma4(models: str) -> dict:
    """Gemma 4 (compiled), whose last two layers attend over the KV cache of the first
    two (vLLM's KV sharing: the shared layers write nothing, and the runner captures no
    decode graphs, model_runner.py), as :func:`gemma2`, with the attention paths."""
    llm = _engine(models, "gemma4")
    return {**_logprobs_of_prompt_and_tokens(llm), "paths": _attention_paths(llm)}


def _attention_paths(llm) -> dict:
    """The worker's count of attention paths taken (torch_pjrt.metrics)."""
    return llm.collective_rpc("pjrt_metrics")[0].get("attention_paths", {})


def _logprobs_of_prompt_and_tokens(llm) -> dict:
    sp = SamplingParams(
        temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=3, prompt_logprobs=3
    )
    out = llm.generate(PROMPTS[2:3], sp)[0]
    rows = out.prompt_logprobs[1:] + out.outputs[0].logprobs
    return {
        "greedy": _tokens([out]),
        "logprobs": [{str(t): v.logprob for t, v in row.items()} for row in rows],
    }


def slot_mapping(models: str) -> dict:
    """The model runner's slot mapping on the host (slot_mapping.on_host) against the
    torch-ops version of vLLM's kernel on pjrt, for a batch of mixed prefill and decode
    rows over random block tables: the slots each computes (no engine)."""
    import numpy as np
    import torch
    from vllm.v1.worker.block_table import BlockTable

    from torch_pjrt.serving.vllm import slot_mapping as sm

    rng = np.random.default_rng(0)
    table = BlockTable(16, 4, 8, 64, False, torch.device("pjrt"), 1)
    table.block_table.np[:] = rng.permutation(64)[: 4 * 8].reshape(4, 8) + 1
    table.block_table.copy_to_gpu()
    q_lens, computed = np.array([5, 1, 17, 1]), np.array([0, 40, 3, 100])
    req = np.repeat(np.arange(4), q_lens)
    starts = np.concatenate([[0], np.cumsum(q_lens)])
    pos = computed[req] + np.arange(req.size) - starts[req]
    sm.on_host([table], req, pos)
    host = table.slot_mapping.gpu.cpu().tolist()
    table.slot_mapping.gpu.fill_(7)
    sm.compute_slot_mapping(
        req.size, 64, torch.tensor(starts, dtype=torch.int32, device="pjrt"),
        torch.tensor(pos, device="pjrt"), table.block_table.gpu, 8, table.slot_mapping.gpu,
        16, 1, 0, 1, -1, 1024,
    )  # fmt: skip
    return {"host": host, "kernel": table.slot_mapping.gpu.cpu().tolist(), "tokens": req.size}


def kv_writes(models: str) -> dict:
    """A decode graph's KV writes of all layers as one op (attention.write_layers)
    against the same writes made on CPU tensors, three caches and one that is a view of
    a larger tensor: each cache's values after the writes (no engine)."""
    import torch

    from torch_pjrt.serving.vllm import attention

    torch.manual_seed(0)
    base = torch.randn(2, 6, 2, 4, 8)
    caches = [torch.randn(6, 2, 4, 8) for _ in range(3)]
    rows = [torch.randn(3, 2, 8) for _ in range(4)]
    block, offset = torch.tensor([2, 5, 0]), torch.tensor([1, 3, 0])
    on_pjrt = [c.to("pjrt") for c in caches]
    base_pjrt = base.to("pjrt")
    on_pjrt.append(base_pjrt[1])
    caches.append(base[1])
    pb, po = block.to("pjrt"), offset.to("pjrt")
    attention.write_layers([(c, r.to("pjrt"), pb, po) for c, r in zip(on_pjrt, rows)])
    for c, r in zip(caches, rows):
        c[block, :, offset] = r
    return {"equal": [torch.equal(a.cpu(), b) for a, b in zip(on_pjrt, caches)]}


def new_lengths(models: str) -> dict:
    """Prompts of new lengths in buckets the engine has run: the programs compiled
    (torch_pjrt's counters, read as users read them: ``collective_rpc``) by batches of
    two prompts of 9 and 12 tokens, of 7 and 15, then of 6 and 14 (the same buckets: 32
    tokens a prefill step, 2 requests, up to 2 KV blocks each; the second batch meets
    the step boundaries the third meets), then of three prompts (a new bucket of
    requests, 4), then of four (the same buckets, a new exact request count); the
    tokens of the third batch, for the test to compare with transformers."""
    # (7 buckets to warm; the engine in this process, so that a batch's prompts all
    # reach the scheduler before its first step: an engine process of its own may start
    # a step with the first prompt alone, as the machine's load decides)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        llm = _engine(models, "llama", max_num_batched_tokens=64)
    finally:
        del os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"]
    sp = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    counts, tokens = [], None
    for lengths in ([9, 12], [7, 15], [6, 14], [3, 8, 6], [4, 9, 5, 7]):
        before = llm.collective_rpc("pjrt_metrics")[0]["compilations"]
        prompts = [{"prompt_token_ids": list(range(5, 5 + n))} for n in lengths]
        out = _tokens(llm.generate(prompts, sp))
        tokens = out if lengths == [6, 14] else tokens
        counts.append(llm.collective_rpc("pjrt_metrics")[0]["compilations"] - before)
    return {"compilations": counts, "greedy": tokens}


def kernel(models: str, kind: str) -> dict:
    """The compiled default with ``TORCH_PJRT_ATTENTION=kernel``: the keys cached before
    a step attended to by the kernel library's ``paged_attention_kv`` (our Pallas kernel,
    interpreted on the CPU), merged with the step's own keys by their log-sum-exps; a
    prefill budget of 16 tokens, so chunks attend to both (a layer that reads another's
    cache: the kernel alone, over the keys that layer has written this step; a layer
    with a sliding window keeps the gather). Greedy tokens and the attention paths."""
    import torch_pjrt

    # (the engine's process reads the variable; one forked from this one, the setting)
    os.environ["TORCH_PJRT_ATTENTION"] = torch_pjrt.settings.attention = "kernel"
    try:
        llm = _engine(models, kind, max_num_batched_tokens=16)
    finally:
        del os.environ["TORCH_PJRT_ATTENTION"]
        torch_pjrt.settings.attention = "auto"
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return {"greedy": _tokens(llm.generate(PROMPTS, sp)), "paths": _attention_paths(llm)}


SCENARIOS = {
    "llama_kernel": lambda models: kernel(models, "llama"),
    "gemma4_kernel": lambda models: kernel(models, "gemma4"),
    "kv_writes": kv_writes,
    "slot_mapping": slot_mapping,
    "llama": llama,
    "qwen2_eager": lambda models: greedy(models, "qwen2", enforce_eager=True),
    "gpt2": lambda models: greedy(models, "gpt2"),
    "preemption": preemption,
    "gemma2": gemma2,
    "gemma4": gemma4,
    "unsupported": unsupported,
    "new_lengths": new_lengths,
}


def main() -> None:
    models, names = sys.argv[1], sys.argv[2:]
    for name in names:
        result = SCENARIOS[name](models)
        print("RESULT " + json.dumps({"scenario": name, **result}), flush=True)
        while _engines:  # one engine process at a time
            _engines.pop().llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
