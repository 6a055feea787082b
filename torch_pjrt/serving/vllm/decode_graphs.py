"""Decode steps captured and replayed: one XLA program a bucket.

vLLM's CUDA path pads a decode batch to one of a few sizes and replays a CUDA graph of
the whole forward pass for that size. This is the same on pjrt, with
``torch.pjrt.graph``. The model runner pads every batch to its bucket of ``B`` token
rows, and the attention metadata to ``NB`` blocks a request (``attention.py``); a
decode-only batch (every request adds one token) then runs as the graph of ``(B, NB)``.
The graph's inputs are this module's static buffers (token ids, positions, slot mapping,
each row's blocks); each step copies the step's ``B`` rows into them and replays. Its
output is the hidden states of the ``B`` rows, and its KV writes run after each replay
(``attention.write_at``), in a program of their own.

Rows past the batch's requests are padding: their slot is -1, which goes to the null
block (vLLM never gives block 0 to a request), and their outputs are not read. Their
position is one an earlier step left, and their blocks request 0's, so they compute
garbage in their own rows only.

The graph is captured at the first step of its bucket, with vLLM's compiled model
bypassed (``skip_compiled``: the capture records the eager ops, and the replay is one
program anyway). A capture that fails (an op the capture refuses) turns capturing off
for the engine, with a warning: every step then runs as it would without it.
"""

from __future__ import annotations

import torch
from vllm.forward_context import get_forward_context
from vllm.logger import init_logger

from torch_pjrt.serving.vllm import attention

logger = init_logger("vllm.plugins.pjrt")


class DecodeGraphs:
    """The captured decode graphs of one model runner: batches of up to ``max_batch``
    token rows, contexts of up to ``max_blocks`` blocks."""

    def __init__(self, max_batch: int, max_blocks: int, device: torch.device):
        # (B, NB) -> (graph, hidden states, the KV writes to run after each replay)
        self.graphs: dict[tuple[int, int], tuple] = {}
        self.enabled = True
        b, nb = max_batch, max_blocks
        self.input_ids = torch.zeros(b, dtype=torch.int32, device=device)
        self.positions = torch.zeros(b, dtype=torch.int64, device=device)
        self.slots = torch.full((b,), -1, dtype=torch.int64, device=device)
        self.block_table = torch.zeros((b, nb), dtype=torch.int32, device=device)
        self.rows = torch.arange(b, dtype=torch.int64, device=device)

    def bucket(self, input_ids, positions, intermediate_tensors, inputs_embeds, kwargs):
        """The step's attention metadata when it is a decode batch (one token a request,
        padded to ``T`` rows: attention.py) that a graph can run, else None."""
        if not self.enabled or input_ids is None or inputs_embeds is not None:
            return None
        if intermediate_tensors is not None or kwargs or positions.dim() != 1:
            return None
        metadata = get_forward_context().attn_metadata
        if not isinstance(metadata, dict) or not metadata:
            return None
        md = next(iter(metadata.values()))
        if any(m is not md for m in metadata.values()):  # more than one KV cache group
            return None
        b = md.token_pos.shape[0]
        if md.num_actual_tokens != md.num_reqs:
            return None
        if input_ids.shape[0] != b or b > self.rows.shape[0]:
            return None
        if md.max_num_blocks > self.block_table.shape[1]:
            return None
        return md

    def run(self, model, md, input_ids, positions) -> torch.Tensor | None:
        """The hidden states of this decode step (its ``B`` rows), from its bucket's
        graph; None if the graph cannot be captured."""
        b, nb = md.token_pos.shape[0], md.max_num_blocks
        ctx = get_forward_context()
        slot_mapping = next(iter(ctx.slot_mapping.values()))
        # whole buckets, so that these copies too depend on the bucket alone
        self.input_ids[:b].copy_(input_ids)
        self.positions[:b].copy_(positions)
        self.slots[:b].copy_(slot_mapping[:b])
        self.block_table[:b, :nb].copy_(md.block_table[md.token_req])
        entry = self.graphs.get((b, nb))
        if entry is None:
            entry = self._capture(model, b, nb, ctx)
            if entry is None:
                return None
        graph, out, writes = entry
        graph.replay()
        attention.write_layers(writes)
        return out

    def _capture(self, model, b: int, nb: int, ctx):
        positions = self.positions[:b]
        static_md = attention.PjrtAttentionMetadata(
            num_actual_tokens=b,
            num_reqs=b,
            max_num_blocks=nb,
            block_table=self.block_table[:b, :nb],
            token_req=None,  # row t holds token t's blocks
            # (a padding row: a position an earlier step left, its own blocks and keys)
            token_pos=positions,
            cached=positions,
            token_seq=self.rows[:b],
        )
        saved = ctx.attn_metadata, ctx.slot_mapping, ctx.skip_compiled
        ctx.attn_metadata = {name: static_md for name in ctx.attn_metadata}
        ctx.slot_mapping = {name: self.slots[:b] for name in ctx.slot_mapping}
        ctx.skip_compiled = True
        graph = torch.pjrt.Graph()
        writes = attention.deferred_writes = []
        try:
            with torch.pjrt.graph(graph):
                out = model(
                    input_ids=self.input_ids[:b],
                    positions=positions,
                    intermediate_tensors=None,
                    inputs_embeds=None,
                )
        except Exception as exc:  # noqa: BLE001  (the step runs uncaptured, and so do later ones)
            self.enabled = False
            logger.warning(
                "pjrt: capturing the decode step failed (%s: %s); decode steps run "
                "without graphs from now on",
                type(exc).__name__,
                exc,
            )
            return None
        finally:
            ctx.attn_metadata, ctx.slot_mapping, ctx.skip_compiled = saved
            attention.deferred_writes = None
        if not isinstance(out, torch.Tensor):
            self.enabled = False
            logger.warning("pjrt: the model's output is not one tensor; decode graphs off")
            return None
        entry = self.graphs[(b, nb)] = (graph, out, writes)
        logger.info("pjrt: captured the decode graph of %d requests, %d blocks", b, nb)
        return entry
