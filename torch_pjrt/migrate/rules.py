"""The tables ``torch-pjrt migrate`` works from: what each CUDA-only construct becomes.

A rewrite is a Python expression in which ``{D}`` stands for the module-level device the
rewrite adds (``DEVICE_NAME``: the current accelerator, else the CPU). ``None`` means
the construct is reported but not rewritten. The ``torch.cuda`` calls come from the
table that ``torch-pjrt run --cuda-compat`` maps from too (``migrate/cuda_calls.py``).
"""

from __future__ import annotations

import dataclasses

from torch_pjrt.migrate.cuda_calls import CUDA_CALLS

__all__ = [
    "DEVICE_NAME",
    "DEVICE_LINE",
    "MARK",
    "CudaApi",
    "CUDA_API",
    "CUDA_API_DEFAULT",
    "CUDA_LIBRARIES",
]

# The name of the module-level device the rewrites refer to, and its definition.
DEVICE_NAME = "_DEVICE"
MARK = "torch-pjrt migrate:"
DEVICE_COMMENT = f"# {MARK} the current accelerator (CUDA, pjrt, XPU, ...), else the CPU"
DEVICE_LINE = f'{DEVICE_NAME} = torch.accelerator.current_accelerator() or torch.device("cpu")'


@dataclasses.dataclass(frozen=True)
class CudaApi:
    becomes: str | None  # a template (``{D}``: the device), None: report only
    risk: str
    note: str = ""


# torch.cuda.<name>: what it becomes (the rows of the shared table that migrate rewrites
# or reports). Names not here get CUDA_API_DEFAULT.
CUDA_API: dict[str, CudaApi] = {
    name: CudaApi(call.generic, call.risk, call.note)
    for name, call in CUDA_CALLS.items()
    if call.risk is not None
}

CUDA_API_DEFAULT = CudaApi(
    None,
    "high",
    "CUDA-only (graphs, NVTX, IPC, architecture queries, ...): remove it, or guard it "
    "with `if torch.accelerator.current_accelerator().type == 'cuda':`",
)

# Top-level modules of CUDA-only libraries: the change to make by hand.
CUDA_LIBRARIES: dict[str, str] = {
    "apex": "apex.amp: torch.autocast + torch.amp.GradScaler; FusedAdam/FusedLayerNorm: "
    "torch.optim.AdamW and torch.nn.LayerNorm (XLA fuses them); apex DDP: "
    "torch.nn.parallel.DistributedDataParallel",
    "flash_attn": "torch.nn.functional.scaled_dot_product_attention (XLA picks the "
    "attention kernel; on TPU a Pallas flash kernel)",
    "xformers": "torch.nn.functional.scaled_dot_product_attention for "
    "memory_efficient_attention; plain torch ops for the rest",
    "bitsandbytes": "8-bit optimizers: torch.optim with bfloat16 states; int8/4-bit "
    "layers: no XLA kernels here, keep bfloat16 weights",
    "triton": "a hand-written Triton kernel: write the plain torch ops (XLA fuses "
    "them) or a Pallas kernel",
    "cupy": "torch (or jax.numpy) operations on device tensors",
    "pynvml": "torch.get_device_module(device).memory_stats() / torch.accelerator.device_count()",
    "transformer_engine": "torch.autocast with bfloat16; FP8 needs the device's own path",
    "torch.utils.cpp_extension": "a CUDA/C++ extension: a torch or Pallas "
    "implementation is needed for XLA devices",
}
