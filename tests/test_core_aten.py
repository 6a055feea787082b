"""Core ATen: every op tagged ``core`` runs on pjrt, lowered or decomposed into lowered ops.

The core ops are the ``torch.ops.aten`` overloads with ``torch.Tag.core`` in their tags:
the operator set PyTorch's export and compilers decompose everything else into. Each
one reaches pjrt in one of these ways (:func:`how`):

- ``lowered``: a JAX lowering in the registry (``registry.lookup``);
- ``derived``: the in-place or ``out=`` variant of a lowered op, derived from its schema;
- ``native``: a raw PrivateUse1 kernel working on tensors (``@implements``), listed in
  ``NATIVE`` with the reason it cannot be a function of values;
- ``backend decomposition``: PyTorch's decomposition from ``core_aten_decompositions``,
  installed as the pjrt kernel by ``torch_pjrt/ops/decompositions.py``;
- ``implicit`` / ``explicit``: PyTorch's own composite kernel (CompositeImplicitAutograd,
  CompositeExplicitAutograd[NonFunctional]), which calls other ops.

A decomposition counts only if every op it ends in is covered: ``test_every_core_op_is_
covered`` runs each decomposed core op on pjrt tensors (``EXAMPLES``) under a dispatch
mode that records every op reaching the device and runs decompositions under itself, so
the ops they call are classified too, down to lowered or native ones. Inside compiled
graphs the same holds with ``registry.graph_lookup`` and the compiler's decomposition
table (``test_every_core_op_lowers_in_graphs``). The runtime tests compare each example
and the first sample of each OpInfo entry named after a core op (the first 3 for an entry
expected to fail) with the CPU, under ``fallback="error"``; expected failures are in
tests/expectations.py.
"""

from __future__ import annotations

import pytest
import torch
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._python_dispatch import TorchDispatchMode

import torch_pjrt
from tests import expectations as E
from tests.expectations import SHAPE_ONLY, SKIP
from tests.test_ops import (
    DEFAULT_MODE,
    QUICK_SAMPLES,
    compare,
    cpu_copy,
    dtype_for,
    op_key,
    run_sample,
    samples,
    to_pjrt,
)
from torch_pjrt.compile.compiler import _decompositions as graph_decompositions
from torch_pjrt.ops import registry, variants

aten = torch.ops.aten

LOWERED, DERIVED, NATIVE_KERNEL = "lowered", "derived", "native"
BACKEND_DECOMPOSITION, IMPLICIT, EXPLICIT = "backend decomposition", "implicit", "explicit"
DECOMPOSED = (BACKEND_DECOMPOSITION, IMPLICIT, EXPLICIT)

# core ops with a raw kernel (``@implements``) rather than a lowering, and why
NATIVE = {
    aten._local_scalar_dense.default: "item(): reads a value back to the host",
    aten._to_copy.default: "moves data between devices and the host",
    aten.clone.default: "a copy in the layout its memory_format gives (_to_copy's)",
    aten.arange.start_step: "its length is computed from the scalars on the host",
    aten.as_strided.default: "a view: aliases its base's storage",
    aten.view.default: "a view: aliases its base's storage",
    aten.empty.memory_format: "allocates device storage",
    aten.full.default: "other layouts and pinned memory take ATen's empty, then fill_",
    aten.scalar_tensor.default: "other layouts and pinned memory take ATen's empty, then fill_",
    aten.empty_strided.default: "allocates device storage",
    aten.index.Tensor: "a boolean mask selects a data-dependent number of elements",
    aten.index_put.default: "a boolean mask selects a data-dependent number of elements",
    aten.nonzero.default: "its output shape depends on the data",
    aten.resize_.default: "changes the tensor's storage and shape",
}

# core ops a compiled graph leaves to the eager kernels, and why
GRAPH_EAGER = {
    aten._local_scalar_dense.default: "a host read (item()): the eager kernel syncs",
    aten.atan2.out: "out= ops are functionalized away before lowering",
    aten.nonzero.default: "its output shape depends on the data",
    aten.resize_.default: "a storage mutation, functionalized away before lowering",
}


def core_ops() -> list:
    found = []
    for name in dir(aten):
        packet = getattr(aten, name)
        if isinstance(packet, torch._ops.OpOverloadPacket):
            for overload in packet.overloads():
                op = getattr(packet, overload)
                if torch.Tag.core in op.tags:
                    found.append(op)
    return sorted(found, key=str)


