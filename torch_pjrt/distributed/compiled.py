"""Functional collectives inside ``torch.compile`` graphs: collectives of the XLA program.

A compiled graph whose ``_c10d_functional`` nodes all name one pjrt process group (what
DTensor's tensor parallel produces) runs as one SPMD program over that group: the
graph's program is wrapped in a ``jax.shard_map`` over the group's mesh (one device per
rank, axis ``collectives.AXIS``), every rank contributes its local arrays as its block
of global arrays, and the collective nodes lower to ``lax`` collectives in the same
XLA program as the math around them (:class:`torch_pjrt.compile.program.GraphProgram`
does the wrapping). Graphs whose collectives name several groups are split instead:
their collectives run as programs of their own between the compiled parts.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from torch_pjrt.distributed import collectives
from torch_pjrt.ops.registry import lowers_in_graphs
from torch_pjrt.runtime import asserts

__all__ = ["collective_group", "is_collective", "spmd_replay", "to_global", "to_local"]


def _ops() -> dict:
    if not torch.distributed.is_available():
        return {}
    c10d = torch.ops._c10d_functional
    return {
        "all_reduce": c10d.all_reduce.default,
        "all_reduce_coalesced": c10d.all_reduce_coalesced.default,
        "all_gather_into_tensor": c10d.all_gather_into_tensor.default,
        "all_gather_into_tensor_coalesced": c10d.all_gather_into_tensor_coalesced.default,
        "reduce_scatter_tensor": c10d.reduce_scatter_tensor.default,
        "reduce_scatter_tensor_coalesced": c10d.reduce_scatter_tensor_coalesced.default,
        "all_to_all_single": c10d.all_to_all_single.default,
        "broadcast": c10d.broadcast.default,
        "wait_tensor": c10d.wait_tensor.default,
    }


_OPS = _ops()
_COLLECTIVES = frozenset(_OPS.values())


def is_collective(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target in _COLLECTIVES


def _group_name(node: torch.fx.Node) -> str | None:
    """The group a collective node names (``wait_tensor`` names none)."""
    if node.target is _OPS.get("wait_tensor"):
        return None
    name = node.kwargs.get("group_name", node.args[-1])
    return name if isinstance(name, str) else None


def collective_group(nodes) -> tuple[bool, str | None]:
    """(whether the graph can run as one SPMD program, the group's name or None when it
    has no collectives). False when its collectives name several groups, or a group
    that is not a pjrt one."""
    names = {_group_name(n) for n in nodes if is_collective(n)} - {None}
    if not names:
        return True, None
    if len(names) > 1:
        return False, None
    from torch_pjrt.distributed.backend import PjrtProcessGroup

    (name,) = names
    group = torch._C._distributed_c10d._resolve_process_group(name)
    return isinstance(group, PjrtProcessGroup), name


def devices(group_name: str, index: int) -> tuple:
    """The group's JAX devices (one per rank, in group rank order) at local ``index``."""
    return torch._C._distributed_c10d._resolve_process_group(group_name)._devices(index)


def to_global(arrays: list, mesh_devices: tuple) -> list:
    """This rank's arrays as its blocks of global arrays, stacked on a new leading axis."""
    n = len(mesh_devices)
    sharding = collectives.sharding(mesh_devices)
    out = []
    for a in arrays:
        shape = tuple(a.shape)
        block = a.reshape((1, *shape))
        out.append(jax.make_array_from_single_device_arrays((n, *shape), sharding, [block]))
    return out


def to_local(a: jax.Array) -> jax.Array:
    """This rank's block of a global array, without the leading axis."""
    local = a.addressable_data(0)
    return local.reshape(local.shape[1:])


def spmd(run, mesh_devices: tuple):
    """``run(donated, arrays, rng)`` (one rank's graph) as a shard_map over the group's
    mesh: array arguments and results carry the rank axis first, ``rng`` is replicated.

    The checks of values the graph states (``runtime/asserts.py``) are made on every
    rank and agreed on inside the program: a check fails on every rank when it fails on
    one, with the first failing rank's values, so that no rank goes on alone."""
    mesh = collectives.sharding(mesh_devices).mesh
    spec, replicated = jax.sharding.PartitionSpec(collectives.AXIS), jax.sharding.PartitionSpec()
    specs = []  # what the body's checks mean (static: set as it traces)

    def body(donated, arrays, rng):
        with asserts.inner() as scope:
            outs, new = run([d[0] for d in donated], [a[0] for a in arrays], rng)
        checked = scope.returning(None)
        specs[:] = () if checked is None else checked.specs
        flags = None if checked is None else _agreed(checked.flags)
        return jax.tree.map(lambda x: x[None], (outs, new)), flags

    mapped = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(spec, spec, replicated),
        out_specs=(spec, replicated),
        check_vma=False,
    )

    def program(donated, arrays, rng):
        results, flags = mapped(donated, arrays, rng)
        if flags is not None:
            asserts.restate(flags, specs)
        return results

    return program


