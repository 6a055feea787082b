"""``torch.compile(..., backend="pjrt", mode="reduce-overhead")``: an inference graph
captured at its second call into a ``torch.pjrt.Graph`` and replayed from then on.

Dynamo's guards still choose the graph; each graph has its own capture. Arguments whose
storage is the same at the first two calls (parameters, buffers, a static KV cache) are
read by the graph where they are; the others (the inputs of each call) are copied into
the graph's own static tensors before each replay, as CUDA graph trees do. A call whose
arguments no longer fit the capture (another storage where one was kept, another shape)
runs the graph as usual; a graph that writes into one of the copied arguments, or whose
capture is refused, is never replayed. The outputs are the graph's static tensors:
the next call overwrites them, as CUDA graph trees' do (clone an output to keep it).
"""

from __future__ import annotations

import torch

from torch_pjrt.device.graphs import Graph, graph
from torch_pjrt.device.tensor import storage_cell
from torch_pjrt.modes import capture
from torch_pjrt.runtime import events as metrics

__all__ = ["Replayed"]


def _cell(a):
    return storage_cell(a.untyped_storage()) if isinstance(a, torch.Tensor) else None


class Replayed:
    """A compiled graph's callable, replayed from its second call (see the module doc).

    Args:
        run: the graph's callable (positional arguments, as AOT autograd calls it).
        mutated: positions of the arguments the graph writes into.
        name: the graph's name, for metrics.
    """

    def __init__(self, run, mutated, name: str):
        self.run = run
        self.mutated = set(mutated)
        self.name = name
        self.first = None  # the first call's argument cells
        self.graph = None
        self.plan = None  # per argument: ("kept", cell), ("copied", tensor) or ("value", v)
        self.outputs = None
        self.disabled = False

    def __call__(self, *args):
        if self.disabled or capture.active() is not None:
            return self.run(*args)
        if self.graph is None:
            return self._warm(args)
        for a, (how, what) in zip(args, self.plan):
            if how == "kept":
                if _cell(a) is not what:
                    return self._miss(args, "an argument's storage changed")
            elif how == "copied":
                if a.shape != what.shape or a.dtype != what.dtype or a.device != what.device:
                    return self._miss(args, "an argument's shape changed")
            elif not (a is what or a == what):
                return self._miss(args, "an argument's value changed")
        for a, (how, what) in zip(args, self.plan):
            if how == "copied" and _cell(a) is not _cell(what):
                what.copy_(a)
        self.graph.replay()
        metrics.count("reduce_overhead_replays")
        return self.outputs

    def _miss(self, args, why: str):
        metrics.tally("reduce_overhead_misses", f"{self.name}: {why}")
        return self.run(*args)

    def _warm(self, args):
        cells = [_cell(a) for a in args]
        if self.first is None or len(self.first) != len(args):
            self.first = cells
            return self.run(*args)
        plan = []
        for i, (a, cell, before) in enumerate(zip(args, cells, self.first)):
            if not isinstance(a, torch.Tensor):
                plan.append(("value", a))
            elif cell is not None and cell is before:
                plan.append(("kept", cell))
            elif i in self.mutated or a.device.type != "pjrt":
                self.disabled = True  # (a write into a copy would be lost)
                metrics.tally("reduce_overhead_misses", f"{self.name}: not capturable")
                return self.run(*args)
            else:
                plan.append(("copied", a.detach().clone()))
        captured_args = [what if how == "copied" else a for a, (how, what) in zip(args, plan)]
        g = Graph()
        try:
            with graph(g):
                outputs = self.run(*captured_args)
        except capture.CaptureError as exc:
            self.disabled = True
            metrics.tally("reduce_overhead_misses", f"{self.name}: {exc}")
            return self.run(*args)
        self.graph, self.plan, self.outputs = g, plan, outputs
        g.replay()  # (the capture ran nothing: this call's values)
        metrics.count("reduce_overhead_replays")
        return outputs
