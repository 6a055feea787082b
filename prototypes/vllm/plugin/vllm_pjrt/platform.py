"""vLLM Platform for the torch_pjrt "pjrt" PrivateUse1 device."""

import os
from typing import TYPE_CHECKING

import torch
import torch_pjrt  # noqa: F401  registers the "pjrt" device

from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.attention.selector import AttentionSelectorConfig

logger = init_logger(__name__)

PJRT_ATTN_BACKEND = "vllm_pjrt.attention.PjrtAttentionBackend"

# The attention layer looks its backend up by name in AttentionBackendEnum
# (vllm/model_executor/layers/attention/attention.py: AttentionBackendEnum[
# self.attn_backend.get_name()]), so the backend takes the CUSTOM slot.
# This module is imported in every process (front end, engine core, workers)
# when current_platform is resolved, so the registration happens everywhere.
register_backend(AttentionBackendEnum.CUSTOM, PJRT_ATTN_BACKEND)

# JAX/XLA is not fork-safe: once a process has run anything on the pjrt device
# (vLLM's front end does, e.g. seeding through manual_seed_all), a child made
# by fork() hangs in its first XLA compile (jax/_src/compiler.py
# backend_compile_and_load). vLLM forks the engine core / workers unless
# VLLM_WORKER_MULTIPROC_METHOD=spawn (vllm/utils/system_utils.py
# _maybe_force_spawn only forces spawn for CUDA/XPU/Ray/WSL).
os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")


def _compile_enabled() -> bool:
    return os.environ.get("PJRT_VLLM_COMPILE", "0") == "1"


class PjrtPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "pjrt"
    device_type: str = "pjrt"
    # custom ops registered through direct_register_custom_op() go to this key
    dispatch_key: str = "PrivateUse1"
    dist_backend: str = "gloo"
    device_control_env_var: str = "PJRT_VISIBLE_DEVICES"
    # torch.compile of small helper functions (vllm uses it e.g. in samplers)
    simple_compile_backend: str = "eager"

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        try:
            return torch.pjrt.get_device_name(device_id)
        except Exception:
            return "pjrt"

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
        return False

    @classmethod
    def import_kernels(cls) -> None:
        # The default imports vllm._C / vllm._moe_C_stable_libtorch, which in
        # the CUDA wheel need libcuda; nothing of vllm's native kernels is used.
        return

    @classmethod
    def import_ir_kernels(cls) -> None:
        import vllm.kernels  # noqa: F401  (built-in IR op impls; "native" used)

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        return

    @classmethod
    def num_compute_units(cls, device_id: int = 0) -> int:
        return 1

    @classmethod
    def get_attn_backend_cls(
        cls,
        selected_backend: "AttentionBackendEnum",
        attn_selector_config: "AttentionSelectorConfig",
        num_heads: int | None = None,
    ) -> str:
        if attn_selector_config.use_mla or attn_selector_config.use_sparse:
            raise NotImplementedError("pjrt: MLA / sparse attention not supported")
        if selected_backend not in (None, AttentionBackendEnum.CUSTOM):
            logger.info("pjrt: ignoring attention backend %s", selected_backend)
        return PJRT_ATTN_BACKEND

    @classmethod
    def opaque_attention_op(cls) -> bool:
        # True: attention is called through torch.ops.vllm.unified_attention_*
        # (registered for dispatch_key PrivateUse1), so Dynamo does not trace
        # into it and bake per-step Python ints into the graph.
        return _compile_enabled()

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "vllm.distributed.device_communicators.cpu_communicator.CpuCommunicator"

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        # No Triton here: vLLM's placeholder would be launched. Replace the one
        # kernel that plain decoding needs (slot mapping) with torch ops that
        # run on pjrt tensors.
        from vllm.triton_utils.dispatcher import register_kernels

        from vllm_pjrt.kernels import compute_slot_mapping_kernel

        register_kernels(
            {
                "vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel": (
                    compute_slot_mapping_kernel
                ),
            }
        )

    @classmethod
    def check_and_update_config(cls, vllm_config: "VllmConfig") -> None:
        from vllm.config import CompilationMode
        from vllm.config.compilation import CUDAGraphMode

        cache_config = vllm_config.cache_config
        if not cache_config.user_specified_block_size:
            cache_config.block_size = 16

        vllm_config.scheduler_config.async_scheduling = False

        parallel_config = vllm_config.parallel_config
        if parallel_config.worker_cls == "auto":
            parallel_config.worker_cls = "vllm_pjrt.worker.PjrtWorker"
        parallel_config.disable_custom_all_reduce = True
        if parallel_config.enable_dbo:
            parallel_config.enable_dbo = False

        compilation_config = vllm_config.compilation_config
        compilation_config.cudagraph_capture_sizes = []
        compilation_config.cudagraph_mode = CUDAGraphMode.NONE
        if compilation_config.mode != CompilationMode.NONE and _compile_enabled():
            # Experimental: one Dynamo trace of the model, compiled by
            # torch_pjrt's torch.compile backend; attention stays an opaque
            # custom op (opaque_attention_op) and runs eagerly between programs.
            compilation_config.mode = CompilationMode.DYNAMO_TRACE_ONCE
            compilation_config.backend = "pjrt"
            logger.info("pjrt: CompilationMode.DYNAMO_TRACE_ONCE, backend=pjrt")
        elif compilation_config.mode != CompilationMode.NONE:
            logger.warning(
                "pjrt prototype: vLLM compilation mode %s is not wired up yet; "
                "running the model eagerly (CompilationMode.NONE).",
                compilation_config.mode,
            )
            compilation_config.mode = CompilationMode.NONE
