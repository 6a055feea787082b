"""SPMD in one process: a mesh over this process's devices, and sharded tensors.

A sharded tensor is an ordinary ``pjrt`` tensor whose storage cell holds a JAX array
laid out over a mesh with a ``NamedSharding``. PyTorch still sees one tensor on one
device (``pjrt:0``); JAX's jitted programs (eager kernels and ``torch.compile``
graphs) follow their inputs' shardings, so XLA's GSPMD partitioner splits the work
and inserts the collectives. Placements are PyTorch's own DTensor classes:
``Shard(dim)`` and ``Replicate()``, one per mesh dimension. See docs/spmd.md.

Example:
    >>> from torch.distributed.tensor import Replicate, Shard
    >>> mesh = device_mesh((2, 4), ("data", "model"))
    >>> x = distribute_tensor(torch.randn(8, 16), mesh, [Shard(0), Replicate()])
    >>> sharding_of(x).placements
    (Shard(dim=0), Replicate())
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import jax
import numpy as np
import torch
from jax.sharding import NamedSharding, PartitionSpec

from torch_pjrt import runtime
from torch_pjrt.device import binding
from torch_pjrt.device import tensor as _tensor
from torch_pjrt.runtime import executor

if TYPE_CHECKING:
    from torch.distributed.tensor.placement_types import Placement

__all__ = [
    "Mesh",
    "Sharding",
    "device_mesh",
    "distribute_module",
    "distribute_tensor",
    "mark_sharding",
    "sharding_of",
]


def _placement_types():
    # NOTE: imported on first use: torch.distributed.tensor takes a while to import
    from torch.distributed.tensor.placement_types import Replicate, Shard

    return Replicate, Shard


class Mesh:
    """A logical n-d arrangement of this process's pjrt devices (a JAX ``Mesh``).

    Made by :func:`device_mesh`. Like PyTorch's ``DeviceMesh``: ``shape``, ``ndim``,
    ``mesh_dim_names``, ``size(dim)``; ``jax_mesh`` is the JAX mesh behind it.
    """

    def __init__(self, jax_mesh: jax.sharding.Mesh):
        self.jax_mesh = jax_mesh

    @property
    def shape(self) -> tuple:
        return tuple(self.jax_mesh.devices.shape)

    @property
    def ndim(self) -> int:
        return self.jax_mesh.devices.ndim

    @property
    def mesh_dim_names(self) -> tuple:
        return tuple(self.jax_mesh.axis_names)

    def size(self, mesh_dim: int | str | None = None) -> int:
        if mesh_dim is None:
            return self.jax_mesh.devices.size
        if isinstance(mesh_dim, str):
            mesh_dim = self.mesh_dim_names.index(mesh_dim)
        return self.shape[mesh_dim]

    def __eq__(self, other) -> bool:
        return isinstance(other, Mesh) and other.jax_mesh == self.jax_mesh

    def __hash__(self) -> int:
        return hash(self.jax_mesh)

    def __repr__(self) -> str:
        dims = ", ".join(f"{n}={s}" for n, s in zip(self.mesh_dim_names, self.shape))
        return f"Mesh({dims}, platform={runtime.current_platform()!r})"


def device_mesh(mesh_shape: Sequence[int] | int, mesh_dim_names: Sequence[str] | None = None):
    """A mesh over this process's pjrt devices (``pjrt:0`` .. ``pjrt:N-1``), row-major.

    Args:
        mesh_shape: the size of each mesh dimension; their product must be the number of
            devices (``torch.pjrt.device_count()``).
        mesh_dim_names: a name per dimension (default ``dim_0``, ``dim_1``, ...).

    Returns:
        A :class:`Mesh`.

    Example:
        >>> mesh = device_mesh((2, 4), ("data", "model"))  # 8 devices
    """
    shape = (mesh_shape,) if isinstance(mesh_shape, int) else tuple(mesh_shape)
    devices = runtime.devices()
    if not shape or any(not isinstance(s, int) or s < 1 for s in shape):
        raise ValueError(f"device_mesh: mesh_shape must be positive ints, got {mesh_shape!r}")
    if math.prod(shape) != len(devices):
        raise RuntimeError(
            f"device_mesh: a mesh of shape {shape} needs {math.prod(shape)} devices, but the "
            f"'{runtime.current_platform()}' platform has {len(devices)} (pjrt:0 to "
            f"pjrt:{len(devices) - 1}). On the CPU platform, TORCH_PJRT_CPU_DEVICES=N (or "
            "XLA_FLAGS=--xla_force_host_platform_device_count=N) gives N devices."
        )
    names = (
        tuple(f"dim_{i}" for i in range(len(shape)))
        if mesh_dim_names is None
        else tuple(mesh_dim_names)
    )
    if len(names) != len(shape) or len(set(names)) != len(names):
        raise RuntimeError(
            f"device_mesh: expected {len(shape)} distinct mesh_dim_names, got {names!r}"
        )
    # from now on the executor aligns one-device arrays with mesh-sharded ones
    # (executor.align); nothing pays for SPMD before the first mesh
    executor.use_meshes()
    return Mesh(jax.sharding.Mesh(np.array(devices, dtype=object).reshape(shape), names))


class Sharding(NamedTuple):
    """How a tensor is laid out: its mesh and one placement per mesh dimension."""

    mesh: Mesh
    placements: tuple


def _spec(t: torch.Tensor, mesh: Mesh, placements: Sequence[Placement]) -> PartitionSpec:
    """DTensor placements -> a PartitionSpec (tensor dim -> the mesh axes sharding it)."""
    Replicate, Shard = _placement_types()
    if not isinstance(mesh, Mesh):
        raise TypeError(f"expected a torch_pjrt Mesh (device_mesh(...)), got {type(mesh)}")
    placements = tuple(placements)
    if len(placements) != mesh.ndim:
        raise ValueError(
            f"`placements` must have the same length as `device_mesh.ndim`! Found "
            f"placements length: {len(placements)}, and device_mesh.ndim: {mesh.ndim}."
        )
    axes: list[list[str]] = [[] for _ in range(t.dim())]
    for mesh_dim, p in enumerate(placements):
        if isinstance(p, Replicate):
            continue
        if not isinstance(p, Shard):
            raise NotImplementedError(
                f"placement {p} is not supported on pjrt SPMD (only Shard(dim) and Replicate())"
            )
        dim = p.dim + t.dim() if p.dim < 0 else p.dim
        if not 0 <= dim < t.dim():
            raise IndexError(
                f"Dimension out of range (expected to be in range of [{-t.dim()}, "
                f"{t.dim() - 1}], but got {p.dim}): {p} on a {t.dim()}-d tensor"
            )
        axes[dim].append(mesh.mesh_dim_names[mesh_dim])
    for dim, names in enumerate(axes):
        parts = math.prod(mesh.size(n) for n in names)
        if t.shape[dim] % parts:
            raise ValueError(
                f"pjrt SPMD needs even shards: dimension {dim} of size {t.shape[dim]} is not "
                f"divisible by {parts} (mesh dimensions {names}). Pad the tensor or choose "
                "another placement."
            )
    return PartitionSpec(*[n[0] if len(n) == 1 else (tuple(n) or None) for n in axes])


def _check_pjrt(t, fn: str) -> None:
    binding.require_pjrt(t, fn, "move it with .to('pjrt') or use distribute_tensor")


def mark_sharding(
    tensor: torch.Tensor, device_mesh: Mesh, placements: Sequence[Placement]
) -> torch.Tensor:
    """Lay a pjrt tensor out over a mesh, in place, and return it.

    The tensor keeps its identity (a Parameter stays the same Parameter, so an optimizer
    made before still updates it); its storage's array is moved to the mesh with one
    placement per mesh dimension. It must be its whole storage (not a view).

    Args:
        tensor: a pjrt tensor.
        device_mesh: from :func:`device_mesh`.
        placements: ``Shard(dim)`` or ``Replicate()`` per mesh dimension.

    Example:
        >>> mark_sharding(linear.weight, mesh, [Replicate(), Shard(0)])
    """
    _check_pjrt(tensor, "mark_sharding")
    spec = _spec(tensor, device_mesh, placements)
    cell = _tensor.cell_of(tensor)
    if (
        tensor.storage_offset() != 0
        or not tensor.is_contiguous()
        or cell.size != tensor.numel()
        or cell.dtype != tensor.dtype
    ):
        raise RuntimeError(
            "mark_sharding: the tensor must be its whole storage (it is a view of a larger "
            "or differently typed storage); use distribute_tensor, or .clone() it first"
        )
    value = _tensor.read(tensor).reshape(tuple(tensor.shape))
    with jax.enable_x64(True):
        cell.array = jax.device_put(value, NamedSharding(device_mesh.jax_mesh, spec))
    return tensor


def distribute_tensor(
    tensor: torch.Tensor, device_mesh: Mesh, placements: Sequence[Placement] | None = None
) -> torch.Tensor:
    """A copy of ``tensor`` on pjrt, laid out over ``device_mesh`` (like DTensor's
    ``distribute_tensor``, but the result is a plain pjrt tensor).

    Args:
        tensor: a CPU or pjrt tensor (the full, global value).
        device_mesh: from :func:`device_mesh`.
        placements: ``Shard(dim)`` or ``Replicate()`` per mesh dimension (default: all
            ``Replicate()``).

    Returns:
        A new pjrt tensor with the same value, ``requires_grad`` and dtype.

    Example:
        >>> x = distribute_tensor(torch.randn(8, 16), mesh, [Shard(0), Replicate()])
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"distribute_tensor: expected a torch.Tensor, but got {type(tensor).__name__}"
        )
    if placements is None:
        placements = [_placement_types()[0]()] * device_mesh.ndim
    _spec(tensor, device_mesh, placements)  # errors before any copy
    with torch.no_grad():
        if tensor.device.type == "pjrt":
            out = tensor.detach().clone(memory_format=torch.contiguous_format)
        else:
            out = tensor.detach().to("pjrt")
            if out.untyped_storage() is tensor.untyped_storage():
                out = out.clone()
    mark_sharding(out, device_mesh, placements)
    return out.requires_grad_(tensor.requires_grad)


