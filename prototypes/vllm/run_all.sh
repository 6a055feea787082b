#!/bin/bash
# Runs every check sequentially (one heavy process at a time). Logs in logs/.
cd /tmp/vllm_proto; mkdir -p logs
export TORCH_PJRT_FALLBACK=error
for m in llama qwen2 gpt2; do
  PJRT_VLLM_METRICS=logs/metrics_$m.json timeout 600 venv/bin/python run_compare.py --model models/tiny-$m > logs/greedy_$m.txt 2>&1; echo "rc=$?" >> logs/greedy_$m.txt
  grep -h "^RESULT\|^rc=" logs/greedy_$m.txt
done
timeout 600 venv/bin/python run_compare.py --model models/tiny-llama --max-tokens 40 --max-num-seqs 2 --max-num-batched-tokens 16 --rounds 2 > logs/greedy_llama_chunked.txt 2>&1; echo "rc=$?" >> logs/greedy_llama_chunked.txt
grep -h "^RESULT\|^rc=" logs/greedy_llama_chunked.txt
timeout 600 venv/bin/python run_sampling.py > logs/sampling.txt 2>&1; echo "rc=$?" >> logs/sampling.txt
grep -h "CASE\|^rc=" logs/sampling.txt | sed 's/.*CASE/CASE/' | cut -c1-60
timeout 600 venv/bin/python run_compare.py --model models/tiny-llama --max-tokens 40 --kv-bytes 81920 --max-num-batched-tokens 128 > logs/greedy_llama_preempt.txt 2>&1; echo "rc=$?" >> logs/greedy_llama_preempt.txt
grep -h "^RESULT\|^rc=\|num_preemptions " logs/greedy_llama_preempt.txt
timeout 600 venv/bin/python run_compare.py --model models/tiny-llama --dtype bfloat16 > logs/greedy_llama_bf16.txt 2>&1; echo "rc=$?" >> logs/greedy_llama_bf16.txt
grep -h "^RESULT\|^rc=" logs/greedy_llama_bf16.txt
for m in llama qwen2 gpt2; do
  VLLM_USE_AOT_COMPILE=0 PJRT_VLLM_COMPILE=1 PJRT_VLLM_METRICS=logs/metrics_compile_$m.json timeout 900 venv/bin/python run_compare.py --model models/tiny-$m --eager 0 > logs/compile_$m.txt 2>&1; echo "rc=$?" >> logs/compile_$m.txt
  grep -h "^RESULT\|^rc=" logs/compile_$m.txt
done
timeout 400 ./run_serve.sh > logs/serve_driver.txt 2>&1; grep -o '"token_ids":\[[0-9,]*\]' logs/serve_driver.txt | head -1; grep "server exit\|ready after" logs/serve_driver.txt
