"""Tiny causal language models for vLLM on pjrt, built from configs, with a tokenizer
trained here: nothing is downloaded.

``build(kind, path)`` writes a Hugging Face model directory (config, safetensors
weights, tokenizer with a chat template) that ``vllm.LLM`` and ``vllm serve`` load.
Weights are drawn from a fixed seed, wider than the default initialization, so that
greedy outputs are not one repeated token.
"""

from __future__ import annotations

import pathlib

import torch

KINDS = ("llama", "qwen2", "gpt2", "gemma2", "gemma4")

_TEXT = [
    "the quick brown fox jumps over the lazy dog",
    "a journey of a thousand miles begins with a single step",
    "to be or not to be that is the question",
    "all that glitters is not gold",
    "the rain in spain stays mainly in the plain",
    "she sells sea shells by the sea shore",
    "how much wood would a woodchuck chuck if a woodchuck could chuck wood",
    "vllm serves language models with paged attention on many devices",
    "jax compiles programs for xla and pjrt runs them on the chip",
]

# the batch the tests compare with transformers: 7, 19, 29 and 2 tokens with the tokenizer
PROMPTS = [
    "the quick",
    "a journey of a thousand miles",
    "how much wood would a woodchuck chuck if a woodchuck could chuck wood and",
    "to",
]

# eight short prompts, one a concurrent request (tests/test_vllm.py, benchmarks/serve.py)
SHORT_PROMPTS = [
    "the quick brown",
    "a journey",
    "to be or not",
    "all that glitters",
    "the rain in spain",
    "she sells",
    "how much wood",
    "jax compiles programs",
]

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "gemma2": "Gemma2ForCausalLM",
    "gemma4": "Gemma4ForCausalLM",
}


def tokenizer(path: pathlib.Path):
    """A byte-level BPE tokenizer of 300 tokens trained on a few sentences, saved to path."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_TEXT * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    return fast


def build(kind: str, path, hidden: int = 64, layers: int = 2) -> pathlib.Path:
    """Write a tiny ``kind`` model (one of KINDS) with its tokenizer to path."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = pathlib.Path(path)
    tok = tokenizer(path)
    ids = dict(
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    if kind == "gpt2":
        config = AutoConfig.for_model(
            "gpt2", n_embd=64, n_layer=2, n_head=4, n_positions=256, **ids
        )
    elif kind in ("gemma2", "gemma4"):
        # sliding windows (every other layer) and soft-capped logits; Gemma 2's attention
        # scores soft-capped too, Gemma 4's last two layers reading the first two's KV cache
        gemma = dict(
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=8,
            final_logit_softcapping=10.0,
            max_position_embeddings=256,
            **ids,
        )
        if kind == "gemma2":
            config = AutoConfig.for_model(
                "gemma2",
                num_hidden_layers=2,
                query_pre_attn_scalar=16,
                attn_logit_softcapping=5.0,
                **gemma,
            )
        else:
            config = AutoConfig.for_model(
                "gemma4_text",
                num_hidden_layers=4,
                global_head_dim=16,
                layer_types=["sliding_attention", "full_attention"] * 2,
                num_kv_shared_layers=2,
                hidden_size_per_layer_input=8,
                vocab_size_per_layer_input=len(tok),
                **gemma,
            )
    else:
        config = AutoConfig.for_model(
            kind,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            tie_word_embeddings=kind == "qwen2",
            **ids,
        )
    config.architectures = [_ARCHITECTURES[kind]]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.2)
    model.save_pretrained(path)
    return path


def greedy(path, prompts, max_tokens: int, chat: bool = False) -> list[list[int]]:
    """transformers' greedy ``generate`` on CPU: the new token ids of each prompt, never
    stopping at the end-of-text token (as vLLM's ``ignore_eos``). With ``chat``, each
    prompt is a list of messages put through the chat template; a list of ints is the
    prompt's token ids."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    out = []
    for prompt in prompts:
        if isinstance(prompt, list) and not chat:
            ids = torch.tensor([prompt])
        elif chat:
            ids = tok.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt")
            ids = ids["input_ids"] if not isinstance(ids, torch.Tensor) else ids
        else:
            ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            g = model.generate(
                ids,
                max_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
                attention_mask=torch.ones_like(ids),
            )
        out.append(g[0, ids.shape[1] :].tolist())
    return out