def _placements(sharding, ndim: int) -> tuple:
    Replicate, Shard = _placement_types()
    mesh_names = sharding.mesh.axis_names
    found: dict = {}
    for dim, entry in enumerate(tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))):
        for name in (entry,) if isinstance(entry, str) else (entry or ()):
            found[name] = dim
    return tuple(Shard(found[n]) if n in found else Replicate() for n in mesh_names)


def sharding_of(tensor: torch.Tensor) -> Sharding | None:
    """How a pjrt tensor is laid out: a :class:`Sharding` (mesh and placements), or None
    for a tensor on one device. Views report their storage's layout.

    Results of computations on sharded tensors carry the layout XLA's partitioner chose.

    Example:
        >>> sharding_of(x)
        Sharding(mesh=Mesh(data=2, model=4, platform='cpu'), placements=(Shard(dim=0), ...))
    """
    _check_pjrt(tensor, "sharding_of")
    array = _tensor.cell_of(tensor).array
    if array is None:
        return None
    sharding = array.sharding
    if len(sharding.device_set) == 1:
        return None
    if not isinstance(sharding, NamedSharding):  # (another kind of layout, from XLA)
        if sharding.is_fully_replicated:
            return Sharding(None, (_placement_types()[0](),))
        raise NotImplementedError(f"sharding_of: a layout with no mesh: {sharding}")
    return Sharding(Mesh(sharding.mesh), _placements(sharding, array.ndim))


