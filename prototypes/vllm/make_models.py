"""Build tiny HF models from configs with a locally trained BPE tokenizer."""
import sys, torch
from tokenizers import Tokenizer, models, trainers, pre_tokenizers, decoders
from transformers import PreTrainedTokenizerFast, AutoConfig, AutoModelForCausalLM

SENTS = [
    "the quick brown fox jumps over the lazy dog",
    "a journey of a thousand miles begins with a single step",
    "to be or not to be that is the question",
    "all that glitters is not gold",
    "the rain in spain stays mainly in the plain",
    "she sells sea shells by the sea shore",
    "how much wood would a woodchuck chuck if a woodchuck could chuck wood",
    "vllm serves language models with paged attention on many devices",
    "jax compiles programs for xla and pjrt runs them on the chip",
] * 20

def make_tokenizer(path):
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SENTS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.save_pretrained(path)
    return fast

def build(kind, path):
    tok = make_tokenizer(path)
    V = len(tok)
    common = dict(vocab_size=V, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                  pad_token_id=tok.pad_token_id)
    if kind == "llama":
        cfg = AutoConfig.for_model("llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   tie_word_embeddings=False, **common)
    elif kind == "qwen2":
        cfg = AutoConfig.for_model("qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   tie_word_embeddings=True, **common)
    elif kind == "gpt2":
        cfg = AutoConfig.for_model("gpt2", n_embd=64, n_layer=2, n_head=4, n_positions=256, **common)
    cfg.architectures = [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "gpt2": "GPT2LMHeadModel"}[kind]]
    cfg.torch_dtype = torch.float32
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    # larger-than-default init so greedy outputs are not all one token
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.2)
    model.save_pretrained(path)
    print(kind, path, "vocab", V, "params", sum(p.numel() for p in model.parameters()))

if __name__ == "__main__":
    for kind in sys.argv[1:]:
        build(kind, f"/tmp/vllm_proto/models/tiny-{kind}")
