"""vLLM on pjrt (issue 21): its own engine and ``vllm serve``, through the platform plugin
that ``torch_pjrt[vllm]`` installs, checked against transformers' ``generate`` on CPU.

Models are built here from configs with a locally trained tokenizer
(tests/vllm_scripts/tiny_models.py). vLLM runs the way users run it, in child
processes: ``tests/vllm_scripts/offline.py`` drives ``vllm.LLM``, and the server tests
go through one ``vllm serve`` on 127.0.0.1, check after check. Every child
runs with ``TORCH_PJRT_FALLBACK=error``: no op may fall back to the CPU.
"""

from __future__ import annotations

import concurrent.futures
import importlib.metadata
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

SCRIPTS = pathlib.Path(__file__).parent / "vllm_scripts"
sys.path.insert(0, str(SCRIPTS))

import launch  # noqa: E402
import tiny_models  # noqa: E402

PROMPTS = tiny_models.PROMPTS
BLOCK = 16  # the plugin's KV block size


def _env() -> dict:
    return {**os.environ, "TORCH_PJRT_FALLBACK": "error", "VLLM_LOGGING_LEVEL": "INFO"}


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("vllm_models")
    for kind in tiny_models.KINDS:
        tiny_models.build(kind, root / kind)
    return root


def _offline(models: pathlib.Path, *scenarios: str) -> tuple[dict, str]:
    """Run scenarios of offline.py in one process: {scenario: its result}, the log."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "offline.py"), str(models), *scenarios],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )
    log = proc.stdout + proc.stderr
    results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and len(results) == len(scenarios), (
        f"offline.py {' '.join(scenarios)} failed:\n{log[-6000:]}"
    )
    found = [json.loads(line[len("RESULT ") :]) for line in results]
    return {r["scenario"]: r for r in found}, log


def _prompt_lengths(path) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    return [len(tok(p).input_ids) for p in PROMPTS]


# --- the plugin -----------------------------------------------------------------------


def test_plugin_is_registered_for_vllm():
    (entry,) = [
        e
        for e in importlib.metadata.entry_points(group="vllm.platform_plugins")
        if e.name == "pjrt"
    ]
    assert entry.load()() == "torch_pjrt.serving.vllm.platform.PjrtPlatform"


# --- vllm.LLM -------------------------------------------------------------------------


def test_llama_compiled_chunked_prefill_prefix_cache_and_seeded_sampling(models):
    """The default (compiled) engine with a 16-token prefill budget, so the prompts of
    19 and 29 tokens are prefilled in chunks; the second round hits the prefix cache.
    Then a default engine given prompts of new lengths in buckets it has run, and the
    first engine again with the kernel library's paged attention forced (and a Gemma 4,
    whose shared-KV layers take the kernel's other branch)."""
    results, log = _offline(models, "llama", "new_lengths", "llama_kernel", "gemma4_kernel")
    result = results["llama"]
    want = tiny_models.greedy(models / "llama", PROMPTS, 12)
    assert result["greedy"] == want
    assert result["greedy_again"] == want
    lengths = _prompt_lengths(models / "llama")
    assert max(lengths) > 16  # the budget really splits a prompt
    # vLLM caches whole blocks and always computes a prompt's last token
    assert result["cached_tokens_again"] == [(n - 1) // BLOCK * BLOCK for n in lengths]
    assert result["prefix_cache_hits"] > 0
    # vLLM's default, as on CUDA: step n+1 is prepared while step n runs (its sampled
    # tokens come back through non-blocking copies and pjrt events)
    assert result["async_scheduling"] is True
    for name, (first, again, other) in result["sampled"].items():
        assert first == again, f"{name}: the same seed gave different tokens"
        assert first != other, f"{name}: another seed gave the same tokens"
        assert all(0 <= t < 300 for row in first for t in row)
    _check_logprobs(models / "llama", result)
    assert "model parameters on ['pjrt:0']" in log
    assert "DYNAMO_TRACE_ONCE" in log and "'backend': 'pjrt'" in log
    # the decode steps ran as captured graphs (decode_graphs.py), none refused
    assert "pjrt: captured the decode graph of" in log
    assert "decode steps run without graphs" not in log
    # the runner's bookkeeping on the host (model_runner.py): a step's programs depend on
    # its buckets, not on its exact token count, so new prompt lengths compile nothing
    *_, third, fourth, fifth = results["new_lengths"]["compilations"]
    assert third == 0, f"prompts of new lengths in known buckets compiled {third} programs"
    assert fourth > 0  # (a new bucket of requests does: the counter counts)
    # a new request count in known buckets: only the sampler's ops on the true rows and
    # their copy to the host follow it (the logits are computed for the bucket's rows,
    # the last step's tokens read from a buffer of fixed size); 4 programs before
    assert fifth <= 2, f"a new request count in known buckets compiled {fifth} programs"
    prompts = [list(range(5, 5 + n)) for n in (6, 14)]
    assert results["new_lengths"]["greedy"] == tiny_models.greedy(models / "llama", prompts, 6)
    assert "pjrt: warmed up the model for" in log
    # TORCH_PJRT_ATTENTION=kernel: the cached keys through the kernel library's paged
    # decode attention (interpreted here), merged with each step's own keys
    kernel = results["llama_kernel"]
    assert kernel["greedy"] == want
    assert kernel["paths"].get("paged kernel", 0) > 0 and "paged xla" not in kernel["paths"]
    # the same with Gemma 4, whose last two layers read the first two's cache (its
    # sliding-window layers take the gather: the kernel has no window)
    kernel = results["gemma4_kernel"]
    assert kernel["greedy"] == tiny_models.greedy(models / "gemma4", PROMPTS, 12)
    assert kernel["paths"].get("paged kernel", 0) > 0 and kernel["paths"].get("paged xla", 0) > 0


def _tokens(path, text: str) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)(text).input_ids


