"""JAX and DLPack: a pjrt tensor's data handed to JAX, and a JAX array as a pjrt tensor,
without a device copy.

A pjrt tensor's storage holds a JAX array (``device/tensor.py``), so the handover is
free: :func:`to_jax` gives the array of the tensor's value, :func:`from_jax` makes a
tensor whose storage holds the array. JAX arrays never change, which sets the aliasing
rule: each side keeps the value it was handed, and a later write on one side is not
seen by the other (an in-place op on the tensor gives its storage a new array; JAX
code makes new arrays). Nothing is lost: the write is in the tensor it was made to. A
handed-over array is never donated by torch_pjrt (its storage gives up ownership of
it), so JAX's reference stays valid; an array that JAX code deletes or donates after
:func:`from_jax` raises JAX's own "deleted" error when its tensor is read.

DLPack, for pjrt tensors:

- ``tensor.__dlpack__()`` / ``__dlpack_device__()`` are those of the tensor's JAX array:
  ``jax.numpy.from_dlpack(t)`` takes the tensor without a copy (as does NumPy's on the
  CPU platform, CuPy's on CUDA: whatever the platform's buffers are to DLPack);
- ``torch.utils.dlpack.to_dlpack(t)`` then ``from_dlpack(capsule)``, and
  ``torch.from_dlpack(t)``, give a pjrt tensor sharing ``t``'s storage, as for CUDA
  tensors: a write through either is seen by both.
"""

from __future__ import annotations

import jax
import torch

from torch_pjrt import runtime
from torch_pjrt.device import binding
from torch_pjrt.device import tensor as tensors
from torch_pjrt.runtime import executor
from torch_pjrt.runtime.transfer import JAX_TO_TORCH

__all__ = ["from_jax", "install", "to_jax"]


def to_jax(tensor: torch.Tensor) -> jax.Array:
    """The JAX array of a pjrt tensor's value, without a device copy when the tensor is
    its whole storage (a view's elements are gathered into a new array).

    The array is the tensor's value now: later in-place writes to the tensor give its
    storage a new array and leave this one as it is (JAX arrays never change).

    Example:
        >>> t = torch.arange(4.0, device="pjrt")
        >>> jnp.sin(torch_pjrt.to_jax(t))
    """
    binding.require_pjrt(tensor, "to_jax()", "move it with tensor.to('pjrt') first (a copy)")
    if tensor.requires_grad:
        raise RuntimeError(
            "to_jax(): can't hand a tensor that requires grad to JAX (its autograd graph "
            "would not follow); use tensor.detach() first, or make the JAX function an "
            "autograd-aware op with torch_pjrt.kernel (docs/kernels.md)"
        )
    return tensors.read(tensor)


def _index_of(array: jax.Array) -> int:
    """The pjrt index of the array's device (the first of a mesh-sharded array's)."""
    devices = runtime.devices()
    found = [d for d in array.devices() if d not in devices]
    if found:
        raise RuntimeError(
            f"from_jax(): the array is on {found[0]}, which is not a pjrt device (pjrt runs "
            f"on the '{runtime.current_platform()}' platform: {devices}); "
            "jax.device_put it on one of those first"
        )
    if len(array.devices()) > 1:
        executor.use_meshes()  # (a mesh-sharded array: the executor aligns with it)
    return min(devices.index(d) for d in array.devices())


def from_jax(array: jax.Array) -> torch.Tensor:
    """A pjrt tensor holding a JAX array, without a device copy: on the array's device
    (``pjrt:i`` for JAX's i-th device of the platform; a mesh-sharded array keeps its
    layout, as ``torch_pjrt.distributed.distribute_tensor``'s do), of the same shape
    and dtype.

    The array is not changed by later writes to the tensor (they give its storage a new
    array), and torch_pjrt never donates it, so JAX code may keep using it.

    Example:
        >>> t = torch_pjrt.from_jax(jnp.ones((2, 3)))   # pjrt:0, float32
    """
    if isinstance(array, jax.core.Tracer):
        raise TypeError(
            "from_jax(): got a JAX tracer: from_jax takes a concrete array, outside "
            "jax.jit/grad/vmap (to call PyTorch code inside JAX transformations, write it in "
            "JAX, or make the JAX code a torch_pjrt.kernel)"
        )
    if not isinstance(array, jax.Array):
        raise TypeError(f"from_jax(): expected a jax.Array, but got {type(array).__name__}")
    if array.is_deleted():
        raise RuntimeError(
            "from_jax(): the array has been deleted (donated to a jitted function, or "
            ".delete()d): there is no data to hand over"
        )
    if array.dtype not in JAX_TO_TORCH:
        raise TypeError(
            f"from_jax(): JAX dtype {array.dtype} has no PyTorch dtype; convert it first "
            "(array.astype(...))"
        )
    return tensors.wrap(array, _index_of(array), owned=False)


# --- DLPack -----------------------------------------------------------------------------

_torch_dlpack = torch.Tensor.__dlpack__
_torch_dlpack_device = torch.Tensor.__dlpack_device__
_torch_to_dlpack = torch.utils.dlpack.to_dlpack
_torch_from_dlpack = torch.utils.dlpack.from_dlpack


def _dlpack(self, *args, **kwargs):
    if self.device.type == "pjrt":
        if self.requires_grad:  # (PyTorch's own rule and words)
            raise BufferError("Can't export tensors that require gradient, use tensor.detach()")
        return tensors.read(self).__dlpack__(*args, **kwargs)
    return _torch_dlpack(self, *args, **kwargs)


def _dlpack_device(self):
    if self.device.type == "pjrt":
        return tensors.read(self).__dlpack_device__()
    return _torch_dlpack_device(self)


def to_dlpack(tensor: torch.Tensor):
    """``torch.utils.dlpack.to_dlpack``: for a pjrt tensor, a capsule that
    ``torch.utils.dlpack.from_dlpack`` turns into a pjrt tensor sharing its storage."""
    if isinstance(tensor, torch.Tensor) and tensor.device.type == "pjrt":
        if tensor.storage_offset() != 0:
            raise RuntimeError(
                "to_dlpack(): a pjrt view that starts inside its storage (storage offset "
                f"{tensor.storage_offset()}) cannot be shared through DLPack; share the "
                "whole tensor, or .clone() the view first"
            )
        tensors.export(tensor)
    return _torch_to_dlpack(tensor)


def from_dlpack(ext_tensor, *, device=None, copy=None):
    """``torch.from_dlpack``: a pjrt tensor given as the producer stays on pjrt, sharing
    its storage (PyTorch's own path would see its JAX array's device instead)."""
    if (
        isinstance(ext_tensor, torch.Tensor)
        and ext_tensor.device.type == "pjrt"
        and device is None
        and not copy
    ):
        return _torch_from_dlpack(to_dlpack(ext_tensor.detach()))
    return _torch_from_dlpack(ext_tensor, device=device, copy=copy)


def install() -> None:
    """Route DLPack's entry points for pjrt tensors here (other tensors: PyTorch's)."""
    torch.Tensor.__dlpack__ = _dlpack
    torch.Tensor.__dlpack_device__ = _dlpack_device
    torch.utils.dlpack.to_dlpack = torch.to_dlpack = to_dlpack
    torch.utils.dlpack.from_dlpack = torch.from_dlpack = from_dlpack
