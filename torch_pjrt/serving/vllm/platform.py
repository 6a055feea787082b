"""vLLM's Platform for the pjrt device: what vLLM asks a chip before it builds an engine.

vLLM imports this module in every process it starts, as soon as it resolves
``current_platform``; so the attention backend is registered and the process-wide
defaults are set here, before vLLM reads them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

import torch_pjrt  # noqa: F401  (the pjrt device)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.attention.selector import AttentionSelectorConfig

logger = init_logger("vllm.plugins.pjrt")

ATTENTION_BACKEND = "torch_pjrt.serving.vllm.attention.PjrtAttentionBackend"
WORKER = "torch_pjrt.serving.vllm.worker.PjrtWorker"

# The attention layer finds its backend by name in AttentionBackendEnum, so ours takes
# the slot vLLM keeps for out-of-tree backends.
register_backend(AttentionBackendEnum.CUSTOM, ATTENTION_BACKEND)

# NOTE: JAX does not survive fork(): a child forked from a process that has run a pjrt
# program hangs in its first compile. vLLM forks its engine core unless told otherwise
# (it forces spawn only for CUDA, XPU, Ray and WSL).
os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
# NOTE: vLLM's default with torch >= 2.10 compiles through Dynamo's AOT path, which
# expects Inductor's serializable OutputCode back from the backend; the pjrt backend
# returns a callable, so vLLM's plain (JIT) Dynamo path is used.
os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")


class PjrtPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "pjrt"
    device_type: str = "pjrt"
    # vLLM's custom ops (direct_register_custom_op) register their kernel for this key
    dispatch_key: str = "PrivateUse1"
    dist_backend: str = "gloo"
    device_control_env_var: str = "PJRT_VISIBLE_DEVICES"
    # small helpers vLLM compiles on its own (samplers): run them eagerly
    simple_compile_backend: str = "eager"

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return torch.pjrt.get_device_name(device_id)

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return int(torch.pjrt.mem_get_info(device_id)[1])

    @classmethod
    def get_current_memory_usage(cls, device=None) -> float:
        return float(torch.pjrt.memory_allocated(device))

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.pjrt.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.pjrt.manual_seed_all(seed)

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        # torch.empty(..., pin_memory=True) needs a C++ pinned allocator for pjrt
        return False

    @classmethod
    def import_kernels(cls) -> None:
        # vLLM's native kernels (vllm._C) are a CUDA build that needs libcuda; none is used
        return

    @classmethod
    def import_ir_kernels(cls) -> None:
        import vllm.kernels  # noqa: F401  (the built-in IR ops; their "native" form runs)

    @classmethod
    def num_compute_units(cls, device_id: int = 0) -> int:
        return 1

    @classmethod
    def get_attn_backend_cls(
        cls,
        selected_backend: AttentionBackendEnum,
        attn_selector_config: AttentionSelectorConfig,
        num_heads: int | None = None,
    ) -> str:
        if attn_selector_config.use_mla or attn_selector_config.use_sparse:
            raise NotImplementedError(
                "pjrt: multi-head latent attention and sparse attention are not supported "
                "by the pjrt attention backend yet."
            )
        if selected_backend not in (None, AttentionBackendEnum.CUSTOM):
            raise ValueError(
                f"pjrt: attention backend {selected_backend.name} is not available on "
                "pjrt; leave the attention backend unset (the pjrt backend is used)."
            )
        return ATTENTION_BACKEND

    @classmethod
    def opaque_attention_op(cls) -> bool:
        # attention is called through torch.ops.vllm.unified_attention_with_output, so
        # Dynamo does not trace into it and bake one step's lengths into the graph
        return True

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "vllm.distributed.device_communicators.cpu_communicator.CpuCommunicator"

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        # There is no Triton on pjrt: the one Triton kernel plain decoding launches
        # (the block table's slot mapping) gets a version in torch ops.
        from vllm.triton_utils.dispatcher import register_kernels

        from torch_pjrt.serving.vllm.slot_mapping import compute_slot_mapping

        register_kernels(
            {"vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel": compute_slot_mapping}
        )

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        from vllm.config import CompilationMode
        from vllm.config.compilation import CUDAGraphMode

        cache_config = vllm_config.cache_config
        if not cache_config.user_specified_block_size:
            cache_config.block_size = 16

        unsupported = []
        if vllm_config.lora_config is not None:
            unsupported.append("LoRA (--enable-lora)")
        if vllm_config.speculative_config is not None:
            unsupported.append("speculative decoding (--speculative-config)")
        if vllm_config.model_config is not None and vllm_config.model_config.quantization:
            unsupported.append(f"quantization ({vllm_config.model_config.quantization})")
        parallel_config = vllm_config.parallel_config
        if parallel_config.world_size > 1:
            unsupported.append(
                f"tensor or pipeline parallelism (world size {parallel_config.world_size})"
            )
        if unsupported:
            raise NotImplementedError(
                f"pjrt: {', '.join(unsupported)} is not supported by vLLM on pjrt yet; "
                "run without it (docs/serving.md lists what the plugin supports)."
            )

        if parallel_config.worker_cls == "auto":
            parallel_config.worker_cls = WORKER
        parallel_config.disable_custom_all_reduce = True
        parallel_config.enable_dbo = False

        compilation_config = vllm_config.compilation_config
        compilation_config.cudagraph_capture_sizes = []
        compilation_config.cudagraph_mode = CUDAGraphMode.NONE
        if compilation_config.mode != CompilationMode.NONE:
            # the model is traced by Dynamo once and compiled by torch_pjrt's backend;
            # attention (an opaque op) runs between its programs
            compilation_config.mode = CompilationMode.DYNAMO_TRACE_ONCE
            compilation_config.backend = "pjrt"
