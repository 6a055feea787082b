"""``torch.compile(..., backend="pjrt", mode="reduce-overhead")``: an inference graph
captured at its second call into a ``torch.pjrt.Graph`` and replayed from then on.

Dynamo's guards still choose the graph; each graph has its own capture. Arguments whose
storage is the same at the first two calls (parameters, buffers, a static KV cache) are
read by the graph where they are; the others (the inputs of each call) go into the
graph's own static tensors before each replay, as CUDA graph trees copy them (here the
static tensor takes the argument's array itself: no op, ``_fill``). When an
argument kept in place comes with another storage, the graph is rebound at that call
(``Captured.rebind``: no capture, the same program, no limit): an argument the graph
writes into (a new KV cache's tensors, a new step counter) is kept in its new place, any
other one is copied from then on (a tensor the caller happened to reuse for two calls).
Where the new storage cannot stand in for the old one (another layout, storages shared
otherwise than at the capture, an output viewing it), the graph is captured again (at
most ``_RECAPTURES`` times, as CUDA graph trees re-record); a new capture of the same
ops reuses the compiled program (``modes.capture``). A call whose arguments no longer
fit the capture otherwise (another shape, another number) runs the graph as usual; a
graph that writes into an argument it would have to copy, or whose capture is refused,
is never replayed. The outputs are the graph's static tensors: the next call overwrites
them, as CUDA graph trees' do (clone an output to keep it).
"""

from __future__ import annotations

import torch

from torch_pjrt.device.graphs import Graph, graph
from torch_pjrt.device.tensor import read, replace, storage_cell
from torch_pjrt.modes import capture
from torch_pjrt.runtime import events as metrics

__all__ = ["Replayed"]

_RECAPTURES = 64  # captures again of one graph, after the first


def _cell(a):
    return storage_cell(a.untyped_storage()) if isinstance(a, torch.Tensor) else None


def _fill(static: torch.Tensor, a: torch.Tensor) -> None:
    """``static.copy_(a)`` (same shape and dtype) where that needs no op: the static input
    takes ``a``'s array itself, which never changes (``a``'s storage then no longer owns
    it alone: neither donates it). A copy_ otherwise (a strided static input)."""
    if not replace(static, read(a, lazy=True)):
        static.copy_(a)


def _layout(t: torch.Tensor) -> tuple:
    """How ``t`` lies in its storage: what a captured op's read of it was recorded with."""
    return (t.shape, t.stride(), t.storage_offset(), t.dtype)


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
        self.layouts = None  # per kept argument, its layout at the capture (_layout)

    def __call__(self, *args):
        if self.disabled or capture.active() is not None:
            return self.run(*args)
        if self.graph is None:
            return self._warm(args)
        # (per kind of argument, a loop of its own: a decoding step has ~60 kept ones)
        kept, copied, values = self._kinds
        for i, cell in kept:
            if _cell(args[i]) is not cell:
                if not self._rebind(args):
                    return self._recapture(args, i)
                return self(*args)  # (every kept argument in place now)
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
                _fill(what, a)
        self.graph.replay()
        metrics.count("reduce_overhead_replays")
        return self.outputs

    def _rebind(self, args) -> bool:
        """Kept arguments with other storages now, laid out as at the capture: the graph
        reads and writes those in their place from now on (``Captured.rebind``: the
        same program, no capture), those the graph writes kept where they are, the
        others copied into static tensors of their own from now on. False (nothing
        changed) when that cannot stand for a new capture: a new storage of another
        size or layout, two storages where the capture had one (or one for two), a
        storage the graph uses elsewhere, or an output that is a view of a moved one."""
        captured = self.graph._check()
        moved, plan, copied = {}, list(self.plan), []
        for i, (how, cell) in enumerate(self.plan):
            if how != "kept":
                continue
            a = args[i]
            new = _cell(a)
            if new is not cell:
                if new is None or _layout(a) != self.layouts[i]:
                    return False
                if new.size != cell.size or new.dtype != cell.dtype or new.index != cell.index:
                    return False
                if i not in self.mutated:  # (an input the caller happened to reuse)
                    static = a.detach().clone()
                    if _layout(static) != self.layouts[i]:
                        return False
                    copied.append(i)
                    plan[i] = ("copied", static)
                    new = _cell(static)
                else:
                    plan[i] = ("kept", new)
            if moved.setdefault(cell, new) is not new:
                return False
        moved = {old: new for old, new in moved.items() if new is not old}
        targets = set(moved.values())
        if len(targets) != len(moved) or targets & (captured.cells() - moved.keys()):
            return False
        outputs = torch.utils._pytree.tree_leaves(self.outputs)
        if any(_cell(o) in moved for o in outputs):
            return False
        captured.rebind(moved)
        self.copied.update(copied)
        self._planned(plan)
        metrics.tally("reduce_overhead_rebinds", self.name)
        return True

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

    def _planned(self, plan: list) -> None:
        self.plan = plan
        self._kinds = tuple(
            [(i, what) for i, (how, what) in enumerate(plan) if how == kind]
            for kind in ("kept", "copied", "value")
        )

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
        self.graph, self.outputs = g, outputs
        self._planned(plan)
        self.layouts = [_layout(a) if how == "kept" else None for a, (how, _) in zip(args, plan)]
        g.replay()  # (the capture ran nothing: this call's values)
        metrics.count("reduce_overhead_replays")
        return outputs
