"""Tiny Hugging Face models, one per architecture family, built from configs (no downloads).

Each ``Family`` builds a small randomly initialised model on CPU (seeded, so every build is
the same) and a deterministic batch that includes labels, so the model returns a loss.
``tests/test_hf_families.py`` runs each on CPU and on pjrt and compares them.

Models run in eval mode (no dropout) unless ``train`` is set: ResNet trains so its
batch norms use batch statistics and update their running buffers. Attention uses the
library default (sdpa where the model supports it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

VOCAB = 100
BATCH, SEQ = 2, 12


@dataclass(frozen=True)
class Family:
    build: Callable[[], torch.nn.Module]  # the model, on CPU
    batch: Callable[[torch.Generator], dict]  # keyword arguments, labels included
    output: str = "logits"  # the main output compared besides the loss
    train: bool = False  # train mode (only for models without dropout)


def _hf():
    import transformers

    return transformers


def _transformer(config_name: str, model_name: str, **extra):
    """A model whose config takes the usual hidden_size / num_hidden_layers names."""

    def build():
        hf = _hf()
        config = getattr(hf, config_name)(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            **extra,
        )
        return getattr(hf, model_name)(config)

    return build


def _ids(g, shape=(BATCH, SEQ), low=3):
    return torch.randint(low, VOCAB, shape, generator=g)


def _causal_lm(g):
    ids = _ids(g)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # the second row is left-padded
    labels = ids.masked_fill(mask == 0, -100)
    return dict(input_ids=ids, attention_mask=mask, labels=labels)


def _masked_lm(g, pad_id=0):
    ids = _ids(g)
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0  # the second row is padded
    ids = ids.masked_fill(mask == 0, pad_id)
    labels = torch.full_like(ids, -100)
    labels[:, 2:6] = ids[:, 2:6]  # loss on a few positions only
    return dict(input_ids=ids, attention_mask=mask, labels=labels)


def _seq2seq(g):
    ids = _ids(g)
    return dict(input_ids=ids, labels=_ids(g, (BATCH, 7)))


def _images(g, size, num_labels=5):
    pixels = torch.randn(BATCH, 3, size, size, generator=g)
    return dict(pixel_values=pixels, labels=torch.randint(0, num_labels, (BATCH,), generator=g))


def _gpt2():
    hf = _hf()
    return hf.GPT2LMHeadModel(
        hf.GPT2Config(
            n_layer=2,
            n_embd=32,
            n_head=4,
            vocab_size=VOCAB,
            n_positions=64,
            bos_token_id=0,
            eos_token_id=0,
        )
    )


def _distilbert():
    hf = _hf()
    config = hf.DistilBertConfig(
        vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64, pad_token_id=0
    )
    return hf.DistilBertForMaskedLM(config)


def _t5():
    hf = _hf()
    config = hf.T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    return hf.T5ForConditionalGeneration(config)


def _bart():
    hf = _hf()
    config = hf.BartConfig(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    return hf.BartForConditionalGeneration(config)


def _vit():
    hf = _hf()
    config = hf.ViTConfig(
        image_size=16,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=5,
    )
    return hf.ViTForImageClassification(config)


def _resnet():
    hf = _hf()
    config = hf.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=5
    )
    return hf.ResNetForImageClassification(config)


def _convnext():
    hf = _hf()
    config = hf.ConvNextConfig(
        patch_size=4,
        num_stages=2,
        hidden_sizes=[8, 16],
        depths=[1, 1],
        image_size=32,
        num_labels=5,
        layer_scale_init_value=0.5,  # the default 1e-6 would all but switch the blocks off
    )
    return hf.ConvNextForImageClassification(config)


def _clip():
    hf = _hf()
    layers = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    text = dict(
        vocab_size=VOCAB,
        max_position_embeddings=32,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    vision = dict(image_size=16, patch_size=4)
    config = hf.CLIPConfig(
        text_config={**layers, **text}, vision_config={**layers, **vision}, projection_dim=16
    )
    return hf.CLIPModel(config)


def _clip_batch(g):
    ids = _ids(g)
    ids[:, -1] = 2  # the text embedding is read at the end-of-text token
    pixels = torch.randn(BATCH, 3, 16, 16, generator=g)
    return dict(input_ids=ids, pixel_values=pixels, return_loss=True)


def _whisper():
    hf = _hf()
    config = hf.WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=8,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_source_positions=16,
        max_target_positions=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
        suppress_tokens=[],
        begin_suppress_tokens=[],
    )
    return hf.WhisperForConditionalGeneration(config)


def _whisper_batch(g):
    features = torch.randn(BATCH, 8, 32, generator=g)  # 2 * max_source_positions frames
    return dict(input_features=features, labels=_ids(g, (BATCH, 7)))


_GQA = dict(num_key_value_heads=2)

FAMILIES: dict[str, Family] = {
    "gpt2": Family(_gpt2, _causal_lm),
    "llama": Family(_transformer("LlamaConfig", "LlamaForCausalLM", **_GQA), _causal_lm),
    "mistral": Family(
        _transformer("MistralConfig", "MistralForCausalLM", sliding_window=8, **_GQA), _causal_lm
    ),
    "qwen2": Family(_transformer("Qwen2Config", "Qwen2ForCausalLM", **_GQA), _causal_lm),
    "gemma": Family(
        _transformer("GemmaConfig", "GemmaForCausalLM", head_dim=8, num_key_value_heads=1),
        _causal_lm,
    ),
    "phi3": Family(
        _transformer(
            "Phi3Config", "Phi3ForCausalLM", pad_token_id=0, bos_token_id=1, eos_token_id=2, **_GQA
        ),
        _causal_lm,
    ),
    "mixtral": Family(
        _transformer(
            "MixtralConfig",
            "MixtralForCausalLM",
            num_local_experts=4,
            num_experts_per_tok=2,
            output_router_logits=True,
            **_GQA,
        ),
        _causal_lm,
    ),
    # sliding-window layers beside full ones (a static cache keeps its length as an int)
    "gemma3": Family(
        _transformer("Gemma3TextConfig", "Gemma3ForCausalLM", head_dim=8, sliding_window=8, **_GQA),
        _causal_lm,
    ),
    "qwen3": Family(
        _transformer("Qwen3Config", "Qwen3ForCausalLM", head_dim=8, **_GQA), _causal_lm
    ),
    "qwen3_moe": Family(
        _transformer(
            "Qwen3MoeConfig",
            "Qwen3MoeForCausalLM",
            head_dim=8,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            **_GQA,
        ),
        _causal_lm,
    ),
    # experts, attention sinks, sliding and full layers
    "gpt_oss": Family(
        _transformer(
            "GptOssConfig",
            "GptOssForCausalLM",
            head_dim=8,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            **_GQA,
        ),
        _causal_lm,
    ),
    # multi-head latent attention (low-rank keys and values), routed experts
    "deepseek_v3": Family(
        _transformer(
            "DeepseekV3Config",
            "DeepseekV3ForCausalLM",
            num_key_value_heads=4,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            kv_lora_rank=16,
            q_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=8,
            n_group=1,
            topk_group=1,
        ),
        _causal_lm,
    ),
    "bert": Family(_transformer("BertConfig", "BertForMaskedLM"), _masked_lm),
    "roberta": Family(
        _transformer("RobertaConfig", "RobertaForMaskedLM", pad_token_id=1),
        lambda g: _masked_lm(g, pad_id=1),
    ),
    "distilbert": Family(_distilbert, _masked_lm),
    "t5": Family(_t5, _seq2seq),
    "bart": Family(_bart, _seq2seq),
    "vit": Family(_vit, lambda g: _images(g, 16)),
    "resnet": Family(_resnet, lambda g: _images(g, 32), train=True),
    "convnext": Family(_convnext, lambda g: _images(g, 32)),
    "clip": Family(_clip, _clip_batch, output="logits_per_image"),
    "whisper": Family(_whisper, _whisper_batch),
}

# run by `make test`; the others are slow (--exhaustive)
FAST = ["gpt2", "llama", "bert", "vit"]


def build(name: str) -> torch.nn.Module:
    """The family's model on CPU, identical on every call."""
    family = FAMILIES[name]
    torch.manual_seed(0)
    model = family.build()
    return model.train(family.train)


def batch(name: str, device="cpu") -> dict:
    """The family's deterministic batch on ``device``."""
    inputs = FAMILIES[name].batch(torch.Generator().manual_seed(0))
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