def _agreed(flags):
    """One rank's packed checks (``(checks, width)``: 1 where held, then values) as the
    group's: held where every rank's held, else the first failing rank's row."""
    every = jax.lax.all_gather(flags, collectives.AXIS)  # (ranks, checks, width)
    held = every[:, :, 0]
    first = jnp.argmin(held, axis=0)  # the first rank where each failed (0 if none)
    rows = every[first, jnp.arange(flags.shape[0])]
    return rows.at[:, 0].set(jnp.min(held, axis=0))


def spmd_replay(run, mesh_devices: tuple):
    """A captured graph's ``run(donated, kept)`` (one rank's part, ``modes/capture.py``)
    as a shard_map over the group's mesh: every argument and result a global array
    whose block i is rank i's."""
    mesh = collectives.sharding(mesh_devices).mesh
    spec = jax.sharding.PartitionSpec(collectives.AXIS)

    def body(donated, kept):
        outs = run([d[0] for d in donated], [k[0] for k in kept])
        return [o[None] for o in outs]

    return jax.shard_map(body, mesh=mesh, in_specs=(spec, spec), out_specs=spec, check_vma=False)


# --- the lowerings (valid only inside spmd's trace: they name the mesh axis) ---------


def _size(group_name: str) -> int:
    return torch._C._distributed_c10d._resolve_process_group(group_name).size()


def _body(op: str, group_name: str, extra=None):
    return collectives.body(op, _size(group_name), extra)


if _OPS:

    @lowers_in_graphs(_OPS["wait_tensor"])
    def _wait_tensor(tensor):
        return tensor

    @lowers_in_graphs(_OPS["all_reduce"])
    def _all_reduce(input, reduce_op, group_name):  # noqa: A002
        return _body("all_reduce", group_name, reduce_op.lower())(input)

    @lowers_in_graphs(_OPS["all_reduce_coalesced"])
    def _all_reduce_coalesced(inputs, reduce_op, group_name):
        return [_all_reduce(x, reduce_op, group_name) for x in inputs]

    @lowers_in_graphs(_OPS["all_gather_into_tensor"])
    def _all_gather_into_tensor(input, group_size, group_name):  # noqa: A002
        shape = (group_size * input.shape[0], *input.shape[1:])
        return _body("all_gather", group_name, shape)(input[None])[0]

    @lowers_in_graphs(_OPS["all_gather_into_tensor_coalesced"])
    def _all_gather_into_tensor_coalesced(inputs, group_size, group_name):
        return [_all_gather_into_tensor(x, group_size, group_name) for x in inputs]

    @lowers_in_graphs(_OPS["reduce_scatter_tensor"])
    def _reduce_scatter_tensor(input, reduce_op, group_size, group_name):  # noqa: A002
        shape = (input.shape[0] // group_size, *input.shape[1:])
        extra = (reduce_op.lower(), shape)
        return _body("reduce_scatter", group_name, extra)(input[None])[0]

    @lowers_in_graphs(_OPS["reduce_scatter_tensor_coalesced"])
    def _reduce_scatter_tensor_coalesced(inputs, reduce_op, group_size, group_name):
        return [_reduce_scatter_tensor(x, reduce_op, group_size, group_name) for x in inputs]

    @lowers_in_graphs(_OPS["all_to_all_single"])
    def _all_to_all_single(input, output_split_sizes, input_split_sizes, group_name):  # noqa: A002
        n = _size(group_name)
        for sizes in (output_split_sizes, input_split_sizes):
            if sizes is not None and len(set(sizes)) > 1:
                raise NotImplementedError(
                    "pjrt: all_to_all_single with uneven split sizes in a compiled graph"
                )
        if input.shape[0] % n:
            raise NotImplementedError("pjrt: all_to_all_single needs dim 0 divisible by ranks")
        return _body("all_to_all", group_name)(input[None])[0]

    @lowers_in_graphs(_OPS["broadcast"])
    def _broadcast(input, src, group_name):  # noqa: A002
        return _body("broadcast", group_name, src)(input[None])[0]