# the table torch_pjrt/ops/decompositions.py installs pjrt kernels from
_BACKEND_DECOMPOSITIONS = core_aten_decompositions()


def _has_kernel(op, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)


def _derived(op) -> bool:
    """Whether ``op`` is the in-place or out= variant of a lowered op, whose kernel
    the registry derives from the lowering."""
    packet = getattr(aten, op._schema.name.split("::")[1].removesuffix("_"), None)
    for overload in packet.overloads() if packet is not None else ():
        functional = getattr(packet, overload)
        if registry.lookup(functional) is None:
            continue
        if variants.inplace_variant(functional) == op:
            return True
        if any(variant == op for variant, _ in variants.out_variants(functional)):
            return True
    return False


def how(op) -> str | None:
    """How ``op`` runs on pjrt (None: by no kernel the registry accounts for; it
    falls back to the CPU)."""
    if _has_kernel(op, "PrivateUse1"):  # a pjrt kernel: which one
        if registry.lookup(op) is not None:
            return LOWERED
        if op in registry._RAW:
            return NATIVE_KERNEL
        if _derived(op):
            return DERIVED
        return BACKEND_DECOMPOSITION if op in _BACKEND_DECOMPOSITIONS else None
    # NOTE: a lowered op may have no eager kernel (the dispatcher decomposes it)
    if _has_kernel(op, "CompositeImplicitAutograd"):
        return IMPLICIT
    if _has_kernel(op, "CompositeExplicitAutograd") or _has_kernel(
        op, "CompositeExplicitAutogradNonFunctional"
    ):
        return EXPLICIT
    return None


_PJRT_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)


class Reached(TorchDispatchMode):
    """Records every op reaching pjrt with :func:`how` it runs there.

    A decomposed op is redispatched to its pjrt kernel with this mode active, so the
    ops its decomposition calls are recorded (and followed) too. An op with no pjrt
    kernel raises ``LoweringMissing`` instead of falling back to the CPU.
    """

    def __init__(self):
        super().__init__()
        self.ops: dict = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = self.ops.setdefault(func, how(func))
        if kind is None:
            raise registry.LoweringMissing(func)
        if kind in DECOMPOSED:
            with self:
                return func.redispatch(_PJRT_KEYS, *args, **kwargs)
        return func(*args, **kwargs)


# --- example inputs (CPU) -------------------------------------------------------------
# every decomposed and native core op (traced, and compared with the CPU), and the lowered
# ones no OpInfo entry names (compared)


