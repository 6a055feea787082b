"""The Dynamo backend: AOT autograd, then one GraphProgram per graph (or per part)."""

from __future__ import annotations

import functools
import os
import pathlib

import torch
import torch.fx
from torch._ops import OpOverload

from torch_pjrt.compile import hops
from torch_pjrt.compile.nodes import node_supported
from torch_pjrt.compile.program import GraphProgram
from torch_pjrt.compile.program import _spmd_collectives as _collectives
from torch_pjrt.config import settings
from torch_pjrt.ops.registry import graph_lookup
from torch_pjrt.runtime import events as metrics

__all__ = ["backend", "dump_graphs"]


def dump_graphs(path: str | os.PathLike | None) -> None:
    """Write every graph compiled from now on to ``path`` (None stops).

    Each program gives ``<name>.fx.txt`` (the FX graph of ATen ops it was lowered
    from) and ``<name>.stablehlo.mlir`` (the StableHLO handed to XLA), where name is
    ``graph_<n>_<kind>`` and kind is forward, backward, inference or part (a piece
    of a graph with eager nodes). It sets ``settings.dump_graphs``, which the
    ``TORCH_PJRT_DUMP_GRAPHS`` variable sets at start-up.
    """
    settings.dump_graphs = path


class _Dumper:
    @property
    def active(self) -> bool:
        return settings.dump_graphs is not None

    def write(self, program: GraphProgram, lowered) -> None:
        out = pathlib.Path(settings.dump_graphs)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{program.name}.fx.txt").write_text(
            program.gm.print_readable(print_output=False, include_stride=True, include_device=True)
        )
        (out / f"{program.name}.stablehlo.mlir").write_text(lowered.as_text())


_DUMPER = _Dumper()


@functools.cache
def _decompositions() -> dict:
    """PyTorch's decompositions for the ops that have no lowering of their own, and
    pjrt's of SDPA's overrideable ops."""
    from torch._decomp import decomposition_table

    from torch_pjrt.kernels import attention

    table = {
        op: fn
        for op, fn in decomposition_table.items()
        if isinstance(op, OpOverload)
        and graph_lookup(op) is None
        and not fn.__module__.startswith("torch._refs")  # they end in prims
    }
    table.update(attention.decompositions())  # (SDPA's overrideable backend: its paths' ops)
    return table


class _Part(torch.nn.Module):
    """A partition of a graph, compiled; called by the eager rest of the graph."""

    def __init__(self, program: GraphProgram):
        super().__init__()
        self.program = program

    def forward(self, *args):
        out = self.program(*args)
        return tuple(out) if self.program.output_is_seq else out[0]


def _boxed(fn):
    def call(args):
        values = list(args)
        args.clear()  # let AOT autograd free inputs it no longer needs
        return fn(*values)

    call._boxed_call = True
    return call


def _compile_graph(gm: torch.fx.GraphModule, example_inputs, kind: str, replay: bool = False):
    hops.inline(gm, _decompositions())
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    supported = node_supported
    if not _one_group(calls):  # collectives of several groups: each runs on its own
        supported = lambda n: node_supported(n) and not _collectives.is_collective(n)  # noqa: E731
    unsupported = [n for n in calls if not supported(n)]
    if not unsupported:
        n_user, aliases = _output_info(kind)
        program = GraphProgram(gm, kind, n_user_outputs=n_user, alias_outputs=aliases)
        program.dumper = _DUMPER
        run = lambda *args: _unpack(program, args)  # noqa: E731
        if replay:  # mode="reduce-overhead": captured at the second call, then replayed
            from torch_pjrt.compile.replay import Replayed

            run = Replayed(run, program.mutated_positions, program.name)
        return _boxed(run)
    for n in unsupported:
        metrics.tally("graph_eager_ops", str(n.target))
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupport

    class _Support(OperatorSupport):
        def is_node_supported(self, submodules, node):
            return node.op == "call_function" and supported(node)

    partitioner = CapabilityBasedPartitioner(gm, _Support(), allows_single_node_partition=True)
    fused = partitioner.fuse_partitions(partitioner.propose_partitions())
    for node in fused.graph.nodes:
        if node.op == "call_module":
            sub = getattr(fused, node.target)
            program = GraphProgram(sub, "part", parent_kind=kind)
            program.dumper = _DUMPER
            setattr(fused, node.target, _Part(program))
    fused.recompile()
    return _boxed(fused.forward)