def _cpu_log_softmax(path, ids: list[int]):
    """transformers' log-softmax on CPU at each position of the sequence ``ids``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].log_softmax(-1)


def _check_logprobs(path, result):
    """vLLM's logprobs (the top 3 after the first prompt) and prompt logprobs (top 2 at
    each prompt position) against transformers' log-softmax on CPU."""
    ids = _tokens(path, PROMPTS[0])
    logp = _cpu_log_softmax(path, ids)
    rows = [result["logprobs"]]
    positions = [len(ids) - 1]
    rows += result["prompt_logprobs"]
    positions += list(range(len(ids) - 1))
    for row, pos in zip(rows, positions):
        top = logp[pos].topk(2).indices.tolist()
        assert set(map(str, top)) <= set(row), (pos, top, row)
        for token, value in row.items():
            assert abs(value - logp[pos, int(token)].item()) < 1e-4, (pos, token)


def test_qwen2_gpt2_preemption_and_unsupported_options(models):
    """In one process: the runner's slot mapping on the host against vLLM's kernel, and
    a decode graph's KV writes of all layers against CPU's; options the plugin refuses
    (each names itself, before an engine starts); Qwen2 eager and GPT-2 compiled,
    greedy; then a KV cache of 6 blocks for four requests that need 10: vLLM preempts
    and recomputes, and the tokens stay transformers' tokens; then Gemma 2 and Gemma 4
    (sliding windows, soft-capping, Gemma 4's layers that share another's KV cache),
    logprobs at every position."""
    results, log = _offline(
        models, "kv_writes", "slot_mapping", "unsupported", "qwen2_eager", "gpt2", "preemption",
        "gemma2", "gemma4",
    )  # fmt: skip
    slots = results["slot_mapping"]  # the runner's host slot mapping = vLLM's kernel's
    assert slots["host"] == slots["kernel"] and slots["host"][slots["tokens"]] == -1
    assert results["kv_writes"]["equal"] == [True] * 4  # one op for all layers' writes
    errors = results["unsupported"]["errors"]
    assert errors["lora"].startswith("NotImplementedError: pjrt: LoRA")
    assert errors["speculative"].startswith("NotImplementedError: pjrt: speculative decoding")
    assert errors["quantization"].startswith("NotImplementedError: pjrt: quantization (fp8)")
    for kind in ("qwen2", "gpt2"):
        greedy = results["qwen2_eager" if kind == "qwen2" else kind]["greedy"]
        assert greedy == tiny_models.greedy(models / kind, PROMPTS, 12), kind
    assert log.count("model parameters on ['pjrt:0']") == 5
    preemption = results["preemption"]
    assert preemption["preemptions"] > 0
    assert preemption["greedy"] == tiny_models.greedy(models / "llama", PROMPTS, 24)
    _check_logprobs_over_the_sequence(models / "gemma2", results["gemma2"])
    # Gemma 4's KV sharing: the shared layers attend over the cache their targets wrote
    # in the same step (the gather of the cache on the CPU)
    _check_logprobs_over_the_sequence(models / "gemma4", results["gemma4"])
    assert set(results["gemma4"]["paths"]) == {"paged xla"}


