"""The tables ``torch-pjrt migrate`` works from: what each CUDA-only construct becomes.

A rewrite is a Python expression in which ``{D}`` stands for the module-level device the
rewrite adds (``DEVICE_NAME``: the current accelerator, else the CPU). ``None`` means
the construct is reported but not rewritten.

NOTE: ``torch.accelerator.synchronize`` and the ``torch.accelerator`` memory functions
need a C++ device guard and allocator, which a backend registered from Python (pjrt,
in PyTorch 2.13) cannot provide: they raise there. Those calls go through
``torch.get_device_module(device)`` instead, which is ``torch.cuda`` on CUDA,
``torch.pjrt`` on pjrt, ``torch.xpu`` on XPU, and works the same on each.
"""

from __future__ import annotations

import dataclasses

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


_MOD = "torch.get_device_module({D})."
_LOW = "low"
_MEDIUM = "medium"
_NO_CPU = "torch.cpu has none: guard it with torch.accelerator.is_available()"
_MEMORY_NOTE = (
    "figures of the device's allocator (torch.accelerator's memory functions raise on "
    "backends registered from Python, such as pjrt); " + _NO_CPU
)


def _module(name: str, risk: str = _MEDIUM, note: str = _MEMORY_NOTE) -> CudaApi:
    return CudaApi(_MOD + name, risk, note)


# torch.cuda.<name>: what it becomes. Names not here get CUDA_API_DEFAULT.
CUDA_API: dict[str, CudaApi] = {
    "is_available": CudaApi("torch.accelerator.is_available", _LOW),
    "device_count": CudaApi("torch.accelerator.device_count", _LOW),
    "current_device": _module(
        "current_device",
        _LOW,
        "'cpu' on the CPU; torch.accelerator.current_device_index raises without an accelerator",
    ),
    "set_device": _module(
        "set_device",
        _LOW,
        "a no-op on the CPU; torch.accelerator.set_device_index raises without an accelerator",
    ),
    "synchronize": _module(
        "synchronize",
        _LOW,
        "torch.accelerator.synchronize() raises on backends registered from Python (pjrt)",
    ),
    "manual_seed": CudaApi(
        "torch.manual_seed", _MEDIUM, "also reseeds the CPU generator (and every device's)"
    ),
    "manual_seed_all": CudaApi(
        "torch.manual_seed", _MEDIUM, "also reseeds the CPU generator (and every device's)"
    ),
    "seed": CudaApi("torch.seed", _MEDIUM, "also reseeds the CPU generator"),
    "seed_all": CudaApi("torch.seed", _MEDIUM, "also reseeds the CPU generator"),
    "initial_seed": CudaApi("torch.initial_seed", _LOW),
    "get_rng_state": _module("get_rng_state", _MEDIUM, "the device's RNG state format"),
    "set_rng_state": _module("set_rng_state", _MEDIUM, "the device's RNG state format"),
    "memory_allocated": _module("memory_allocated"),
    "max_memory_allocated": _module("max_memory_allocated"),
    "memory_reserved": _module("memory_reserved"),
    "max_memory_reserved": _module("max_memory_reserved"),
    "memory_stats": _module("memory_stats"),
    "reset_peak_memory_stats": _module("reset_peak_memory_stats"),
    "mem_get_info": _module("mem_get_info"),
    "empty_cache": _module(
        "empty_cache", _MEDIUM, "XLA frees buffers itself (a no-op on pjrt); " + _NO_CPU
    ),
    "get_device_name": _module("get_device_name", _MEDIUM, "the device's own name; " + _NO_CPU),
    "get_device_properties": _module(
        "get_device_properties", _MEDIUM, "fields differ between devices (no SM count)"
    ),
    "get_device_capability": _module(
        "get_device_capability", _MEDIUM, "(0, 0) on pjrt: there is no compute capability"
    ),
    "is_bf16_supported": CudaApi(
        None,
        _MEDIUM,
        "answers for CUDA only; bfloat16 works on pjrt (TPUs, recent GPUs) and the CPU: "
        "True, or a test of _DEVICE.type",
    ),
    "Event": CudaApi(
        None,
        _MEDIUM,
        "use torch.Event(device=..., enable_timing=True), or time with "
        "torch.get_device_module(device).synchronize() and time.perf_counter()",
    ),
    "Stream": CudaApi(
        None, _MEDIUM, "use torch.Stream(device=...); XLA devices run one in-order queue"
    ),
    "stream": CudaApi(None, _MEDIUM, "use torch.get_device_module(device).stream(...)"),
    "current_stream": CudaApi("torch.accelerator.current_stream", _LOW),
    "is_initialized": CudaApi(None, _MEDIUM, "use torch.accelerator.is_available()"),
    "amp.autocast": CudaApi(
        "torch.autocast({D}.type, ...)", _LOW, "torch.cuda.amp.autocast is deprecated"
    ),
    "amp.GradScaler": CudaApi(
        "torch.amp.GradScaler({D}.type, ...)", _LOW, "torch.cuda.amp.GradScaler is deprecated"
    ),
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
