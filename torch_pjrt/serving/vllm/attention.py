"""Paged attention for the pjrt device in plain PyTorch ops.

vLLM's CPU_ATTN backend calls native kernels (vllm._C: cpu_attn_reshape_and_cache,
cpu_attention_with_kv_cache) that take CPU tensors only. This backend writes the
paged KV cache with index_put and attends over block tables with gathers,
einsum and softmax, all of which run on pjrt tensors; or, where the ``attention``
setting says (:meth:`PjrtAttentionImpl._kernel_impl`), attends over the cached keys
with the kernel library's ``pjrt::paged_attention_kv``, merged with the step's own
keys by their log-sum-exps.

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

from torch_pjrt.config import settings
from torch_pjrt.device.tensor import argument, replace, write
from torch_pjrt.kernels.paged_attention import paged_attention_kv
from torch_pjrt.modes import fused
from torch_pjrt.runtime import events as metrics
from torch_pjrt.runtime.platform import GPU_PLATFORMS, current_platform


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


def padded(n: int, cap: int) -> int:
    """The bucket of a count: the next power of two, at most ``cap`` (never below n)."""
    return max(n, min(1 << max(n - 1, 0).bit_length(), cap))


def buckets(cap: int) -> list[int]:
    """Every bucket of a count up to ``cap`` (:func:`padded`), ascending."""
    return sorted({padded(1 << k, cap) for k in range(cap.bit_length())})


@dataclass
class PjrtAttentionMetadata:
    """A step's attention inputs, padded to buckets so that the step's programs depend on
    the buckets alone, not on the batch: ``T`` token rows (the model runner pads the
    batch to the same ``T``: ``model_runner.py``) and ``NB`` blocks a request, each the
    next power of two at or above the true count. A token attends to the keys its
    request had cached before the step and to the step's own keys of its request up to
    its position; a padding token only to itself (and writes to the null block: slot
    -1)."""

    num_actual_tokens: int  # the true tokens; the rows past them are padding
    num_reqs: int  # the true requests
    max_num_blocks: int  # NB
    # [rows, NB] int32, device: each request's blocks; with token_req None, row t is
    # token t's
    block_table: torch.Tensor
    token_req: torch.Tensor | None  # [T] int64, device: the request (row) of each token
    token_pos: torch.Tensor  # [T] int64, device: absolute position (padding: 0)
    cached: torch.Tensor  # [T] int64, device: keys its request had before the step
    token_seq: torch.Tensor  # [T] int64, device: its request, -1 for padding (the mask)


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
        self.max_tokens = vllm_config.scheduler_config.max_num_batched_tokens

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
        max_seq_len = int(seq_lens.max()) if num_reqs else 0
        # the whole [max reqs, max blocks] buffer the runner's block table is rows of
        table = m.block_table_tensor
        offset = table.storage_offset()
        elements = table.untyped_storage().nbytes() // table.element_size() - offset
        rows = elements // table.stride(0)
        nb = padded(max(1, -(-max_seq_len // self.block_size)), table.shape[1])
        t = padded(n, self.max_tokens)
        req = np.repeat(np.arange(num_reqs, dtype=np.int64), q_lens)[:n]
        cached = np.repeat(seq_lens - q_lens, q_lens)[:n]
        # absolute position of token t of request r: seq_len - q_len + (t - qs)
        pos = np.arange(n, dtype=np.int64) - np.repeat(qsl[:-1], q_lens)[:n] + cached
        # the four per-token rows in one host-to-device copy (padding: 0, 0, 0, -1)
        host = np.zeros((4, t), dtype=np.int64)
        host[0, :n], host[1, :n], host[2, :n] = req, pos, cached
        host[3] = -1
        host[3, :n] = req
        rows_of = torch.from_numpy(host).to(self.device)
        return PjrtAttentionMetadata(
            num_actual_tokens=n,
            num_reqs=num_reqs,
            max_num_blocks=nb,
            block_table=table.as_strided((rows, nb), table.stride(), offset),
            token_req=rows_of[0],
            token_pos=rows_of[1],
            cached=rows_of[2],
            token_seq=rows_of[3],
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
        self._new = None  # this step's (K and V rows, slots), from do_kv_cache_update

    def do_kv_cache_update(
        self,
        layer: torch.nn.Module,
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, Dv]
        kv_cache: torch.Tensor,  # [B, Hkv, N, D + Dv]
        slot_mapping: torch.Tensor,  # [T'] int64, -1 for padding
    ) -> None:
        """Keep this step's K and V for :meth:`forward`, which attends over the cache
        and over them, then writes them into the cache.

        NOTE: XLA on the CPU copies a whole cache when one program both reads it and
        updates it in place (even with its buffer donated), which costs more than
        the step; so no program does both: the reads come first, the write runs in a
        program of its own (:func:`write_rows`)."""
        from vllm.forward_context import get_forward_context

        md = get_forward_context().attn_metadata
        if isinstance(md, dict):
            md = next(iter(md.values()))
        # the step's T rows (vLLM pads slot_mapping with -1 past the true tokens)
        t = min(key.shape[0], slot_mapping.shape[0]) if md is None else md.token_pos.shape[0]
        if key.shape[0] < t or slot_mapping.shape[0] < t:
            raise RuntimeError(
                f"pjrt attention: the batch has {key.shape[0]} token rows and "
                f"{slot_mapping.shape[0]} slots, but its metadata {t}: the model runner "
                "and the metadata builder padded it differently (a torch_pjrt bug)"
            )
        rows = torch.cat([key[:t], value[:t].to(key.dtype)], dim=-1)  # [T, Hkv, D + Dv]
        # (the runner keeps the slot mapping on the host and copies it for the model's
        # steps; vLLM's dummy runs pass the host's)
        slot_mapping = slot_mapping.to(kv_cache.device, non_blocking=True)
        if md is None:  # a dummy run: no attention follows
            write_rows(kv_cache, rows, slot_mapping[:t])
            return
        self._new = (rows, slot_mapping[:t])

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
        new, self._new = self._new, None
        if attn_metadata is None:  # profiling / dummy run
            return output
        md = attn_metadata
        t = md.token_pos.shape[0]
        d = self.head_size
        _, hkv, block_size, _ = kv_cache.shape
        # each token's request's blocks: [T, NB]
        bt = md.block_table if md.token_req is None else md.block_table[md.token_req]
        q = query[:t].reshape(t, hkv, self.num_queries_per_kv, d).float()
        pos = md.token_pos
        kernel = self._kernel_impl()
        metrics.tally("attention_paths", "paged xla" if kernel is None else "paged kernel")
        parts = []  # (masked scores [T, Hkv, G, K], values [.., K, Dv], kind) of the keys
        if kernel is None:  # the keys cached before this step, gathered
            s = md.max_num_blocks * block_size
            # [T, NB, Hkv, N, D + Dv] -> [T, Hkv, S, D + Dv]
            kv = kv_cache[bt.to(torch.int64)].permute(0, 2, 1, 3, 4).reshape(t, hkv, s, -1)
            key_pos = torch.arange(s, device=query.device, dtype=torch.int64)
            if new is not None:  # this step's keys come below
                allowed = key_pos[None, :] < md.cached[:, None]  # [T, S]
            else:  # a layer reading another's cache, which that layer has written this step
                allowed = key_pos[None, :] <= pos[:, None]
            if self.sliding_window is not None:
                allowed = allowed & (key_pos[None, :] > pos[:, None] - self.sliding_window)
            parts.append((self._scores(q, kv[..., :d], "cache", allowed), kv[..., d:], "cache"))
        if new is not None:  # this step's keys: of the same request, at or before it
            rows, slots = new
            allowed = (md.token_seq[:, None] == md.token_seq[None, :]) & (
                pos[None, :] <= pos[:, None]
            )  # [T, T]
            if self.sliding_window is not None:
                allowed = allowed & (pos[None, :] > pos[:, None] - self.sliding_window)
            parts.append((self._scores(q, rows[..., :d], "new", allowed), rows[..., d:], "new"))
        out = 0
        if parts:
            scores = torch.cat([sc for sc, _, _ in parts], dim=-1)
            probs = torch.softmax(scores, dim=-1)
            start = 0
            for sc, values, kind in parts:
                p = probs[..., start : start + sc.shape[-1]]
                out = out + torch.einsum(_EINSUM[kind][1], p, values.float())
                start += sc.shape[-1]
        if kernel is not None:  # the cached keys by the kernel, merged by log-sum-exps
            lens = md.cached if new is not None else pos + 1
            softcap = self.logits_soft_cap or None
            cached, lse = paged_attention_kv(
                query[:t].float(),
                kv_cache,
                bt,
                lens,
                scale=self.scale,
                softcap=softcap,
                impl=kernel,
            )
            cached = cached.reshape(*q.shape[:3], -1)
            if parts:  # (an empty cache: lse -inf, weight 0)
                weight = torch.sigmoid(lse.reshape(q.shape[:3]) - torch.logsumexp(scores, -1))
                out = out + weight[..., None] * (cached - out)
            else:
                out = cached
        output[:t] = out.reshape(t, self.num_heads, -1).to(output.dtype)
        if new is not None:
            if deferred_writes is not None:  # a decode graph's capture: after each replay
                # (the slots' blocks and offsets computed in the graph: one op a layer after)
                deferred_writes.append((kv_cache, rows, *slot_index(slots, block_size)))
            else:
                fused.flush_all("end of step")  # (the reads above run first, on their own)
                write_rows(kv_cache, rows, slots)
        return output

    def _scores(
        self, q: torch.Tensor, keys: torch.Tensor, kind: str, allowed: torch.Tensor
    ) -> torch.Tensor:
        """q [T, Hkv, G, D] against keys (``kind``: "cache", [T, Hkv, S, D], each token's
        request's; "new", [T, Hkv, D], the step's), -inf where not ``allowed`` ([T, S] or
        [T, T])."""
        scores = torch.einsum(_EINSUM[kind][0], q, keys.float()) * self.scale
        if self.logits_soft_cap:
            scores = self.logits_soft_cap * torch.tanh(scores / self.logits_soft_cap)
        return scores.masked_fill(~allowed[:, None, None, :], float("-inf"))

    def _kernel_impl(self) -> str | None:
        """The ``impl`` of the kernel library's ``paged_attention_kv`` for the keys cached
        before the step, or None for the XLA path (a gather of each token's blocks): the
        setting ``attention`` (``TORCH_PJRT_ATTENTION``): ``"auto"`` takes the kernel on
        GPU (where our Pallas kernel compiles), ``"kernel"`` everywhere (on the CPU
        interpreted: for tests), ``"xla"`` never; a sliding window always takes XLA (the
        kernel has none)."""
        wanted = settings.attention
        if wanted == "xla" or self.sliding_window is not None:
            return None
        if wanted == "kernel":
            return "pallas"
        return "auto" if current_platform() in GPU_PLATFORMS else None


# (scores, output) of each kind of keys (PjrtAttentionImpl._scores)
_EINSUM = {
    "cache": ("tkgd,tksd->tkgs", "tkgs,tksd->tkgd"),
    "new": ("tkgd,ukd->tkgu", "tkgu,ukd->tkgd"),
}

# the KV writes of the decode graph being captured (decode_graphs.py), else None
deferred_writes: list | None = None


def slot_index(slots: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(block, offset) of each slot. A slot of -1 (padding) goes to block 0, the null
    block vLLM gives to no request."""
    slots = slots.clamp(min=0)
    return slots // block_size, slots % block_size


def write_rows(kv_cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> None:
    """``rows`` ([T, Hkv, D + Dv]) into the cache's slots (:func:`slot_index`)."""
    write_at(kv_cache, rows, *slot_index(slots, kv_cache.shape[2]))


def warm_up_writes(kv_caches, sizes, dtype: torch.dtype) -> None:
    """Compile the KV write of a step (:func:`write_rows`, a program of its own after
    the step's attention) for each bucket of token rows in ``sizes`` and each shape of
    cache, writing rows of zeros to the null block (slot -1). The warm-up's dummy steps
    write no KV (vLLM runs them without slot mappings)."""
    shapes = set()
    for cache in kv_caches:
        if (cache.shape, cache.dtype) in shapes:
            continue
        shapes.add((cache.shape, cache.dtype))
        for t in sizes:
            rows = torch.zeros((t, *cache.shape[1::2]), dtype=dtype, device=cache.device)
            slots = torch.full((t,), -1, dtype=torch.int64).to(cache.device)
            fused.flush_all("warm-up")  # (the step's rows and slots: arrays of their own)
            write_rows(cache, rows, slots)
            fused.flush_all("warm-up")


def write_layers(writes: list) -> None:
    """A decode graph's KV writes after its replay (``(kv_cache, rows, block, offset)``
    a layer: :func:`write_at`'s arguments) as one op for all layers, where an indexing
    op a layer costs its recording each step; each cache's new value is its own (its
    old buffer donated in fused mode)."""
    if not writes:
        return
    caches = tuple(argument(w[0], True) for w in writes)
    rest = tuple(argument(t, True) for w in writes for t in w[1:])
    index = writes[0][0].device.index or 0
    new = fused.apply(_scatter_layers, (caches, rest), index, "kv writes")
    for (cache, *_), value in zip(writes, new):
        if not replace(cache, value, owned=True):  # (a cache that is a view)
            write(cache, value, owned=True)
    # (a program of its own, which depends on the batch's bucket alone; recorded with
    # the sampler's ops, which follow the exact request count, it would not)
    fused.flush_all("the decode step's KV writes")


def _scatter_layers(caches, rest):
    """The new value of each cache: ``cache[block, :, offset] = rows`` (rows, block,
    offset: three entries of ``rest`` a cache)."""
    return tuple(
        cache.at[rest[3 * i + 1], :, rest[3 * i + 2]].set(rest[3 * i].astype(cache.dtype))
        for i, cache in enumerate(caches)
    )


def write_at(kv_cache: torch.Tensor, rows: torch.Tensor, block, offset) -> None:
    """``rows`` into the cache at (block, offset).

    NOTE: one write of K and V side by side into the whole cache: a write through the
    view ``kv_cache[..., :d]`` would rewrite every block of the cache."""
    kv_cache[block, :, offset] = rows
