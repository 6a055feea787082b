#!/bin/bash
# Start `vllm serve` on loopback, send a few requests, stop it.
cd /tmp/vllm_proto; mkdir -p logs
PORT=${PORT:-8011}
TORCH_PJRT_FALLBACK=error venv/bin/vllm serve /tmp/vllm_proto/models/tiny-llama --host 127.0.0.1 --port $PORT \
  --dtype float32 --enforce-eager --max-model-len 128 --max-num-seqs 4 --kv-cache-memory-bytes 8388608 \
  > logs/serve.txt 2>&1 &
SPID=$!
echo "server pid $SPID"
for i in $(seq 1 120); do
  curl -s -m 2 http://127.0.0.1:$PORT/health >/dev/null 2>&1 && break
  kill -0 $SPID 2>/dev/null || { echo "server died"; break; }
  sleep 1
done
echo "ready after ${i}s"
curl -s -m 30 http://127.0.0.1:$PORT/v1/models; echo
curl -s -m 60 http://127.0.0.1:$PORT/v1/completions -H 'Content-Type: application/json' \
  -d '{"model": "/tmp/vllm_proto/models/tiny-llama", "prompt": "the quick", "max_tokens": 8, "temperature": 0, "ignore_eos": true, "return_token_ids": true}'; echo
curl -s -m 60 http://127.0.0.1:$PORT/v1/completions -H 'Content-Type: application/json' \
  -d '{"model": "/tmp/vllm_proto/models/tiny-llama", "prompt": ["to", "a journey of a thousand miles"], "max_tokens": 8, "temperature": 0.8, "seed": 3, "stream": false}'; echo
curl -s -m 60 -N http://127.0.0.1:$PORT/v1/completions -H 'Content-Type: application/json' \
  -d '{"model": "/tmp/vllm_proto/models/tiny-llama", "prompt": "the quick", "max_tokens": 4, "temperature": 0, "stream": true}' | head -c 1500; echo
kill -INT $SPID; wait $SPID; echo "server exit $?"