def _check_logprobs_over_the_sequence(path, result):
    """Gemma 2's sliding window and soft-capping (Gemma 4's KV sharing too): vLLM's
    logprobs at every position of the prompt and of the generated tokens against
    transformers' log-softmax on CPU over the whole sequence (prompt and vLLM's
    tokens), and its greedy tokens."""
    (greedy,) = result["greedy"]
    assert greedy == tiny_models.greedy(path, PROMPTS[2:3], 12)[0]
    prompt = _tokens(path, PROMPTS[2])
    assert len(prompt) > 2 * 8  # past the window
    logp = _cpu_log_softmax(path, prompt + greedy)
    rows = result["logprobs"]
    assert len(rows) == len(prompt) - 1 + len(greedy)
    for pos, row in enumerate(rows):
        for token, value in row.items():
            assert abs(value - logp[pos, int(token)].item()) < 1e-4, (pos, token)


# --- vllm serve -----------------------------------------------------------------------


class Server:
    def __init__(self, model: pathlib.Path, log_path: pathlib.Path):
        self.model = str(model)
        self.log_path = log_path
        self._log = open(log_path, "w")
        args = [
            "--dtype", "float32", "--max-model-len", "128", "--max-num-seqs", "8",
            "--kv-cache-memory-bytes", str(8 << 20), "--seed", "0", "--enforce-eager",
        ]  # fmt: skip
        self.proc, self.url = launch.start(model, args, self._log, env=_env())

    def client(self):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", timeout=300)

    def metrics(self) -> dict[str, float]:
        import httpx

        found = {}
        for line in httpx.get(self.url + "/metrics", timeout=30).text.splitlines():
            if line.startswith("vllm:") and " " in line:
                name = line.split("{")[0].split(" ")[0]
                found[name] = found.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return found

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()[-6000:]

    def stop(self, sig=signal.SIGTERM, timeout: float = 60) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        self._log.close()
        return self.proc.returncode


_GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True, "return_token_ids": True}}


def _serve_completions_equal_to_transformers(server, reference):
    out = server.client().completions.create(
        model=server.model, prompt=PROMPTS, max_tokens=12, **_GREEDY
    )
    got = [c.token_ids for c in sorted(out.choices, key=lambda c: c.index)]
    assert got == reference(PROMPTS, 12)


def _serve_chat_completions_equal_to_transformers(server, reference):
    messages = [{"role": "user", "content": "the quick brown"}]
    out = server.client().chat.completions.create(
        model=server.model, messages=messages, max_tokens=10, **_GREEDY
    )
    (want,) = reference([messages], 10, chat=True)
    assert out.choices[0].token_ids == want
    assert out.usage.completion_tokens == 10


def _serve_streaming_is_the_same_text(server):
    client = server.client()
    plain = client.completions.create(
        model=server.model, prompt="to be or", max_tokens=10, **_GREEDY
    )
    stream = client.completions.create(
        model=server.model, prompt="to be or", max_tokens=10, stream=True, **_GREEDY
    )
    assert "".join(c.choices[0].text for c in stream) == plain.choices[0].text
    messages = [{"role": "user", "content": "all that glitters"}]
    plain = client.chat.completions.create(
        model=server.model, messages=messages, max_tokens=10, **_GREEDY
    )
    chunks = client.chat.completions.create(
        model=server.model, messages=messages, max_tokens=10, stream=True, **_GREEDY
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content


def _serve_eight_concurrent_requests(server, reference):
    prompts = tiny_models.SHORT_PROMPTS
    client = server.client()

    def one(prompt):
        out = client.completions.create(model=server.model, prompt=prompt, max_tokens=10, **_GREEDY)
        return out.choices[0].token_ids

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(one, prompts))
    assert got == reference(prompts, 10)


