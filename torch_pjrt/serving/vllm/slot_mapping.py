"""The block tables' slot mapping: on the host for the model runner's steps, and
vLLM's Triton kernel in torch ops for its other callers."""

import numpy as np
import torch
from vllm.v1.attention.backends.utils import PAD_SLOT_ID
from vllm.v1.worker.block_table import SlotMappingMode


def on_host(block_tables, req: np.ndarray, pos: np.ndarray) -> None:
    """Each token's KV slot from the host's block tables (vLLM commits them to the
    device as they are), written to each table's slot mapping buffer with the padding
    past the tokens (PAD_SLOT_ID), which reaches the device as one copy of the step's
    bucket of rows (the model runner keeps the buffer on the host and copies it with
    the model's inputs), where the kernel below records about twenty device ops a step.
    ``req`` and ``pos``: each token's request row and position, the host values the
    device's are copied from (exact: speculative decoding, whose host values are
    guesses, is refused on pjrt)."""
    n = pos.shape[0]
    for table in block_tables:
        if table.slot_mapping_mode == SlotMappingMode.NONE:  # (recurrent state indices)
            continue
        assert table.dcp_world_size == 1, "context parallelism is not supported on pjrt"
        size = table.block_size
        slots = table.slot_mapping.np
        slots[:n] = table.block_table.np[req, pos // size].astype(np.int64) * size + pos % size
        slots[n:] = PAD_SLOT_ID
        table.slot_mapping.copy_to_gpu()


def compute_slot_mapping(
    num_tokens,
    max_num_tokens,
    query_start_loc_ptr,  # [num_reqs + 1], int32
    positions_ptr,  # [num_tokens], int64
    block_table_ptr,  # [max_num_reqs, max_num_blocks_per_req], int32
    block_table_stride,
    slot_mapping_ptr,  # [max_num_tokens], int64 (written)
    KV_CACHE_BLOCK_SIZE,
    TOTAL_CP_WORLD_SIZE,
    TOTAL_CP_RANK,
    CP_KV_CACHE_INTERLEAVE_SIZE,
    PAD_ID,
    BLOCK_SIZE,
):
    """Same contract as vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel
    (parameter names kept so the dispatcher forwards launch kwargs by name)."""
    assert TOTAL_CP_WORLD_SIZE == 1, "context parallelism is not supported on pjrt"
    num_tokens = int(num_tokens)
    dev = slot_mapping_ptr.device
    num_reqs = query_start_loc_ptr.shape[0] - 1
    if num_tokens > 0:
        qsl = query_start_loc_ptr.to(torch.int64)
        tok = torch.arange(num_tokens, device=dev, dtype=torch.int64)
        # request index of each token: number of request starts <= token - 1
        req = torch.searchsorted(qsl[1 : num_reqs + 1], tok, right=True)
        pos = positions_ptr[:num_tokens].to(torch.int64)
        blk_idx = pos // KV_CACHE_BLOCK_SIZE
        blocks = block_table_ptr[req, blk_idx].to(torch.int64)
        slots = blocks * KV_CACHE_BLOCK_SIZE + (pos % KV_CACHE_BLOCK_SIZE)
        slot_mapping_ptr[:num_tokens].copy_(slots)
    if max_num_tokens > num_tokens:
        slot_mapping_ptr[num_tokens:max_num_tokens].fill_(PAD_ID)
