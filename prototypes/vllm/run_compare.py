"""Greedy generation: vLLM (pjrt platform plugin) vs transformers generate on CPU."""
import argparse, json, os, sys, time

PROMPTS = [
    "the quick",
    "a journey of a thousand miles",
    "how much wood would a woodchuck chuck if a woodchuck could chuck wood and",
    "to",
]

def hf_reference(model_dir, max_tokens, dtype="float32"):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    outs = []
    for p in PROMPTS:
        ids = tok(p, return_tensors="pt").input_ids
        with torch.no_grad():
            g = model.generate(ids, max_new_tokens=max_tokens, do_sample=False,
                               eos_token_id=None, pad_token_id=tok.pad_token_id, min_new_tokens=max_tokens)
        outs.append(g[0, ids.shape[1]:].tolist())
    return outs, [tok(p).input_ids for p in PROMPTS]

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="/tmp/vllm_proto/models/tiny-llama")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--eager", type=int, default=1)
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--max-num-batched-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=1, help="generate() calls (2nd+ hit the prefix cache)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--kv-bytes", type=int, default=8 * 1024 * 1024)
    args = ap.parse_args()
    ref, prompt_ids = hf_reference(args.model, args.max_tokens, args.dtype)
    from vllm import LLM, SamplingParams
    t0 = time.time()
    llm = LLM(model=args.model, dtype=args.dtype, enforce_eager=bool(args.eager),
              max_model_len=128, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens,
              kv_cache_memory_bytes=args.kv_bytes, seed=0,
              disable_log_stats=False)
    t1 = time.time()
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    res = []
    for _ in range(args.rounds):
        res += llm.generate(PROMPTS, sp)
    t2 = time.time()
    ok = True
    n = len(PROMPTS)
    for i, r in enumerate(res):
        p, want, pid = PROMPTS[i % n], ref[i % n], prompt_ids[i % n]
        got = list(r.outputs[0].token_ids)
        same = got == want
        ok &= same
        print(json.dumps({"prompt": p, "prompt_ids_match": list(r.prompt_token_ids) == pid,
                          "vllm": got, "hf": want, "match": same, "num_cached_tokens": getattr(r, "num_cached_tokens", None)}))
    try:
        for mtr in llm.get_metrics():
            if any(w in mtr.name for w in ("preempt", "prefix_cache")):
                print("METRIC", mtr.name, getattr(mtr, "value", mtr))
    except Exception as e:
        print("METRIC unavailable:", e)
    print("prompt lengths", [len(x) for x in prompt_ids])
    print(f"RESULT model={os.path.basename(args.model)} args={vars(args)} all_match={ok} init_s={t1-t0:.1f} generate_s={t2-t1:.1f}")

if __name__ == "__main__":
    main()
