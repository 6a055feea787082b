"""GPT-2's one-token greedy decoding step written directly in JAX, for benchmarks/generate.py.

The reference the ``pjrt captured static`` row is held to: the same step (embedding,
``n_layer`` blocks of pre-LayerNorm attention and MLP over a static KV cache, the final
LayerNorm, the tied LM head, the argmax) as one ``jax.jit`` program, the cache donated.
The weights are a ``transformers.GPT2LMHeadModel``'s, converted once with numpy from its
CPU ``state_dict``. The cache is one array of shape ``(layers, 2, batch, heads, max_len,
head_dim)`` (2: key, value), zeroed beyond the positions written; the position is a
device scalar that the step returns advanced, so a decoding loop reads nothing on the
host. Every matmul at ``"highest"`` float32 precision, as torch_pjrt traces its programs.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np


def params_from(model) -> dict:
    """The model's weights as numpy float32 arrays (``Conv1D`` weights are ``(in, out)``)."""
    sd = {k: v.detach().cpu().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    config = model.config

    def layer(i: int) -> dict:
        p = f"transformer.h.{i}."
        names = ("ln_1", "ln_2", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
        return {n: {"w": sd[p + n + ".weight"], "b": sd[p + n + ".bias"]} for n in names}

    return {
        "wte": sd["transformer.wte.weight"],
        "wpe": sd["transformer.wpe.weight"],
        "layers": [layer(i) for i in range(config.n_layer)],
        "ln_f": {"w": sd["transformer.ln_f.weight"], "b": sd["transformer.ln_f.bias"]},
        "lm_head": sd["lm_head.weight"],  # tied to wte in GPT-2; kept as the model has it
    }


def empty_cache(config, batch: int, max_len: int, device=None) -> jax.Array:
    heads, head_dim = config.n_head, config.n_embd // config.n_head
    shape = (config.n_layer, 2, batch, heads, max_len, head_dim)
    return jax.device_put(jnp.zeros(shape, jnp.float32), device)


HIGHEST = jax.lax.Precision.HIGHEST


def _mm(a, b):
    return jnp.matmul(a, b, precision=HIGHEST)


def _layer_norm(x, p, eps: float):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p["w"] + p["b"]


def _gelu_new(x):  # GPT-2's "gelu_new": the tanh approximation
    return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def logits_step(params, cache, token, pos, *, heads: int, eps: float):
    """One token through the model: ``token`` (batch,) int, ``pos`` () int32 (its
    position, also the cache row it writes). Returns (logits (batch, vocab), cache)."""
    batch = token.shape[0]
    max_len, head_dim = cache.shape[-2], cache.shape[-1]
    h = params["wte"][token] + jax.lax.dynamic_index_in_dim(params["wpe"], pos, 0, False)
    visible = jnp.arange(max_len) <= pos  # the causal mask of a one-token query
    for i, p in enumerate(params["layers"]):
        a = _layer_norm(h, p["ln_1"], eps)
        qkv = _mm(a, p["attn.c_attn"]["w"]) + p["attn.c_attn"]["b"]  # (batch, 3 * n_embd)
        q, k, v = (t.reshape(batch, heads, 1, head_dim) for t in jnp.split(qkv, 3, axis=-1))
        kv = jnp.stack([k, v])[None]  # (1, 2, batch, heads, 1, head_dim)
        cache = jax.lax.dynamic_update_slice(cache, kv, (i, 0, 0, 0, pos, 0))
        keys, values = cache[i, 0], cache[i, 1]  # (batch, heads, max_len, head_dim)
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, keys, precision=HIGHEST) / math.sqrt(head_dim)
        scores = jnp.where(visible, scores, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(scores, axis=-1)
        attn = jnp.einsum("bhqk,bhkd->bhqd", weights, values, precision=HIGHEST)
        h = h + _mm(attn.reshape(batch, heads * head_dim), p["attn.c_proj"]["w"])
        h = h + p["attn.c_proj"]["b"]
        m = _layer_norm(h, p["ln_2"], eps)
        m = _gelu_new(_mm(m, p["mlp.c_fc"]["w"]) + p["mlp.c_fc"]["b"])
        h = h + _mm(m, p["mlp.c_proj"]["w"]) + p["mlp.c_proj"]["b"]
    h = _layer_norm(h, params["ln_f"], eps)
    return _mm(h, params["lm_head"].T), cache


def compile_step(config, donate: bool = True):
    """``step(params, cache, token, pos) -> (next_token, cache, pos + 1)``: one jitted
    program, the greedy argmax in it; ``cache`` donated (written in place)."""
    logits = functools.partial(logits_step, heads=config.n_head, eps=config.layer_norm_epsilon)

    def step(params, cache, token, pos):
        out, cache = logits(params, cache, token, pos)
        return jnp.argmax(out, axis=-1).astype(token.dtype), cache, pos + 1

    return jax.jit(step, donate_argnums=(1,) if donate else ())


def compile_logits(config):
    """``(params, cache, token, pos) -> (logits, cache)`` jitted, nothing donated: the
    check's."""
    fn = functools.partial(logits_step, heads=config.n_head, eps=config.layer_norm_epsilon)
    return jax.jit(fn)
