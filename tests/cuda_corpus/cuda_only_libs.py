"""CUDA-only code that no tool can rewrite: apex, flash-attn, xformers, bitsandbytes, a
Triton kernel, CUDA graphs, NVTX, events. Analyzed, never run (the libraries are not
installed here)."""

import apex
import bitsandbytes as bnb
import torch
import triton
import triton.language as tl
from flash_attn import flash_attn_func
from xformers.ops import memory_efficient_attention


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + tl.load(y_ptr + offs, mask=mask), mask=mask)


def main():
    model = torch.nn.DataParallel(torch.nn.Linear(8, 8).cuda(), device_ids=[0, 1])
    opt = bnb.optim.Adam8bit(model.parameters())
    model, opt = apex.amp.initialize(model, opt, opt_level="O2")
    q = torch.randn(1, 16, 4, 64, device="cuda", dtype=torch.float16)
    out = flash_attn_func(q, q, q) + memory_efficient_attention(q, q, q)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.nvtx.range_push("step")
    start = torch.cuda.Event(enable_timing=True)
    return out, graph, start


if __name__ == "__main__":
    main()
