"""Hugging Face ``generate`` on pjrt against CPU PyTorch: greedy, beam search, sampling.

The models are the tiny seeded ones of ``tests/hf_families.py``. Every generation asks for
exactly 16 new tokens (``min_new_tokens=16`` keeps the end-of-sequence token away) from a
batch of 2 prompts of 12 tokens, the second left-padded by 2 (its attention mask), and the
tokens must equal CPU's exactly.

Variants of greedy decoding, per decoder family:

- ``dynamic``: the default ``DynamicCache`` (it grows by one position per token);
  ``static``: ``cache_implementation="static"`` (preallocated, fixed shapes).
- ``eager``: the model runs op by op on pjrt; ``compiled``: its forward is replaced by
  ``torch.compile(model.forward, backend="pjrt")``. ``torch.compile(model)`` would not do:
  ``generate`` is looked up on the wrapped module and calls it, not the compiled wrapper.
  Transformers' own auto-compilation (a ``CompileConfig`` with a static cache) is tested
  once, on Llama.

Compile counts: the compiled static-cache run must build at most ``MAX_STATIC_PROGRAMS``
XLA programs from graphs (prefill and decode step), each on its first call only (no
program is built again for a new token), and a second ``generate`` must build none.

Two model tweaks, for generation only (``_model``): GPT-2 and Gemma tie the output layer to
the embedding, and at the library's initialisation scale the residual stream is the input
embedding, so they repeat the last prompt token forever (a test that could not fail).
Their non-embedding matrices are scaled by 10 (BART's by 100, Whisper's by 30), T5's output
layer gets its own random weights; every run asserts that each row has 3 distinct tokens.
Mixtral's router auxiliary loss (``output_router_logits``) is switched off: generation does
not use it, and with a cache transformers' loss function fails on CPU too.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

import torch_pjrt
from tests import expectations, hf_families

DECODERS = [
    "gpt2", "llama", "mistral", "qwen2", "gemma", "phi3", "mixtral",
    "gemma3", "qwen3", "qwen3_moe", "gpt_oss", "deepseek_v3",
]  # fmt: skip
SEQ2SEQ = ["t5", "bart", "whisper"]
NEW = 16
MAX_STATIC_PROGRAMS = 8  # Llama builds 2 (prefill, decode step); Mixtral 6
# Llama builds 7 (prefill; the first decode step at its exact sizes; the symbolic decode
# step in buckets of the cache's and the mask's lengths, traced again by Dynamo for the
# padded cache's strides); Mixtral and gpt-oss 11 (their prefills in parts)
MAX_DYNAMIC_PROGRAMS = 12

# run by `make test`; every other case is slow (--exhaustive)
FAST = {"gpt2-dynamic-eager", "llama-static-compiled", "llama-dynamic-compiled"}


# family -> factor for the non-embedding matrices (module docstring)
_SCALE = {"gpt2": 10.0, "gemma": 10.0, "bart": 100.0, "whisper": 30.0}
# families whose output layer gets its own random weights instead of the embedding's
_UNTIE = {"t5"}


def _marks(case: str) -> list:
    marks = [] if case in FAST else [pytest.mark.slow]
    return marks + expectations.marks(expectations.XFAIL_HF_GENERATE, case)


def _case(*parts: str):
    case = "-".join(parts)
    return pytest.param(*parts, marks=_marks(case), id=case)


def _model(name: str) -> torch.nn.Module:
    """The family's CPU model, made fit for a generation test (module docstring)."""
    model = hf_families.build(name).eval()
    if getattr(model.config, "output_router_logits", False):
        model.config.output_router_logits = False
    scale = _SCALE.get(name)
    if scale is not None:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if p.dim() >= 2 and not any(k in n for k in ("embed", "wte", "wpe", "shared")):
                    p.mul_(scale)
    if name in _UNTIE:
        head = model.get_output_embeddings()
        g = torch.Generator().manual_seed(0)
        head.weight = torch.nn.Parameter(torch.randn(head.weight.shape, generator=g))
    return model


