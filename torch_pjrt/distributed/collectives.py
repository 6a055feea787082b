"""Collectives on JAX arrays across processes: one jitted ``shard_map`` program each.

Every rank of a group contributes its local array (on its own JAX device). The arrays
become one global array over a 1-D mesh (axis ``"r"``, one device per rank, in group
rank order), stacked on a new leading axis: rank i's block is ``global[i]``. A jitted
``shard_map`` runs the ``lax`` collective, and each rank takes back its own block of
the result (again with a leading axis of 1). Programs are cached per (operation, mesh
devices, shape, dtype, options).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = ["AXIS", "body", "per_rank", "run", "sharding"]

AXIS = _AXIS = "r"  # the mesh axis of a group's ranks


def _premultiplied(kind, x):
    """``ReduceOp.PREMUL_SUM(factor)`` (kind ``("premul_sum", factor)``) is a sum of the
    inputs times the factor: (x * factor, "sum"); any other kind is left as it is."""
    if isinstance(kind, tuple) and kind[0] == "premul_sum":
        return (x * kind[1]).astype(x.dtype), "sum"
    return x, kind


def _reduce(kind, x, n: int):
    """Reduce ``x`` across the mesh axis (the result is the same on every rank)."""
    x, kind = _premultiplied(kind, x)
    if kind == "sum":
        return lax.psum(x, _AXIS)
    if kind == "avg":
        return (lax.psum(x, _AXIS) / n).astype(x.dtype)
    if kind == "max":
        return lax.pmax(x, _AXIS)
    if kind == "min":
        return lax.pmin(x, _AXIS)
    gathered = lax.all_gather(x, _AXIS, axis=0, tiled=False)  # (n, *x.shape)
    if kind == "product":
        return jnp.prod(gathered, axis=0, dtype=x.dtype)
    if kind == "band":
        return functools.reduce(jnp.bitwise_and, [gathered[i] for i in range(n)])
    if kind == "bor":
        return functools.reduce(jnp.bitwise_or, [gathered[i] for i in range(n)])
    if kind == "bxor":
        return functools.reduce(jnp.bitwise_xor, [gathered[i] for i in range(n)])
    raise AssertionError(kind)


def body(op: str, n: int, extra):
    """The per-rank function: a block ``(1, *in_shape)`` in, ``(1, *out_shape)`` out."""
    if op == "all_reduce":
        return lambda x: _reduce(extra, x, n)
    if op == "broadcast":  # extra: the root's group rank
        return lambda x: lax.all_gather(x, _AXIS, axis=0, tiled=True)[extra][None]
    if op == "all_gather":  # extra: the output's local shape
        return lambda x: lax.all_gather(x[0], _AXIS, axis=0, tiled=False).reshape(extra)[None]

    if op == "reduce_scatter":  # extra: (reduction, output's local shape)
        kind, out_shape = extra

        def reduce_scatter(x):
            chunks, how = _premultiplied(kind, x.reshape((n, *out_shape)))
            if how in ("sum", "avg"):
                out = lax.psum_scatter(chunks, _AXIS, scatter_dimension=0, tiled=False)
                if how == "avg":
                    out = (out / n).astype(x.dtype)
            else:
                out = _reduce(how, chunks, n)[lax.axis_index(_AXIS)]
            return out[None]

        return reduce_scatter

    if op == "all_to_all":  # extra: the input's local shape, equal splits of dim 0

        def all_to_all(x):
            chunks = x.reshape((n, -1))
            out = lax.all_to_all(chunks, _AXIS, split_axis=0, concat_axis=0, tiled=False)
            return out.reshape(x.shape)

        return all_to_all
    raise AssertionError(op)


@functools.lru_cache(maxsize=256)
def per_rank(op: str, n: int, extra):
    """:func:`body` on one rank's array (no leading block axis), for a graph capture's
    recording: valid only inside a shard_map over the group's mesh."""
    block = body(op, n, extra)

    def collective(x):
        return block(x[None])[0]

    collective.__name__ = op
    return collective


@functools.lru_cache(maxsize=1024)
def _program(op: str, devices: tuple, shape: tuple, dtype, extra):
    blocks = sharding(devices)
    fn = jax.shard_map(
        body(op, len(devices), extra), mesh=blocks.mesh, in_specs=P(_AXIS), out_specs=P(_AXIS)
    )
    return jax.jit(fn, in_shardings=blocks, out_shardings=blocks), blocks


@functools.lru_cache(maxsize=64)
def sharding(devices: tuple) -> NamedSharding:
    """Blocks of the rank axis over a 1-D mesh of ``devices`` (one per rank)."""
    return NamedSharding(Mesh(np.array(devices, dtype=object), (_AXIS,)), P(_AXIS))


def run(op: str, x: jax.Array, devices: tuple, extra=None) -> jax.Array:
    """Run collective ``op`` with this rank's ``x`` (on its device, one of ``devices``);
    returns this rank's block of the result, on the same device, without the leading axis.
    """
    n = len(devices)
    shape = tuple(x.shape)
    with jax.enable_x64(True):
        program, sharding = _program(op, devices, shape, x.dtype, extra)
        block = x.reshape((1, *shape))
        global_in = jax.make_array_from_single_device_arrays((n, *shape), sharding, [block])
        out = program(global_in)
        local = out.addressable_data(0)
        return local.reshape(local.shape[1:])
