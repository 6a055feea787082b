"""Random sampling paths (temperature, top-k, top-p, min-p, penalties, logprobs) on pjrt."""
import sys
from vllm import LLM, SamplingParams

def main():
    model = sys.argv[1] if len(sys.argv) > 1 else "/tmp/vllm_proto/models/tiny-llama"
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=128,
              max_num_seqs=4, kv_cache_memory_bytes=8 * 1024 * 1024, seed=0)
    prompts = ["the quick", "to be or", "a journey", "vllm serves"]
    cases = {
        "greedy": SamplingParams(temperature=0.0, max_tokens=8),
        "temp_unseeded": SamplingParams(temperature=0.8, max_tokens=8),
        "topk_topp_unseeded": SamplingParams(temperature=1.0, top_k=20, top_p=0.9, max_tokens=8),
        "logprobs": SamplingParams(temperature=0.0, max_tokens=4, logprobs=3, prompt_logprobs=2),
        "penalties_unseeded": SamplingParams(temperature=1.0, min_p=0.05, presence_penalty=0.5,
                                         frequency_penalty=0.5, repetition_penalty=1.2, max_tokens=8),
        "temp": SamplingParams(temperature=0.8, max_tokens=8, seed=1),
        "topk_topp": SamplingParams(temperature=1.0, top_k=20, top_p=0.9, max_tokens=8, seed=2),
        "minp_penalties": SamplingParams(temperature=1.0, min_p=0.05, presence_penalty=0.5,
                                         frequency_penalty=0.5, repetition_penalty=1.2, max_tokens=8, seed=3),
    }
    for name, sp in cases.items():
        try:
            outs = llm.generate(prompts, sp)
            again = llm.generate(prompts, sp)
            same = [list(a.outputs[0].token_ids) == list(b.outputs[0].token_ids) for a, b in zip(outs, again)]
            extra = ""
            if sp.logprobs:
                lp = outs[0].outputs[0].logprobs[0]
                extra = f" first-token logprobs={ {k: round(v.logprob, 4) for k, v in lp.items()} }"
            print(f"CASE {name}: ok, tokens={[list(o.outputs[0].token_ids) for o in outs]} seeded_repeat_same={same}{extra}")
        except Exception as e:
            print(f"CASE {name}: FAILED {type(e).__name__}: {e}")

if __name__ == "__main__":
    main()
