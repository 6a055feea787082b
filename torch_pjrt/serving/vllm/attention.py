"""Paged attention for the pjrt device in plain PyTorch ops.

vLLM's CPU_ATTN backend calls native kernels (vllm._C: cpu_attn_reshape_and_cache,
cpu_attention_with_kv_cache) that take CPU tensors only. This backend writes the
paged KV cache with index_put and attends over block tables with gathers,
einsum and softmax, all of which run on pjrt tensors.

KV cache per layer: [num_blocks, num_kv_heads, block_size, 2 * head_size]
(the [B, H, N, C] view vLLM allocates, KVCacheLayout.LBHNC); K is
[..., :head_size], V is [..., head_size:].
"""

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from vllm.config import VllmConfig
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionLayer,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheLayout


class PjrtAttentionBackend(AttentionBackend):
    # vLLM calls do_kv_cache_update() before forward()
    # (vllm/model_executor/layers/attention/attention.py, unified_kv_cache_update)
    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[list[torch.dtype]] = [
        torch.float16,
        torch.bfloat16,
        torch.float32,
    ]
    supported_kv_cache_dtypes: ClassVar[list] = ["auto", "float16", "bfloat16", "float32"]

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"  # the AttentionBackendEnum slot registered in platform.py

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None):
        return [MultipleOf(1)]

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []  # any

    @classmethod
    def supported_kv_cache_layouts(cls):
        return (KVCacheLayout.LBHNC,)

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @staticmethod
    def get_impl_cls():
        return PjrtAttentionImpl

    @staticmethod
    def get_builder_cls():
        return PjrtAttentionMetadataBuilder


@dataclass
class PjrtAttentionMetadata:
    num_actual_tokens: int
    num_reqs: int
    max_num_blocks: int  # blocks of the longest context
    block_table: torch.Tensor  # [num_reqs, max_num_blocks] int32, device
    token_req: torch.Tensor  # [num_actual_tokens] int64, device: request of a token
    token_pos: torch.Tensor  # [num_actual_tokens] int64, device: absolute position


class PjrtAttentionMetadataBuilder(AttentionMetadataBuilder[PjrtAttentionMetadata]):
    def __init__(
        self,
        kv_cache_spec: AttentionSpec,
        layer_names: list[str],
        vllm_config: VllmConfig,
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size
        self.device = device

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> PjrtAttentionMetadata:
        m = common_attn_metadata
        num_reqs = m.num_reqs
        n = m.num_actual_tokens
        # Host-side ints (no device sync): query starts are on the CPU, and
        # with async scheduling off seq_lens_cpu_upper_bound is exact.
        qsl = m.query_start_loc_cpu[: num_reqs + 1].numpy().astype(np.int64)
        if m.seq_lens_cpu_upper_bound is not None:
            seq_lens = m.seq_lens_cpu_upper_bound[:num_reqs].numpy().astype(np.int64)
        else:
            seq_lens = m.seq_lens[:num_reqs].cpu().numpy().astype(np.int64)
        q_lens = np.diff(qsl)
        token_req = np.repeat(np.arange(num_reqs, dtype=np.int64), q_lens)
        # absolute position of token t of request r: seq_len - q_len + (t - qs)
        token_pos = (
            np.arange(qsl[-1], dtype=np.int64)
            - np.repeat(qsl[:-1], q_lens)
            + np.repeat(seq_lens - q_lens, q_lens)
        )
        max_seq_len = int(seq_lens.max()) if num_reqs else 0
        max_num_blocks = max(1, -(-max_seq_len // self.block_size))
        return PjrtAttentionMetadata(
            num_actual_tokens=n,
            num_reqs=num_reqs,
            max_num_blocks=max_num_blocks,
            block_table=m.block_table_tensor[:num_reqs, :max_num_blocks],
            token_req=torch.from_numpy(token_req[:n]).to(self.device),
            token_pos=torch.from_numpy(token_pos[:n]).to(self.device),
        )


class PjrtAttentionImpl(AttentionImpl):
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        if alibi_slopes is not None:
            raise NotImplementedError("pjrt attention: ALiBi not supported")
        if sinks is not None:
            raise NotImplementedError("pjrt attention: sinks not supported")
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"pjrt attention: {attn_type} not supported")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.num_queries_per_kv = num_heads // num_kv_heads
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap or 0.0
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name

    def do_kv_cache_update(
        self,
        layer: torch.nn.Module,
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, Dv]
        kv_cache: torch.Tensor,  # [B, Hkv, N, D + Dv]
        slot_mapping: torch.Tensor,  # [T'] int64, -1 for padding
    ) -> None:
        block_size = kv_cache.shape[2]
        d = self.head_size
        # vLLM pads slot_mapping with -1 past the real tokens (PAD_SLOT_ID);
        # the scheduled tokens come first, so drop the tail.
        n = min(key.shape[0], slot_mapping.shape[0])
        from vllm.forward_context import get_forward_context

        md = get_forward_context().attn_metadata
        if isinstance(md, dict):
            md = next(iter(md.values()))
        if md is not None:
            n = min(n, md.num_actual_tokens)
        slots = slot_mapping[:n]
        blk = slots // block_size
        off = slots % block_size
        kv_cache[..., :d][blk, :, off] = key[:n]
        kv_cache[..., d:][blk, :, off] = value[:n]

    def forward(
        self,
        layer: AttentionLayer,
        query: torch.Tensor,  # [T, H, D]
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: PjrtAttentionMetadata | None,
        output: torch.Tensor,  # [T, H, Dv]
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("pjrt attention: fused output quantization")
        if attn_metadata is None:  # profiling / dummy run
            return output
        md = attn_metadata
        n = md.num_actual_tokens
        d = self.head_size
        _, hkv, block_size, _ = kv_cache.shape
        nb = md.max_num_blocks
        s = nb * block_size

        # gather each request's blocks: [R, nb, Hkv, N, D] -> [R, Hkv, S, D]
        bt = md.block_table.to(torch.int64)
        k = kv_cache[..., :d][bt].permute(0, 2, 1, 3, 4).reshape(md.num_reqs, hkv, s, d)
        v = kv_cache[..., d:][bt].permute(0, 2, 1, 3, 4).reshape(md.num_reqs, hkv, s, -1)
        # per token: the keys of its request
        k = k[md.token_req]  # [T, Hkv, S, D]
        v = v[md.token_req]
        q = query[:n].reshape(n, hkv, self.num_queries_per_kv, d)
        scores = torch.einsum("tkgd,tksd->tkgs", q.float(), k.float()) * self.scale
        if self.logits_soft_cap:
            scores = self.logits_soft_cap * torch.tanh(scores / self.logits_soft_cap)
        key_pos = torch.arange(s, device=query.device, dtype=torch.int64)
        # causal: a token sees keys at positions <= its own (which also keeps
        # it inside its own sequence's length)
        allowed = key_pos[None, :] <= md.token_pos[:, None]  # [T, S]
        if self.sliding_window is not None:
            allowed = allowed & (key_pos[None, :] > md.token_pos[:, None] - self.sliding_window)
        scores = scores.masked_fill(~allowed[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.einsum("tkgs,tksd->tkgd", probs, v.float())
        output[:n] = out.reshape(n, self.num_heads, -1).to(output.dtype)
        return output