def _inputs(name: str, device="cpu") -> dict:
    batch = hf_families.batch(name, device)
    batch.pop("labels")
    return batch


def _generate(model, inputs, **kwargs) -> torch.Tensor:
    kwargs.setdefault("do_sample", False)
    with torch_pjrt.config(fallback="error"):  # every op runs on pjrt
        out = model.generate(**inputs, max_new_tokens=NEW, min_new_tokens=NEW, **kwargs)
    return out.cpu()


@functools.cache
def _cpu_tokens(name: str, **kwargs) -> torch.Tensor:
    return _generate(_model(name), _inputs(name), **kwargs)


def _check_varied(tokens: torch.Tensor, what: str):
    # a model that repeats one token would pass any comparison
    for row in tokens[:, -NEW:]:
        assert len(set(row.tolist())) >= 3, f"{what}: degenerate generation {row.tolist()}"


def _graph_counts() -> dict:
    m = torch_pjrt.metrics.as_dict()
    return {k: m.get(k, 0) for k in ("graph_compilations", "dynamo_graphs")}


def _dropped() -> int:
    return torch_pjrt.metrics.as_dict().get("programs_dropped", 0)


def _causes() -> dict:
    return dict(torch_pjrt.metrics.as_dict().get("graph_compile_causes") or {})


def _diff(after: dict, before: dict) -> dict:
    return {k: after[k] - before[k] for k in after}


GREEDY = [
    _case(name, cache, mode)
    for name in DECODERS
    for cache in ("dynamic", "static")
    for mode in ("eager", "compiled")
]


def test_xfail_table_names_greedy_cases():
    unknown = set(expectations.XFAIL_HF_GENERATE) - {case.id for case in GREEDY}
    assert not unknown, f"XFAIL_HF_GENERATE: no such case: {sorted(unknown)}"


@pytest.mark.parametrize("name,cache,mode", GREEDY)
def test_greedy_matches_cpu(name, cache, mode):
    kwargs = {} if cache == "dynamic" else {"cache_implementation": "static"}
    expected = _cpu_tokens(name, **kwargs)
    _check_varied(expected, f"{name} on CPU")

    model = copy.deepcopy(_model(name)).to("pjrt")
    if mode == "compiled":
        # every model's forward is the same transformers wrapper code: without a reset,
        # earlier tests fill its Dynamo cache and past the limit it silently runs eagerly
        torch._dynamo.reset()
        model.forward = torch.compile(model.forward, backend="pjrt")
    inputs = _inputs(name, "pjrt")
    before, causes_before = _graph_counts(), _causes()
    out = _generate(model, inputs, **kwargs)
    assert out.shape == expected.shape, f"{name}: {out.shape} vs {expected.shape}"
    assert torch.equal(out, expected), f"{name}:\n{out[:, -NEW:]}\nvs CPU\n{expected[:, -NEW:]}"

    if mode == "compiled":
        first = _diff(_graph_counts(), before)
        assert first["dynamo_graphs"] >= 1, "the compiled forward did not run"
        if cache == "dynamic":
            # the growing cache's graph runs padded to buckets (lengths 12 to 28: 16 and
            # 32): a program is built for a new bucket, never for a new length
            fallbacks = torch_pjrt.metrics.as_dict().get("graph_bucket_fallbacks")
            assert not fallbacks, fallbacks
            causes = {c: n - causes_before.get(c, 0) for c, n in _causes().items()}
            causes = {c: n for c, n in causes.items() if n}
            per_length = [c for c in causes if not c.endswith("first call") and "padded" not in c]
            assert not per_length, f"programs built for a new length: {per_length}"
            assert first["graph_compilations"] <= MAX_DYNAMIC_PROGRAMS, (first, causes)
        if cache == "static":
            # one program for the prefill and one for the decode step, not one per token
            causes = {c: n - causes_before.get(c, 0) for c, n in _causes().items()}
            causes = {c: n for c, n in causes.items() if n}
            assert first["graph_compilations"] <= MAX_STATIC_PROGRAMS, (first, causes)
            rebuilt = [c for c in causes if not c.endswith("first call")]
            assert not rebuilt, f"programs built again: {rebuilt}"
            before, dropped = _graph_counts(), _dropped()
            assert torch.equal(_generate(model, inputs, **kwargs), expected)
            again = _diff(_graph_counts(), before)
            if _dropped() == dropped:  # (else the process let programs go meanwhile, to
                # stay under Linux's limit of memory mappings: docs/metrics.md)
                assert again == {"graph_compilations": 0, "dynamo_graphs": 0}, again