def _one_group(calls) -> bool:
    """Whether the graph's functional collectives (if any) all name one pjrt group, so
    that it can run as that group's SPMD program (torch_pjrt/distributed/compiled.py)."""
    return _collectives is None or _collectives.collective_group(calls)[0]


def _output_info(kind: str):
    """From AOT autograd's metadata: how many outputs of a training forward are the
    user's (None: all), and which graph outputs alias an input or another output (AOT
    rebuilds those from the strides we return)."""
    if kind == "backward":
        return None, frozenset()
    from torch._guards import TracingContext

    meta = getattr(TracingContext.try_get(), "fw_metadata", None)
    if meta is None:
        return None, frozenset(range(10**6))  # unknown: treat every output as an alias
    first = meta.num_mutated_inp_runtime_indices
    # NOTE: unsafe_view_alias outputs are returned as they are, like non-aliases
    plain = ("non_alias", "unsafe_view_alias")
    aliases = frozenset(
        first + i for i, info in enumerate(meta.output_info) if info.output_type.name not in plain
    )
    return (meta.num_forward if kind == "forward" else None), aliases


def _unpack(program: GraphProgram, args):
    out = program(*args)
    return out if program.output_is_seq else out[0]


def _record_dynamo_compile() -> None:
    """Count Dynamo's graph compilations and, for recompilations, their reason."""
    from torch._dynamo.utils import get_metrics_context
    from torch._guards import CompileContext

    compile_id = CompileContext.current_compile_id()
    metrics.count("dynamo_graphs")
    if compile_id is not None and compile_id.frame_compile_id:
        reason = get_metrics_context()._metrics.get("recompile_reason") or "unknown"
        metrics.count("dynamo_recompilations")
        metrics.tally("dynamo_recompile_reasons", str(reason))


_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def backend(gm: torch.fx.GraphModule, example_inputs, mode: str | None = None, **options):
    """The ``pjrt`` backend of ``torch.compile``: forward and backward graphs, each
    lowered by the op registry into one XLA program.

    ``mode`` (``torch.compile(..., mode=...)``): with ``"reduce-overhead"`` an inference
    graph (no autograd) is captured at its second call into a ``torch.pjrt.Graph`` and
    replayed from then on (``compile/replay.py``); training graphs, and the other modes,
    compile as the default does (each graph is one XLA program already). A whole
    training step replays as one program with ``torch.pjrt.graph`` (docs/graphs.md).

    Example:
        >>> model = torch.compile(model.to("pjrt"), backend="pjrt")
    """
    from torch._dynamo.backends.common import aot_autograd

    from torch_pjrt.compile.dynamo import skip_torch_pjrt

    skip_torch_pjrt()
    if mode is not None and mode not in _MODES:
        raise ValueError(f"torch.compile mode must be one of {', '.join(_MODES)}, got {mode!r}")
    if options:
        raise TypeError(f"the pjrt backend takes no options, got {sorted(options)}")
    _record_dynamo_compile()
    return aot_autograd(
        fw_compiler=functools.partial(_compile_graph, kind="forward"),
        bw_compiler=functools.partial(_compile_graph, kind="backward"),
        inference_compiler=functools.partial(
            _compile_graph, kind="inference", replay=mode == "reduce-overhead"
        ),
        decompositions=_decompositions(),
        keep_inference_input_mutations=True,
    )(gm, example_inputs)
