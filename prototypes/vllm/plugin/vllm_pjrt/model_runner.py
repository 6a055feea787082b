"""Model runner that keeps the model, its inputs and the KV cache on pjrt.

Derived from vLLM's CPUModelRunner (vllm/v1/worker/cpu_model_runner.py), which
itself is GPUModelRunner with the accelerator APIs stubbed out. Unlike the CPU
runner, the device halves of the CpuGpuBuffers stay device ("pjrt") tensors:
the host side (numpy/CPU tensors) keeps the bookkeeping and each step copies
input ids, positions, block tables and the rest to the device, as on CUDA.
"""

import os
from contextlib import AbstractContextManager, nullcontext

import torch

from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.v1.kv_cache_interface import (
    KVCacheConfig,
    UniformTypeKVCacheSpecs,
    compute_layer_kv_cache_shape_bytes,
)
from vllm.v1.worker.cpu_model_runner import CPUModelRunner, _torch_cuda_wrapper
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.utils import bind_kv_cache, map_kv_caches_to_kernel_blocks

logger = init_logger(__name__)


class PjrtModelRunner(CPUModelRunner):
    def __init__(self, vllm_config: VllmConfig, device: torch.device):
        # CPUModelRunner.__init__ asserts device == cpu and then points every
        # CpuGpuBuffer's .gpu at its .cpu; skip both and run GPUModelRunner's
        # __init__ with torch.Event / torch.cuda.Stream stubbed (the CPU
        # runner's wrapper), so device-side buffers are real pjrt tensors.
        with _torch_cuda_wrapper():
            GPUModelRunner.__init__(self, vllm_config, device)
        self.use_cuda_graph = False
        from vllm_pjrt import patches

        patches.apply()

    def _update_states(self, scheduler_output):
        # seeded requests: CPU generators (see vllm_pjrt/patches.py)
        from vllm_pjrt.patches import cpu_generators_for_pjrt

        with cpu_generators_for_pjrt():
            return super()._update_states(scheduler_output)

    def _dummy_sampler_run(self, *args, **kwargs):
        from vllm_pjrt.patches import cpu_generators_for_pjrt

        with cpu_generators_for_pjrt():
            return super()._dummy_sampler_run(*args, **kwargs)

    def load_model(self, load_dummy_weights: bool = False) -> None:
        super().load_model(load_dummy_weights=load_dummy_weights)
        devices = {str(p.device) for p in self.model.parameters()}
        logger.info("pjrt: model parameters on %s", sorted(devices))

    def execute_model(self, *args, **kwargs):
        out = super().execute_model(*args, **kwargs)
        path = os.environ.get("PJRT_VLLM_METRICS")
        if path:  # debugging aid: torch_pjrt's counters after every step
            import json

            import torch_pjrt

            d = torch_pjrt.metrics.as_dict()
            d["_steps"] = getattr(self, "_pjrt_steps", 0) + 1
            self._pjrt_steps = d["_steps"]
            d["_kv_cache_devices"] = sorted({str(t.device) for t in self.kv_caches})
            with open(path, "w") as f:
                json.dump(d, f, default=str, indent=1)
        return out

    def _sync_device(self) -> None:
        torch.pjrt.synchronize()

    def initialize_kv_cache_tensors(
        self,
        kv_cache_config: KVCacheConfig,
        kernel_block_sizes: list[int],
        kv_cache_allocation_context: AbstractContextManager | None = None,
    ) -> dict[str, torch.Tensor]:
        """One tensor per layer, allocated in the cache dtype.

        vLLM's allocate_kv_cache() (vllm/v1/worker/utils.py) makes one int8
        buffer and views each layer out of it with as_strided + view(dtype);
        torch_pjrt refuses view(dtype) across element sizes
        ("pjrt: viewing a torch.int8 tensor as torch.float32 (a different
        element size) is not supported yet"), so allocate [B, H, N, C] per
        layer directly. (Per-layer tensors also keep each KV write from
        rewriting the one storage cell that holds every layer.)
        """
        if os.environ.get("PJRT_VLLM_STOCK_KV_ALLOC") == "1":  # to reproduce the gap
            return super().initialize_kv_cache_tensors(
                kv_cache_config, kernel_block_sizes, kv_cache_allocation_context
            )
        kv_caches: dict[str, torch.Tensor] = {}
        with kv_cache_allocation_context or nullcontext():
            for tensor in kv_cache_config.kv_cache_tensors:
                layer_name = tensor.layers[0]
                group_id, group = next(
                    (gid, g)
                    for gid, g in enumerate(kv_cache_config.kv_cache_groups)
                    if layer_name in g.layer_names
                )
                spec = group.kv_cache_spec
                if isinstance(spec, UniformTypeKVCacheSpecs):
                    spec = spec.kv_cache_specs[layer_name]
                if not spec.has_layer_views:
                    raise NotImplementedError(
                        f"pjrt: KV cache spec {type(spec).__name__} not supported"
                    )
                num_blocks = kv_cache_config.num_blocks_of(tensor)
                kbs = (
                    kernel_block_sizes[group_id]
                    if group_id < len(kernel_block_sizes)
                    else None
                )
                b, h, n, c_bytes = compute_layer_kv_cache_shape_bytes(
                    spec, num_blocks, kbs
                )
                dtype = spec.dtype
                assert c_bytes % dtype.itemsize == 0
                for name in tensor.layers:
                    kv_caches[name] = torch.zeros(
                        (b, h, n, c_bytes // dtype.itemsize),
                        dtype=dtype,
                        device=self.device,
                    )

        for layer_name, target_layer_name in self.shared_kv_cache_layers.items():
            kv_caches[layer_name] = kv_caches[target_layer_name]

        attn_groups = [g for groups in self.attn_groups for g in groups]
        bind_kv_cache(
            kv_caches,
            self.compilation_config.static_forward_context,
            self.kv_caches,
            1,
            kv_cache_groups=kv_cache_config.kv_cache_groups,
            layer_kv_caches=map_kv_caches_to_kernel_blocks(kv_caches, attn_groups),
        )
        return kv_caches
