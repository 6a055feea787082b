#!/bin/bash
# Rebuilds /tmp/vllm_proto/venv: an overlay venv on /work/main/.venv (torch 2.13.0+cpu, jax, torch_pjrt,
# transformers 5.24.0 come from there), vLLM 0.32.0 without its deps, and only the deps that
# 'from vllm import LLM', LLM.generate on tiny Llama/Qwen2/GPT-2 and 'vllm serve' needed.
set -e
cd /tmp/vllm_proto
python3 -m venv venv
echo "import site; site.addsitedir('/work/main/.venv/lib/python3.11/site-packages')" > venv/lib/python3.11/site-packages/main_venv.pth
venv/bin/pip install --no-deps /tmp/vllmdl/vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl "torch==2.13.0"
# xgrammar without its deps: it requires triton (1 GB, CUDA-oriented); vLLM imports xgrammar at
# 'from vllm import LLM' time but nothing here needs triton.
venv/bin/pip install --no-deps -c constraints.txt xgrammar==0.2.8 "torch==2.13.0"
venv/bin/pip install -c constraints.txt aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 apache-tvm-ffi==0.1.11 attrs==26.1.0 cachetools==8.0.2 cbor2==6.3.0 certifi==2026.10.19.post1 charset-normalizer==3.5.3 compressed-tensors==0.17.0 einops==0.8.2 fastapi==0.136.3 frozenlist==1.8.0 httpcore==1.0.9 httpx==0.28.1 jiter==0.19.0 jmespath==1.1.0 llguidance==1.7.6 loguru==0.7.3 model-hosting-container-standards==0.1.16 msgspec==0.23.0 multidict==7.2.1 openai==3.57.0 oss-harmony==0.0.11 partial-json-parser==0.2.1.1.post7 pillow==13.0.0 prometheus-fastapi-instrumentator==8.1.0 prometheus_client==0.26.0 propcache==0.5.4 py-cpuinfo==9.0.0 pybase64==1.5.1 pyzmq==27.3.0 requests==2.34.2 sniffio==1.3.1 starlette==1.10.0 supervisor==4.3.0 urllib3==2.8.0 uvicorn==0.54.0 uvloop==0.23.0 watchfiles==1.3.0  yarl==1.25.1 "torch==2.13.0"
venv/bin/pip install -e plugin "torch==2.13.0"
