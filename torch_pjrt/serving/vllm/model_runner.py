"""The model runner: the model, its inputs and the KV cache on pjrt.

Derived from vLLM's CPUModelRunner (vllm/v1/worker/cpu_model_runner.py), which
itself is GPUModelRunner with the accelerator APIs stubbed out. What runs where:

- vLLM's bookkeeping arithmetic of a step (each token's request and position, the
  query starts, sequence lengths and computed tokens: ``_HOST_BUFFERS`` and
  ``_HOST_TENSORS``) runs on the host, as in the CPU runner.
- What the model and the sampler read is on pjrt, each copied to the device whole or
  padded to the step's bucket, so that the copies' shapes never follow the step's
  exact token or request count: the token ids (kept on the device, where asynchronous
  scheduling writes the last step's sampled tokens into them), the block tables, the
  positions and slot mapping (``_model_forward``), the attention metadata (built on
  the host: attention.py) and the padding mask.
"""

import contextlib
import dataclasses
import functools
from contextlib import AbstractContextManager, nullcontext

import numpy as np
import torch
from vllm.config import VllmConfig
from vllm.forward_context import get_forward_context
from vllm.logger import init_logger
from vllm.v1.kv_cache_interface import (
    KVCacheConfig,
    UniformTypeKVCacheSpecs,
    compute_layer_kv_cache_shape_bytes,
)
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.utils import bind_kv_cache, map_kv_caches_to_kernel_blocks

from torch_pjrt.modes import fused
from torch_pjrt.serving.vllm import attention, generators, slot_mapping
from torch_pjrt.serving.vllm.decode_graphs import DecodeGraphs

logger = init_logger("vllm.plugins.pjrt")


# torch.cuda's names the runner calls, and torch.pjrt's of the same signature
_STREAM_API = ("Event", "Stream", "current_stream", "stream")

# GPUModelRunner's bookkeeping that only its input preparation computes with, kept on
# the host as vLLM's CPU runner keeps it: its per-step arithmetic then runs as CPU ops.
# On pjrt it was about 30 recorded device ops whose shapes follow the step's exact token
# and request counts, so that each new mix of prompts compiled new programs (15 to 30
# programs each time requests arrived in a new pattern). CpuGpuBuffers, then tensors:
_HOST_BUFFERS = (
    "query_start_loc", "req_indices", "query_pos", "num_scheduled_tokens",
    "num_accepted_tokens", "prev_positions", "prev_num_draft_tokens",
)  # fmt: skip
_HOST_TENSORS = ("positions", "seq_lens", "num_computed_tokens")


def _copy_whole(buffer, n: int | None = None, clear: bool = False) -> torch.Tensor:
    """``CpuGpuBuffer.copy_to_gpu`` copying the whole buffer: a copy of the same shape
    every step. Rows past ``n`` are padding, which nothing reads but a padded batch's
    padding rows; ``clear`` zeroes them first (token ids: past ``n`` the host's buffer
    keeps older steps' rows, with the placeholders of tokens still being sampled)."""
    if clear and n is not None:
        buffer.np[n:] = 0
    buffer.gpu.copy_(buffer.cpu, non_blocking=True)
    return buffer.gpu if n is None else buffer.gpu[:n]


@contextlib.contextmanager
def _pjrt_streams(building: bool = False):
    """GPUModelRunner's streams and events (``torch.cuda.Stream``, ``torch.cuda.Event``,
    and while it is built ``torch.Event``: the input preparation's event, the
    asynchronous output copy of async scheduling) made as pjrt ones while the runner's
    own code runs; put back after it (the engine's process runs nothing else then)."""
    patched = [(torch.cuda, name, getattr(torch.pjrt, name)) for name in _STREAM_API]
    if building:
        patched.append((torch, "Event", torch.pjrt.Event))
    saved = [(module, name, getattr(module, name)) for module, name, _ in patched]
    try:
        for module, name, value in patched:
            setattr(module, name, value)
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


