"""Worker for the pjrt device.

Derived from vLLM's GPU Worker (vllm/v1/worker/gpu_worker.py), with the CPU
worker's simplifications (vllm/v1/worker/cpu_worker.py) copied in. It must NOT
subclass or import CPUWorker: cpu_worker.py imports vllm.v1.worker.cpu.shm
first thing, which monkeypatches process-wide (torch.accelerator.synchronize
/ empty_cache / get_memory_info, torch.Tensor.pin_memory, torch.cuda.Event /
Stream, and vllm.utils.torch_utils.async_tensor_h2d, which it makes ignore
`device=` and return CPU tensors). With it imported, prompt logprobs failed
with "Expected all tensors to be on the same device, but found at least two
devices, pjrt:0 and cpu!" (gpu_model_runner.py _get_prompt_logprobs_dict ->
sampler.gather_logprobs).
"""

import os
from contextlib import AbstractContextManager, nullcontext

import torch

from vllm.config import CompilationMode, VllmConfig
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.worker_base import CompilationTimes

logger = init_logger(__name__)

DEFAULT_KV_CACHE_BYTES = 64 * 1024 * 1024


class PjrtWorker(Worker):
    def __init__(
        self,
        vllm_config: VllmConfig,
        local_rank: int,
        rank: int,
        distributed_init_method: str,
        is_driver_worker: bool = False,
    ):
        super().__init__(
            vllm_config,
            local_rank,
            rank,
            distributed_init_method,
            is_driver_worker=is_driver_worker,
        )
        self.parallel_config.disable_custom_all_reduce = True

    def init_device(self):
        import torch_pjrt  # noqa: F401

        index = current_platform.logical_device_id_to_visible_device_id(
            self.local_rank
        )
        self.device = torch.device("pjrt", index)
        torch.pjrt.set_device(self.device)

        init_method = self.distributed_init_method
        os.environ["VLLM_DIST_IDENT"] = (
            os.path.basename(init_method.removeprefix("file://"))
            if init_method.startswith("file://")
            else init_method.split(":")[-1]
        )
        init_worker_distributed_environment(
            self.vllm_config,
            self.rank,
            self.distributed_init_method,
            self.local_rank,
            current_platform.dist_backend,
        )
        set_random_seed(self.model_config.seed)

        # Worker.init_device would call _init_workspace_and_model_runner();
        # like CPUWorker, build the runner directly (no workspace manager).
        from vllm_pjrt.model_runner import PjrtModelRunner

        self.model_runner = PjrtModelRunner(self.vllm_config, self.device)

    def _maybe_get_memory_pool_context(self, tag: str) -> AbstractContextManager:
        # Worker's version asks for the CuMem sleep-mode allocator on every
        # platform but CUDA/ROCm/XPU/CPU:
        # "Sleep mode allocator is not available on platform PjrtPlatform".
        return nullcontext()

    def sleep(self, level: int = 1) -> None:
        logger.warning("sleep mode is not supported on pjrt, ignored.")

    def wake_up(self, tags: list[str] | None = None) -> None:
        logger.warning("sleep mode is not supported on pjrt, ignored.")

    @torch.inference_mode()
    def determine_available_memory(self) -> int:
        # Worker's version profiles torch.cuda / torch.accelerator memory
        # (torch.accelerator.get_memory_info is unsupported on pjrt).
        if self.compilation_config.mode != CompilationMode.NONE:
            self.model_runner.profile_run()
        explicit = self.cache_config.kv_cache_memory_bytes
        if explicit is not None:
            size = int(explicit)
        else:
            size = int(
                os.environ.get("PJRT_VLLM_KV_CACHE_BYTES", DEFAULT_KV_CACHE_BYTES)
            )
        logger.info("pjrt: %d bytes for the KV cache", size)
        return size

    def compile_or_warm_up_model(self) -> CompilationTimes:
        set_random_seed(self.model_config.seed, self.parallel_config.data_parallel_index)
        return CompilationTimes(
            language_model=self.compilation_config.compilation_time,
            encoder=self.compilation_config.encoder_compilation_time,
        )