def distribute_module(
    module: torch.nn.Module,
    device_mesh: Mesh,
    partition_fn: Callable[[str, torch.nn.Module, Mesh], None] | None = None,
    input_fn: Callable | None = None,
    output_fn: Callable | None = None,
) -> torch.nn.Module:
    """Lay a module's parameters and buffers out over a mesh (like DTensor's
    ``distribute_module``); the module must already be on pjrt.

    Args:
        module: an ``nn.Module`` on pjrt.
        device_mesh: from :func:`device_mesh`.
        partition_fn: called as ``partition_fn(name, submodule, mesh)`` for every
            submodule; it calls :func:`mark_sharding` on the tensors it wants sharded.
            Tensors it leaves on one device are replicated afterwards.
        input_fn: ``input_fn(module, inputs, mesh)`` returns new inputs (a forward
            pre-hook), e.g. to shard the batch.
        output_fn: ``output_fn(module, outputs, mesh)`` returns new outputs (a forward hook).

    Returns:
        The same module.

    Example:
        >>> def shard_linears(name, sub, mesh):
        ...     if isinstance(sub, torch.nn.Linear):
        ...         mark_sharding(sub.weight, mesh, [Replicate(), Shard(0)])
        >>> distribute_module(model, mesh, shard_linears)
    """
    if partition_fn is not None:
        for name, sub in module.named_modules():
            partition_fn(name, sub, device_mesh)
    replicate = [_placement_types()[0]()] * device_mesh.ndim
    for t in (*module.parameters(), *module.buffers()):
        if t.device.type == "pjrt" and sharding_of(t) is None:
            mark_sharding(t, device_mesh, replicate)
    if input_fn is not None:
        module.register_forward_pre_hook(lambda mod, inputs: input_fn(mod, inputs, device_mesh))
    if output_fn is not None:
        module.register_forward_hook(lambda mod, inputs, out: output_fn(mod, out, device_mesh))
    return module
