"""Higher-order ops in a graph, replaced by the ATen ops of their dense implementation.

AOT autograd leaves some higher-order ops in the graphs it hands a backend: FlexAttention
writes ``flex_attention`` (forward) and ``flex_attention_backward``, each holding the
user's ``score_mod`` and ``mask_mod`` as subgraphs. Inductor generates a kernel for them;
the op registry lowers ATen ops only, so without this pass such a node would split the
graph and run eagerly, op by op. :func:`inline` traces PyTorch's own dense
implementation of each (the one CPU PyTorch runs without compile: ``score_mod`` vmapped
over the score matrix, masked softmax, matmuls) on the node's fake values into ATen ops
and puts those in the node's place, so the attention and the code around it are one XLA
program. The trace is functionalized and decomposed as AOT autograd's graphs are.

Example:
    >>> inline(gm)  # before the graph is lowered; a graph without such nodes is unchanged
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import operator

import torch
import torch.fx
from torch.utils import _pytree as pytree

from torch_pjrt.runtime import events as metrics

__all__ = ["inline"]


@functools.cache
def _dense() -> dict:
    """Each higher-order op that has a dense implementation: the op, the function."""
    # (the package exports the op under the module's name: import the module itself)
    flex = importlib.import_module("torch._higher_order_ops.flex_attention")
    return {
        flex.flex_attention: flex.sdpa_dense,
        flex.flex_attention_backward: flex.sdpa_dense_backward,
    }


def inline(gm: torch.fx.GraphModule, decompositions: dict) -> bool:
    """Replace each higher-order op with a dense implementation by its ATen ops, traced
    with ``decompositions``; whether the graph changed."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not isinstance(
            node.target, torch._ops.HigherOrderOperator
        ):
            continue
        fn = _dense().get(node.target)
        if fn is not None and _inline_node(gm, node, fn, decompositions):
            changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return changed


def _inline_node(gm, node, fn, decompositions) -> bool:
    from torch._guards import detect_fake_mode
    from torch.fx.experimental.proxy_tensor import make_fx

    leaves, spec = pytree.tree_flatten((node.args, node.kwargs))
    inputs = [
        i for i, a in enumerate(leaves) if isinstance(a, torch.fx.Node) and a.op != "get_attr"
    ]
    fakes = [leaves[i].meta.get("val") for i in inputs]
    if not all(isinstance(v, torch.Tensor) for v in fakes):
        return False  # a symbolic size among the arguments: the node stays as it is
    # the subgraphs (score_mod, mask_mod, their joint graphs) as modules; the rest as is
    fixed = [
        getattr(gm, a.target) if isinstance(a, torch.fx.Node) and a.op == "get_attr" else a
        for a in leaves
    ]

    def run(*tensors):
        values = list(fixed)
        for i, t in zip(inputs, tensors):
            values[i] = t
        args, kwargs = pytree.tree_unflatten(values, spec)
        return fn(*args, **kwargs)

    functional = torch.func.functionalize(run, remove="mutations_and_views")
    try:
        with detect_fake_mode(fakes) or contextlib.nullcontext():
            traced = make_fx(functional, decomposition_table=decompositions)(*fakes)
    except Exception as exc:  # noqa: BLE001  (the node then runs eagerly, still right)
        metrics.tally("graph_ops_not_inlined", f"{node.target}: {type(exc).__name__}")
        return False
    _constants_as_values(traced.graph)
    env = {}
    holders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    env.update(zip(holders, (leaves[i] for i in inputs)))
    with gm.graph.inserting_before(node):
        for attr in [n for n in traced.graph.nodes if n.op == "get_attr"]:
            name = _free_name(gm, f"_{node.name}_{attr.target}")
            gm.register_buffer(name, getattr(traced, attr.target), persistent=False)
            env[attr] = gm.graph.get_attr(name)
            env[attr].meta = dict(attr.meta)
        result = gm.graph.graph_copy(traced.graph, env)
    _replace(node, result)
    return True


def _constants_as_values(graph: torch.fx.Graph) -> None:
    """``torch.tensor(0.)`` in the implementation traces to a constant and copies of it
    (``lift_fresh_copy``, then ``detach_copy``), on the host since it is given no device;
    in a functional program the constant is the value itself, so the copies go (else a
    host op would split the graph)."""
    aten = torch.ops.aten
    copies = (
        aten.lift_fresh_copy.default,
        aten.lift_fresh.default,
        aten.detach_copy.default,
        aten.detach.default,
        aten.alias_copy.default,
        aten.clone.default,
    )
    for n in list(graph.nodes):  # in order: a chain of copies folds from its start
        if n.op == "call_function" and n.target in copies and n.args[0].op == "get_attr":
            n.replace_all_uses_with(n.args[0])
            graph.erase_node(n)


def _free_name(gm, base: str) -> str:
    name, n = base, 0
    while hasattr(gm, name):
        n += 1
        name = f"{base}_{n}"
    return name


def _replace(node: torch.fx.Node, value) -> None:
    """Point the users of ``node`` at ``value`` (a node, or a nested tuple of nodes that
    the users take apart with ``getitem``)."""
    if isinstance(value, torch.fx.Node) or value is None:
        if value is None:
            assert not node.users, f"{node} has users but no value"
        else:
            node.replace_all_uses_with(value)
        node.graph.erase_node(node)
        return
    for user in list(node.users):
        assert user.target is operator.getitem, f"{node} is used by {user.format_node()}"
        _replace(user, value[user.args[1]])
    node.graph.erase_node(node)
