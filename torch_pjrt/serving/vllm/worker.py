"""The worker vLLM starts on a pjrt device: the device, the model runner, the KV budget.

Derived from vLLM's GPU ``Worker``, not from its CPU worker: importing
``vllm.v1.worker.cpu_worker`` loads ``cpu/shm.py``, which patches process-wide
(``torch.accelerator``'s memory calls, ``Tensor.pin_memory``, and vLLM's
``async_tensor_h2d``, which then ignores ``device=`` and returns CPU tensors: prompt
logprobs mixed pjrt and CPU tensors with it).
"""

from __future__ import annotations

import os
import time
from contextlib import AbstractContextManager, nullcontext

import torch
from vllm.config import CompilationMode
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.worker_base import CompilationTimes

from torch_pjrt.serving.vllm import attention

logger = init_logger("vllm.plugins.pjrt")

# On the CPU platform the "device" memory is the host's, shared with everything else:
# without --kv-cache-memory-bytes the KV cache gets this much, not a share of the host.
CPU_KV_CACHE_BYTES = 1 << 30


class PjrtWorker(Worker):
    def init_device(self):
        index = current_platform.logical_device_id_to_visible_device_id(self.local_rank)
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
        from torch_pjrt.serving.vllm.model_runner import PjrtModelRunner

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
        """Bytes for the KV cache: ``kv_cache_memory_bytes`` when given; else the share
        ``gpu_memory_utilization`` of the device's memory less what the model and one
        profiling step hold (on the CPU platform, at most ``CPU_KV_CACHE_BYTES``)."""
        explicit = self.cache_config.kv_cache_memory_bytes
        if explicit is None or self.compilation_config.mode != CompilationMode.NONE:
            self.model_runner.profile_run()  # also compiles for the largest batch
        if explicit:
            size = int(explicit)
        else:
            total = torch.pjrt.mem_get_info(self.device)[1]
            used = torch.pjrt.max_memory_allocated(self.device)
            size = int(total * self.cache_config.gpu_memory_utilization) - int(used)
            if torch.pjrt.get_device_properties(self.device).platform == "cpu":
                size = min(size, CPU_KV_CACHE_BYTES)
            if size <= 0:
                raise RuntimeError(
                    f"pjrt: no memory left for the KV cache on {self.device} (the model "
                    f"and a profiling step use {used} of {total} bytes at "
                    f"gpu_memory_utilization={self.cache_config.gpu_memory_utilization}); "
                    "raise --gpu-memory-utilization or pass --kv-cache-memory-bytes."
                )
        logger.info("pjrt: %d bytes for the KV cache on %s", size, self.device)
        return size

    def compile_or_warm_up_model(self) -> CompilationTimes:
        if not self.model_config.enforce_eager:
            self._warm_up_token_buckets()
        set_random_seed(self.model_config.seed, self.parallel_config.data_parallel_index)
        return CompilationTimes(
            language_model=self.compilation_config.compilation_time,
            encoder=self.compilation_config.encoder_compilation_time,
        )

    def pjrt_metrics(self) -> dict:
        """torch_pjrt's counters in this worker's process (``torch_pjrt.metrics``:
        compilations and their causes, host syncs, transfers). The engine runs in a
        process of its own; ``llm.collective_rpc("pjrt_metrics")`` reads them, one
        dict a worker."""
        import torch_pjrt

        return torch_pjrt.metrics.as_dict()

    def _warm_up_token_buckets(self) -> None:
        """Compile the model's programs for every bucket of a step's token count now
        (``attention.padded``: the powers of two up to the step's token budget), not at
        the first step of each bucket, which would wait for them (vLLM's GPU worker
        warms its compile sizes the same way): a dummy step a bucket, largest first,
        and the KV write of each bucket. (The attention between the compiled parts
        still records its ops at a bucket's first real step: a dummy step of many
        tokens has no metadata a real step has.)"""
        runner = self.model_runner
        sizes = attention.buckets(runner.max_num_tokens)
        start = time.perf_counter()
        for size in reversed(sizes):
            runner._dummy_run(size, skip_eplb=True, remove_lora=False)
        attention.warm_up_writes(runner.kv_caches, sizes, runner.model_config.dtype)
        logger.info(
            "pjrt: warmed up the model for %d token buckets (%s) in %.1f s",
            len(sizes),
            ", ".join(map(str, sizes)),
            time.perf_counter() - start,
        )