@pytest.mark.slow
def test_auto_compile_static_cache():
    """Transformers' own compilation of the decode step, with the pjrt backend."""
    from transformers import CompileConfig

    name = "llama"
    kwargs = {"cache_implementation": "static"}
    expected = _cpu_tokens(name, **kwargs)
    model = copy.deepcopy(_model(name)).to("pjrt")
    torch._dynamo.reset()  # see test_greedy_matches_cpu
    config = CompileConfig(backend="pjrt", mode=None, fullgraph=False)
    config._compile_all_devices = True  # transformers compiles on cuda/xpu/tpu only by default
    before = _graph_counts()
    out = _generate(model, _inputs(name, "pjrt"), compile_config=config, **kwargs)
    assert torch.equal(out, expected), f"{out[:, -NEW:]}\nvs CPU\n{expected[:, -NEW:]}"
    counts = _diff(_graph_counts(), before)
    assert 1 <= counts["dynamo_graphs"] and counts["graph_compilations"] <= MAX_STATIC_PROGRAMS


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama"])
def test_beam_search_matches_cpu(name):
    kwargs = {"num_beams": 3, "num_return_sequences": 3}
    expected = _cpu_tokens(name, **kwargs)
    _check_varied(expected, f"{name} beams on CPU")
    assert not torch.equal(expected[0], expected[1]), "the beams are all the same"
    model = copy.deepcopy(_model(name)).to("pjrt")
    out = _generate(model, _inputs(name, "pjrt"), **kwargs)
    assert torch.equal(out, expected), f"{out[:, -NEW:]}\nvs CPU\n{expected[:, -NEW:]}"


@pytest.mark.slow
@pytest.mark.parametrize("seed_fn", ["torch.manual_seed", "torch.pjrt.manual_seed"])
def test_sampling_reproducible(seed_fn):
    name = "llama"
    seed = {
        "torch.manual_seed": torch.manual_seed,
        "torch.pjrt.manual_seed": torch.pjrt.manual_seed,
    }
    seed = seed[seed_fn]
    model = copy.deepcopy(_model(name)).to("pjrt")
    inputs = _inputs(name, "pjrt")
    # the tiny model's next-token distribution is close to uniform: top 50 of 100 tokens,
    # so two seeds agreeing on all 32 sampled tokens has probability of order 50**-32
    kwargs = {"do_sample": True, "top_k": 50, "temperature": 1.0}

    def sample(s):
        seed(s)
        return _generate(model, inputs, **kwargs)

    first = sample(1)
    torch.randn(3)  # the CPU generator moves on: only the seed decides
    assert torch.equal(sample(1), first)
    assert not torch.equal(sample(2)[:, -NEW:], first[:, -NEW:])
    # the greedy tokens are not what sampling gave (it did sample)
    assert not torch.equal(first, _cpu_tokens(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", SEQ2SEQ)
def test_seq2seq_greedy_matches_cpu(name):
    expected = _cpu_tokens(name)
    _check_varied(expected, f"{name} on CPU")
    model = copy.deepcopy(_model(name)).to("pjrt")
    out = _generate(model, _inputs(name, "pjrt"))
    assert torch.equal(out, expected), f"{out[:, -NEW:]}\nvs CPU\n{expected[:, -NEW:]}"
