"""``torch.compile(..., backend="pjrt", mode="reduce-overhead")``: an inference graph
captured at its second call into a ``torch.pjrt.Graph`` and replayed from then on.

Dynamo's guards still choose the graph; each graph has its own capture. Arguments whose
storage is the same at the first two calls (parameters, buffers, a static KV cache) are
read by the graph where they are; the others (the inputs of each call) are copied into
the graph's own static tensors before each replay, as CUDA graph trees do. When an
argument kept in place comes with another storage, the graph is captured again at that
call (at most ``_RECAPTURES`` times, as CUDA graph trees re-record): an argument the
graph writes into (a new KV cache's tensors, a new step counter) is kept in its new
place, any other one is copied from then on (a tensor the caller happened to reuse for
two calls). A new capture of the same ops reuses the compiled program
(``modes.capture``). A call whose arguments no longer fit the capture otherwise (another
shape, another number) runs the graph as usual; a graph that writes into an argument
it would have to copy, or whose capture is refused, is never replayed. The outputs are
the graph's static tensors: the next call overwrites them, as CUDA graph trees' do
(clone an output to keep it).
"""

from __future__ import annotations

import torch

from torch_pjrt.device.graphs import Graph, graph
from torch_pjrt.device.tensor import storage_cell
from torch_pjrt.modes import capture
from torch_pjrt.runtime import events as metrics

__all__ = ["Replayed"]

_RECAPTURES = 64  # captures again of one graph, after the first


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
        self.copied = set()  # positions copied in even where the first calls kept them
        self.recaptures = 0
        self._kinds = ((), (), ())  # the plan's (position, what) pairs, by how

    def __call__(self, *args):
        if self.disabled or capture.active() is not None:
            return self.run(*args)
        if self.graph is None:
            return self._warm(args)
        # (per kind of argument, a loop of its own: a decoding step has ~60 kept ones)
        kept, copied, values = self._kinds
        for i, cell in kept:
            if _cell(args[i]) is not cell:
                return self._recapture(args, i)
        for i, what in copied:
            a = args[i]
            if a.shape != what.shape or a.dtype != what.dtype or a.device != what.device:
                return self._miss(args, "an argument's shape changed")
        for i, what in values:
            a = args[i]
            if not (a is what or a == what):
                return self._miss(args, "an argument's value changed")
        for i, what in copied:
            a = args[i]
            if _cell(a) is not _cell(what):
                what.copy_(a)
        self.graph.replay()
        metrics.count("reduce_overhead_replays")
        return self.outputs

    def _recapture(self, args, i: int):
        """Argument ``i``, kept in place, has another storage now: capture again, now,
        keeping it where it is if the graph writes into it, else copying it from now on."""
        if self.recaptures >= _RECAPTURES:
            return self._miss(args, "an argument's storage changed")
        self.recaptures += 1
        if i not in self.mutated:
            self.copied.add(i)
        metrics.tally("reduce_overhead_recaptures", f"{self.name}: argument {i}")
        # the kept arguments that still are where they were stay kept; moved ones that
        # the graph writes into are kept in their new place
        self.first = [
            _cell(a) if how == "kept" and (j in self.mutated or _cell(a) is what) else None
            for j, (a, (how, what)) in enumerate(zip(args, self.plan))
        ]
        self.graph = self.plan = self.outputs = None
        return self._warm(args)

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
            elif cell is not None and cell is before and i not in self.copied:
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
        self._kinds = tuple(
            [(i, what) for i, (how, what) in enumerate(plan) if how == kind]
            for kind in ("kept", "copied", "value")
        )
        g.replay()  # (the capture ran nothing: this call's values)
        metrics.count("reduce_overhead_replays")
        return outputs