def _serve_bad_requests_get_http_errors_and_it_keeps_serving(server):
    import httpx
    import openai

    client = server.client()
    with pytest.raises(openai.BadRequestError, match="maximum context length is 128"):
        client.completions.create(
            model=server.model, prompt="the quick brown fox " * 60, max_tokens=4
        )
    with pytest.raises(openai.BadRequestError, match="max_tokens must be at least 1"):
        client.completions.create(model=server.model, prompt="to", max_tokens=-1)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="no/such/model", prompt="to", max_tokens=4)
    bad = httpx.post(
        server.url + "/v1/completions",
        content=b'{"model": "x", "prompt": ',
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert bad.status_code == 400 and "JSON" in bad.text
    out = client.completions.create(model=server.model, prompt="to", max_tokens=4, **_GREEDY)
    assert len(out.choices[0].token_ids) == 4


def _serve_disconnect_mid_stream_frees_kv_blocks(server):
    import httpx

    body = {
        "model": server.model,
        "prompt": "the quick",
        "max_tokens": 100,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    before = server.metrics().get("vllm:generation_tokens_total", 0)
    with httpx.Client(timeout=120) as http:
        with http.stream("POST", server.url + "/v1/completions", json=body) as response:
            chunks = 0
            for line in response.iter_lines():
                chunks += line.startswith("data:")
                if chunks == 3:
                    during = server.metrics()
                    break
    assert during["vllm:num_requests_running"] == 1
    assert during["vllm:kv_cache_usage_perc"] > 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        after = server.metrics()
        if after["vllm:num_requests_running"] == 0 and after["vllm:kv_cache_usage_perc"] == 0:
            break
        time.sleep(0.2)
    assert after["vllm:num_requests_running"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0, "the aborted request kept its KV blocks"
    assert after["vllm:generation_tokens_total"] - before < 100  # it stopped early


def _serve_shuts_down_cleanly_on_sigterm(server):
    import psutil

    children = psutil.Process(server.proc.pid).children(recursive=True)
    assert children, "vllm serve runs its engine in a child process"
    assert server.stop(signal.SIGTERM, timeout=60) == 0, server.log()
    gone, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"left running after SIGTERM: {alive}"
    assert "Application shutdown complete" in server.log()


def test_vllm_serve(models, tmp_path):
    """One ``vllm serve`` of the tiny Llama (eager: the compiled engine is checked
    offline above), put through each check in turn, then stopped with SIGTERM."""
    srv = Server(models / "llama", tmp_path / "serve.log")
    try:
        try:
            launch.wait_healthy(srv.proc, srv.url, 300)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{srv.log()}") from None

        def reference(prompts, n, chat=False):
            return tiny_models.greedy(models / "llama", prompts, n, chat)

        _serve_completions_equal_to_transformers(srv, reference)
        _serve_chat_completions_equal_to_transformers(srv, reference)
        _serve_streaming_is_the_same_text(srv)
        _serve_eight_concurrent_requests(srv, reference)
        _serve_bad_requests_get_http_errors_and_it_keeps_serving(srv)
        _serve_disconnect_mid_stream_frees_kv_blocks(srv)
        _serve_shuts_down_cleanly_on_sigterm(srv)
    finally:
        srv.stop(signal.SIGKILL)


def test_serve_unknown_model_path_fails_at_start(tmp_path):
    missing = tmp_path / "no-such-model"
    proc = subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "vllm"),
            "serve",
            str(missing),
            "--host",
            "127.0.0.1",
            "--port",
            str(launch.free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )
    assert proc.returncode != 0
    assert str(missing) in proc.stdout + proc.stderr