def _x(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def _norm_backward(group: bool):
    """A norm backward's arguments, its saved statistics from the forward: the
    lowerings recompute the mean from the input, as autograd's saved values allow."""
    x, w, b, grad = _x(2, 6, 4), _x(6), _x(6), _x(2, 6, 4)
    mask = [True, True, True]
    if group:
        _, mean, rstd = aten.native_group_norm.default(x, w, b, 2, 6, 4, 3, 1e-5)
        return [grad, x, mean, rstd, w, 2, 6, 4, 3, mask], {}
    _, mean, rstd = aten.native_layer_norm.default(x, [4], w[:4], b[:4], 1e-5)
    return [grad, x, [4], mean, rstd, w[:4], b[:4], mask], {}


EXAMPLES = {
    aten.adaptive_avg_pool1d.default: lambda: ([_x(2, 3, 10), [4]], {}),
    aten.alias.default: lambda: ([_x(2, 3)], {}),
    aten.avg_pool1d.default: lambda: ([_x(2, 3, 9), [3], [2], [1], True, False], {}),
    aten.clone.default: lambda: ([_x(3, 4).t()], {}),
    aten.col2im.default: lambda: ([_x(1, 12, 12), [4, 5], [2, 2], [1, 1], [0, 0], [1, 1]], {}),
    aten.copy.default: lambda: ([_x(2, 3), _x(3)], {}),
    aten.diagonal.default: lambda: ([_x(3, 4, 5), 1, 0, 2], {}),
    aten.embedding.default: lambda: ([_x(10, 3), torch.tensor([[1, 2], [4, 9]])], {}),
    aten.expand.default: lambda: ([_x(3, 1), [2, 3, 4]], {}),
    aten.full.default: lambda: ([[2, 3], 1.5], {"device": "cpu"}),
    aten.full_like.default: lambda: ([_x(2, 3), 7], {}),
    aten.permute.default: lambda: ([_x(2, 3, 4), [2, 0, 1]], {}),
    aten.rand.default: lambda: ([[3, 4]], {"device": "cpu"}),
    aten.randn.default: lambda: ([[3, 4]], {"device": "cpu"}),
    aten.scalar_tensor.default: lambda: ([2.5], {"device": "cpu"}),
    aten.select.int: lambda: ([_x(3, 4), 1, -1], {}),
    aten.slice.Tensor: lambda: ([_x(6, 4), 0, 1, 5, 2], {}),
    aten.split_with_sizes.default: lambda: ([_x(7, 2), [3, 4]], {}),
    aten.squeeze.dim: lambda: ([_x(3, 1, 4), 1], {}),
    aten.squeeze.dims: lambda: ([_x(1, 3, 1, 4), [0, 2]], {}),
    aten.sym_is_contiguous.default: lambda: ([_x(3, 4).t()], {}),
    aten.sym_numel.default: lambda: ([_x(3, 4)], {}),
    aten.sym_size.int: lambda: ([_x(3, 4), 1], {}),
    aten.sym_storage_offset.default: lambda: ([_x(3, 4)[1:]], {}),
    aten.sym_stride.int: lambda: ([_x(3, 4), 0], {}),
    aten.unsqueeze.default: lambda: ([_x(3, 4), -1], {}),
    aten.upsample_bilinear2d.vec: lambda: ([_x(1, 2, 5, 6), [7, 9], False, None], {}),
    aten.upsample_nearest2d.vec: lambda: ([_x(1, 2, 5, 6), None, [1.5, 2.0]], {}),
    aten.var.dim: lambda: ([_x(2, 3, 8), [1], True, True], {}),
    # native and derived kernels: run and compared, not traced
    aten._local_scalar_dense.default: lambda: ([torch.tensor(2.5)], {}),
    aten._to_copy.default: lambda: ([_x(2, 3)], {"dtype": torch.float64}),
    aten.arange.start_step: lambda: ([1, 10, 3], {"device": "cpu"}),
    aten.as_strided.default: lambda: ([_x(4, 5), [3, 2], [5, 2], 1], {}),
    aten.view.default: lambda: ([_x(4, 6), [3, 8]], {}),
    aten.empty.memory_format: lambda: ([[2, 3]], {"device": "cpu"}),
    aten.empty_strided.default: lambda: ([[2, 3], [1, 2]], {"device": "cpu"}),
    aten.index.Tensor: lambda: ([_x(4, 3), [_x(4) > 0]], {}),
    aten.index_put.default: lambda: ([_x(4, 3), [torch.tensor([0, 2])], _x(3)], {}),
    aten.nonzero.default: lambda: ([_x(3, 4) > 0], {}),
    aten.resize_.default: lambda: ([_x(2, 3), [2, 2]], {}),
    aten.atan2.out: lambda: ([_x(2, 3), _x(2, 3)], {"out": torch.empty(0)}),
    # lowered ops with no OpInfo entry of their name
    aten._adaptive_avg_pool2d.default: lambda: ([_x(2, 3, 7, 9), [3, 4]], {}),
    aten._adaptive_avg_pool2d_backward.default: lambda: ([_x(2, 3, 3, 4), _x(2, 3, 7, 9)], {}),
    aten._adaptive_avg_pool3d.default: lambda: ([_x(1, 2, 5, 6, 7), [2, 3, 4]], {}),
    aten._cdist_forward.default: lambda: ([_x(2, 5, 3), _x(2, 4, 3), 2.0, None], {}),
    aten._embedding_bag.default: lambda: (
        [_x(10, 3), torch.tensor([1, 2, 4, 5, 4, 3]), torch.tensor([0, 2, 5])],
        {"mode": 1},
    ),
    aten._fft_c2r.default: lambda: ([_x(3, 5, dtype=torch.complex64), [1], 2, 8], {}),
    aten._fft_r2c.default: lambda: ([_x(3, 8), [1], 0, True], {}),
    aten._log_softmax.default: lambda: ([_x(3, 5), 1, False], {}),
    aten._softmax.default: lambda: ([_x(3, 5), 0, False], {}),
    aten._native_batch_norm_legit_no_training.default: lambda: (
        [_x(2, 3, 4), _x(3), _x(3), _x(3), _x(3).abs() + 0.5, 0.1, 1e-5],
        {},
    ),
    aten._pdist_forward.default: lambda: ([_x(5, 3), 2.0], {}),
    aten.avg_pool2d_backward.default: lambda: (
        [_x(1, 2, 3, 3), _x(1, 2, 6, 6), [2, 2], [2, 2], [0, 0], False, True, None],
        {},
    ),
    aten.convolution.default: lambda: (
        [_x(2, 4, 7, 7), _x(6, 2, 3, 3), _x(6), [2, 1], [1, 0], [1, 1], False, [0, 0], 2],
        {},
    ),
    aten.convolution_backward.default: lambda: (
        [_x(2, 6, 5, 5), _x(2, 4, 7, 7), _x(6, 4, 3, 3), [6], [1, 1], [0, 0], [1, 1]]
        + [False, [0, 0], 1, [True, True, True]],
        {},
    ),
    aten.elu.default: lambda: ([_x(3, 4), 0.5, 1.5, 2.0], {}),
    aten.embedding_dense_backward.default: lambda: (
        [_x(2, 2, 3), torch.tensor([[1, 2], [2, 9]]), 10, -1, False],
        {},
    ),
    aten.max_pool2d_with_indices.default: lambda: ([_x(1, 2, 6, 7), [3, 2], [2, 2], [1, 0]], {}),
    aten.max_pool3d_with_indices.default: lambda: ([_x(1, 2, 4, 5, 6), [2, 2, 3], [2, 1, 2]], {}),
    aten.native_dropout.default: lambda: ([_x(4, 5), 0.5, True], {}),
    aten.native_group_norm_backward.default: lambda: _norm_backward(group=True),
    aten.native_layer_norm_backward.default: lambda: _norm_backward(group=False),
    aten.randperm.default: lambda: ([6], {"device": "cpu"}),
    aten.reflection_pad1d.default: lambda: ([_x(2, 3, 5), [2, 3]], {}),
    aten.reflection_pad2d.default: lambda: ([_x(1, 2, 4, 5), [1, 2, 3, 0]], {}),
    aten.reflection_pad3d.default: lambda: ([_x(1, 2, 3, 4, 5), [1, 2, 0, 3, 2, 1]], {}),
    aten.replication_pad2d.default: lambda: ([_x(1, 2, 4, 5), [1, 2, 3, 0]], {}),
    aten.replication_pad3d.default: lambda: ([_x(1, 2, 3, 4, 5), [1, 2, 0, 3, 2, 1]], {}),
}

# examples whose CPU result is random or uninitialised: only shape, dtype, device compare
UNCOMPARABLE = {
    aten.rand.default,
    aten.randn.default,
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.native_dropout.default,
    aten.randperm.default,
}


def example(op):
    torch.manual_seed(0)
    return EXAMPLES[op]()


def trace(op) -> dict:
    """{op: how} for every op reaching pjrt when ``op`` runs on its example (until the
    first op with no pjrt kernel, whose ``how`` is None)."""
    args, kwargs = to_pjrt(*example(op))
    reached = Reached()
    try:
        with torch_pjrt.config(fallback="error"), reached:
            op(*args, **kwargs)
    except registry.LoweringMissing:
        pass  # recorded
    return reached.ops


def gaps() -> list[str]:
    """One line per core op that does not end in lowered (or native) kernels on pjrt."""
    found = []
    for op in core_ops():
        kind = how(op)
        if kind is None:
            found.append(f"{op}: no pjrt kernel (it falls back to the CPU)")
        elif kind == NATIVE_KERNEL and op not in NATIVE:
            found.append(f"{op}: a raw kernel, not listed in NATIVE with its reason")
        elif kind in DECOMPOSED:
            if op not in EXAMPLES:
                found.append(f"{op}: {kind}, with no example in EXAMPLES to trace it")
                continue
            missing = [str(o) for o, k in trace(op).items() if k is None]
            found.extend(f"{op}: {kind}, reaches {m}, which has no pjrt kernel" for m in missing)
    return found


def test_every_core_op_is_covered():
    found = gaps()
    assert not found, "core ATen ops pjrt does not cover:\n  " + "\n  ".join(found)


def test_gap_is_detected(monkeypatch):
    """Hiding the lowering a decomposition ends in makes the check fail."""
    monkeypatch.delitem(registry._TABLE, aten.avg_pool2d.default)
    found = gaps()
    assert any(line.startswith("aten.avg_pool2d.default: no pjrt kernel") for line in found)
    assert any("aten.avg_pool1d.default" in line and "avg_pool2d" in line for line in found)


def test_reason_lists_are_honest():
    core = set(core_ops())
    stale = [str(op) for op in NATIVE if op not in core or how(op) != NATIVE_KERNEL]
    assert not stale, f"NATIVE lists ops that are not core raw kernels: {stale}"
    stale = [str(op) for op in GRAPH_EAGER if op not in core or registry.graph_lookup(op)]
    assert not stale, f"GRAPH_EAGER lists ops that are not core or lower in graphs: {stale}"


# --- compiled graphs -------------------------------------------------------------------


def graph_gaps() -> list[str]:
    """Core ops a compiled graph cannot lower: no graph lowering, and a decomposition
    (the compiler's table, else PyTorch's composite) that reaches an op without one."""
    found = []
    table = graph_decompositions()
    for op in core_ops():
        if registry.graph_lookup(op) is not None or op in GRAPH_EAGER:
            continue
        if op not in EXAMPLES:
            found.append(f"{op}: no graph lowering, and no example in EXAMPLES to trace")
            continue
        args, kwargs = example(op)
        graph = make_fx(lambda *a: op(*a, **kwargs), decomposition_table=table)(*args)
        for node in graph.graph.nodes:
            target = node.target
            if node.op == "call_function" and isinstance(target, torch._ops.OpOverload):
                if registry.graph_lookup(target) is None:
                    found.append(f"{op}: decomposes into {target}, which has no graph lowering")
    return found


def test_every_core_op_lowers_in_graphs():
    found = graph_gaps()
    assert not found, "core ATen ops compiled graphs cannot lower:\n  " + "\n  ".join(found)


# --- runtime: compared with the CPU ------------------------------------------------------


def _example_params() -> list:
    return [
        pytest.param(op, id=str(op), marks=E.marks(E.XFAIL_CORE_EXAMPLES, str(op)))
        for op in sorted(EXAMPLES, key=str)
    ]


@pytest.mark.parametrize("op", _example_params())
def test_example_matches_cpu(op):
    args, kwargs = example(op)
    dev_args, dev_kwargs = to_pjrt(args, kwargs)
    cpu_args, cpu_kwargs = cpu_copy(args, kwargs)
    expected = op(*cpu_args, **cpu_kwargs)
    with torch_pjrt.config(fallback="error"):
        actual = op(*dev_args, **dev_kwargs)
    compare(actual, expected, {}, shape_only=op in UNCOMPARABLE)
    compare(dev_args, cpu_args, {}, path="arguments after the op")


def _core_opinfos() -> list:
    """The OpInfo entries of core ops (by their ATen name), one sample each; an entry
    expected to fail (tests/expectations.py, which lists failures within the first
    ``QUICK_SAMPLES``) runs those samples, so that its strict xfail holds."""
    names = {op._schema.name.split("::")[1] for op in core_ops()}
    found = []
    for info in op_db:
        key = op_key(info)
        if info.aten_name not in names:
            continue
        reason = E.op_failure("test_op", key, DEFAULT_MODE)
        marks, limit = [], 1
        if key in SKIP:
            marks.append(pytest.mark.skip(reason=SKIP[key]))
        elif reason is not None:
            marks, limit = [E.xfail(reason)], QUICK_SAMPLES
        found.append(pytest.param(info, limit, id=key, marks=marks))
    return found


@pytest.mark.parametrize("info, limit", _core_opinfos())
def test_opinfo_samples_match_cpu(info, limit):
    dtype = dtype_for(info)
    if dtype is None:
        pytest.skip(E.SKIP_NO_DTYPE)
    cases = samples(info, dtype, limit)
    if not cases:
        pytest.skip(E.SKIP_NO_SAMPLES)
    shape_only = op_key(info) in SHAPE_ONLY
    with torch_pjrt.mode(DEFAULT_MODE):
        compared = [run_sample(info, case, dtype, shape_only) for case in cases]
    if not any(compared):
        pytest.skip(E.SKIP_CPU_REFUSES.format(total=len(cases)))