class PjrtModelRunner(CPUModelRunner):
    def __init__(self, vllm_config: VllmConfig, device: torch.device):
        # CPUModelRunner.__init__ asserts device == cpu and then points every
        # CpuGpuBuffer's .gpu at its .cpu; skip both and run GPUModelRunner's
        # __init__ with its streams and events made on pjrt, so device-side buffers
        # are real pjrt tensors; then the bookkeeping ones go to the host.
        with _pjrt_streams(building=True):
            GPUModelRunner.__init__(self, vllm_config, device)
        self.use_cuda_graph = False
        for name in _HOST_BUFFERS:
            buffer = getattr(self, name)
            buffer.gpu = buffer.cpu
        self._device_positions = self.positions  # (dummy runs call the model directly)
        for name in _HOST_TENSORS:
            setattr(self, name, torch.zeros_like(getattr(self, name), device="cpu"))
        # the token ids stay on the device (async scheduling writes the last step's
        # sampled tokens into them there), copied whole
        self.input_ids.copy_to_gpu = functools.partial(_copy_whole, self.input_ids, clear=True)
        mask = self.discard_request_mask  # (the sampler reads its rows of the requests)
        mask.copy_to_gpu = functools.partial(_copy_whole, mask)
        self._host_tables = None  # the block tables _prepare_inputs set up last
        self._logits_rows = None  # (bucket, true) rows of the step's logits
        # async scheduling: each token row's row in the last step's sampled tokens, or
        # -1; and the sampled tokens kept in a buffer of the batch's most requests
        self._token_source = self._make_buffer(self.max_num_tokens, dtype=torch.int32)
        self._sampled = torch.zeros(self.max_num_reqs, dtype=torch.int32, device=self.device)
        self._sampled_of = None  # the sampler's output _sampled holds
        generators.install()
        self.decode_graphs = None  # made with the KV cache (initialize_kv_cache_tensors)

    def sample_tokens(self, grammar_output):
        # (with async scheduling: the sampled tokens' copy to the host, not waited for)
        with _pjrt_streams():
            return super().sample_tokens(grammar_output)

    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens_np):
        # the slot mapping from the host's values (slot_mapping.on_host), not by vLLM's
        # kernel over the device's copies of them
        block_table = self.input_batch.block_table
        if block_table is not self._host_tables:  # (new tables come with a new batch)
            for table in block_table.block_tables:  # committed whole; slots on the host
                table.block_table.copy_to_gpu = functools.partial(_copy_whole, table.block_table)
                table.slot_mapping.gpu = table.slot_mapping.cpu  # (see _model_forward)
            self._host_tables = block_table
        block_table.compute_slot_mapping = self._slot_mapping_on_host
        try:
            logits_indices, spec, *rest = super()._prepare_inputs(
                scheduler_output, num_scheduled_tokens_np
            )
        finally:
            del block_table.compute_slot_mapping
        return (self._padded_logits_indices(logits_indices, spec), spec, *rest)

    def _padded_logits_indices(self, indices: torch.Tensor, spec) -> torch.Tensor:
        """The rows of the step's hidden states to compute logits for, padded to the
        bucket of the request count (``attention.padded``) with copies of the last: the
        logits' program (a gather from the step's ``T`` rows and the LM head) then
        depends on the buckets of ``T`` and of the request count, not on the exact count;
        :meth:`_compute_logits` hands the sampler the true rows."""
        n = indices.shape[0]
        self._logits_rows = None
        if spec is not None or self.cache_config.kv_sharing_fast_prefill or n == 0:
            return indices
        bucket = attention.padded(n, self.max_num_reqs)
        self._logits_rows = (bucket, n)
        if bucket == n:
            return indices
        return torch.cat([indices, indices[-1:].expand(bucket - n)])

    def _compute_logits(self, compute, hidden_states: torch.Tensor):
        """The model's ``compute_logits`` of a padded set of rows
        (:meth:`_padded_logits_indices`): its program runs on its own (the sampler's
        ops, which follow the exact request count, record a program apart), and the
        sampler gets the true rows."""
        rows, self._logits_rows = self._logits_rows, None
        logits = compute(hidden_states)
        if rows is None or logits is None or hidden_states.shape[0] != rows[0]:
            return logits
        fused.flush_all("the step's logits")
        return logits if rows[0] == rows[1] else logits[: rows[1]]

    def _prepare_input_ids(
        self, scheduler_output, num_reqs: int, total_num_scheduled_tokens: int, cu_num_tokens
    ) -> None:
        """The step's token ids, with asynchronous scheduling: each request the last
        step ran as well takes its last token from the tokens that step sampled, which
        are still on the device. vLLM copies them with a slice or a scatter whose shapes
        follow how many requests the two steps share and which; here the host says for
        every row of the whole buffer where its token comes from (a row of the sampled
        tokens, or -1: the host's ids), and one gather and select writes the whole
        buffer: a program of fixed shapes (the sampled tokens are read from the buffer
        :meth:`_sample` keeps). The host's ids are copied only when some token is not a
        sampled one, the rows only when they changed (a decode batch's are the same
        every step). (With speculative decoding, prompt embeddings or pipeline stages:
        vLLM's own.)"""
        sampled = self.input_batch.prev_sampled_token_ids
        if (
            sampled is None
            or sampled.shape[1] != 1
            or self.enable_prompt_embeds
            or self.speculative_config is not None
            or self._pp_recv_work is not None
        ):
            return super()._prepare_input_ids(
                scheduler_output, num_reqs, total_num_scheduled_tokens, cu_num_tokens
            )
        last = self.prev_positions.np[:num_reqs]
        shared = last >= 0
        count = int(shared.sum())
        if count < total_num_scheduled_tokens:  # (else every token is a sampled one)
            _copy_whole(self.input_ids, total_num_scheduled_tokens, clear=True)
        if not count:
            return
        source = self._token_source
        rows = np.full_like(source.np, -1)
        rows[cu_num_tokens[:num_reqs][shared] - 1] = last[shared]
        if not np.array_equal(rows, source.np):  # (a decode batch's repeats every step)
            source.np[:] = rows
            _copy_whole(source)
        ids = self.input_ids.gpu
        tokens = self._sampled if sampled is self._sampled_of else sampled[:, 0]
        ids.copy_(torch.where(source.gpu >= 0, tokens[source.gpu.clamp(min=0)], ids))

    def _sample(self, logits, spec_decode_metadata):
        """vLLM's sampling; with asynchronous scheduling the sampled tokens are also
        copied into a buffer of a fixed size, recorded with the sampler's own ops, from
        which the next step's token ids take them (:meth:`_prepare_input_ids`: a program
        of fixed shapes)."""
        out = super()._sample(logits, spec_decode_metadata)
        tokens = out.sampled_token_ids
        self._sampled_of = None
        if (
            self.use_async_scheduling
            and spec_decode_metadata is None
            and tokens.dim() == 2
            and tokens.shape[1] == 1
            and tokens.shape[0] <= self._sampled.shape[0]
            and tokens.device == self._sampled.device
        ):
            self._sampled[: tokens.shape[0]].copy_(tokens[:, 0])
            self._sampled_of = tokens
        return out

    def _slot_mapping_on_host(self, num_reqs, query_start_loc, positions) -> None:
        n = positions.shape[0]
        req = self.req_indices.np[:n]  # (set by _prepare_inputs before this call)
        pos = self.input_batch.num_computed_tokens_cpu[req] + self.query_pos.np[:n]
        slot_mapping.on_host(self.input_batch.block_table.block_tables, req, pos)

    def _prepare_padding_mask(self, num_tokens_unpadded: int, num_tokens_padded: int):
        """Which of the step's padded tokens are padding (read by mixture-of-experts
        routers), made on the host and copied whole. vLLM fills the two parts of a
        device buffer: ops whose shapes follow the step's exact token count, so each new
        count made a new program."""
        mask = np.arange(num_tokens_padded) >= num_tokens_unpadded
        return torch.from_numpy(mask).to(self.device, non_blocking=True)

    def _update_states(self, scheduler_output):
        # a seeded request's generator is a PjrtGenerator (generators.py)
        with generators.pjrt_generators():
            return super()._update_states(scheduler_output)

    def _dummy_run(self, *args, **kwargs):
        # (vLLM's dummy runs call the model with rows of self.positions: the device's)
        host, self.positions = self.positions, self._device_positions
        try:
            return super()._dummy_run(*args, **kwargs)
        finally:
            self.positions = host

    def _dummy_sampler_run(self, *args, **kwargs):
        with generators.pjrt_generators():
            return super()._dummy_sampler_run(*args, **kwargs)

    def load_model(self, load_dummy_weights: bool = False) -> None:
        super().load_model(load_dummy_weights=load_dummy_weights)
        self.model.compute_logits = functools.partial(
            self._compute_logits, self.model.compute_logits
        )
        devices = {str(p.device) for p in self.model.parameters()}
        logger.info("pjrt: model parameters on %s", sorted(devices))

    def _determine_batch_execution_and_padding(self, num_tokens: int, *args, **kwargs):
        """vLLM's choice, with the batch padded to its bucket of tokens (the next power of
        two): the attention metadata is padded the same way (attention.py), so a step's
        programs depend on its buckets, not on its exact sizes, and compile once each."""
        mode, batch, *rest = super()._determine_batch_execution_and_padding(
            num_tokens, *args, **kwargs
        )
        bucket = attention.padded(num_tokens, self.max_num_tokens)
        if batch.num_tokens < bucket:
            batch = dataclasses.replace(batch, num_tokens=bucket)
        return (mode, batch, *rest)

    def _model_forward(
        self,
        input_ids=None,
        positions=None,
        intermediate_tensors=None,
        inputs_embeds=None,
        **model_kwargs,
    ):
        # what the model reads of the host's bookkeeping, copied whole (its bucket's rows)
        if positions is not None and positions.device.type == "cpu":
            positions = positions.to(self.device, non_blocking=True)
        ctx = get_forward_context()
        if ctx.slot_mapping:
            ctx.slot_mapping = {
                name: slots.to(self.device, non_blocking=True)
                for name, slots in ctx.slot_mapping.items()
            }
        graphs = self.decode_graphs
        if graphs is not None:
            bucket = graphs.bucket(
                input_ids, positions, intermediate_tensors, inputs_embeds, model_kwargs
            )
            if bucket is not None:
                out = graphs.run(self.model, bucket, input_ids, positions)
                if out is not None:
                    return out
        return super()._model_forward(
            input_ids, positions, intermediate_tensors, inputs_embeds, **model_kwargs
        )

    def _sync_device(self) -> None:
        torch.pjrt.synchronize()

    def initialize_kv_cache_tensors(
        self,
        kv_cache_config: KVCacheConfig,
        kernel_block_sizes: list[int],
        kv_cache_allocation_context: AbstractContextManager | None = None,
    ) -> dict[str, torch.Tensor]:
        """One tensor a layer, [blocks, kv heads, block size, 2 * head size], in the
        cache's dtype.

        vLLM's own allocation (one int8 buffer, each layer a dtype view of a slice) works
        on pjrt too, but then every layer's KV write is an update of the one buffer that
        holds all layers; a tensor a layer keeps each write to its own layer.
        """
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
                kbs = kernel_block_sizes[group_id] if group_id < len(kernel_block_sizes) else None
                b, h, n, c_bytes = compute_layer_kv_cache_shape_bytes(spec, num_blocks, kbs)
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

        # (enforce_eager is vLLM's switch for CUDA graphs too; a layer that reads another's
        # KV cache would read it before a captured step's writes, which come after it)
        if not self.model_config.enforce_eager and not self.shared_kv_cache_layers:
            table = self.input_batch.block_table[0].block_table.gpu  # [max reqs, max blocks]
            batch = attention.padded(self.max_num_reqs, self.max_num_tokens)
            self.decode_graphs = DecodeGraphs(batch, table.shape[1], self.device)
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
