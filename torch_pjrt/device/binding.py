"""Torch values as a program's arguments: the one binding of every executor client.

The executor (``runtime/executor.py``) runs programs on JAX arrays and Python values;
it sits below this layer and knows no torch tensor. Its clients (an op's eager kernel,
``ops/registry.py``; a compiled graph, ``compile/program.py``; a custom kernel,
``kernels/``) turn their torch arguments into those arrays here, the same way:

- a pjrt tensor becomes its storage's array, or the array of its view
  (``tensor.argument``: the storage keeps owning it, so it may still be donated);
- a tensor on another pjrt device is PyTorch's "same device" error; a CPU scalar
  tensor meets device tensors as with CUDA (sent to the device);
- a Python number in a tensor position stays a number (JAX traces it weakly typed);
  a ``Scalar`` argument becomes the weakly typed JAX scalar jit would make of it, made
  once per value (:func:`device_scalar`), so no call converts it again;
- static arguments become hashable program-key parts (:func:`static`: lists as
  tuples, symbolic ints as their values).

A fused recording takes what this gives with ``lazy=True``: pending values stay
pending, to be recorded rather than run.
"""

from __future__ import annotations

import jax
import torch

from torch_pjrt import runtime
from torch_pjrt.device import random as pjrt_random
from torch_pjrt.device.tensor import argument, read_on_device
from torch_pjrt.runtime import executor

__all__ = [
    "require_pjrt",
    "array_of",
    "arrays_of",
    "device_of",
    "device_scalar",
    "plain_arrays",
    "same_device_error",
    "static",
]


def require_pjrt(t, fn: str, hint: str) -> None:
    """Raise PyTorch-style errors unless ``t`` is a tensor on a pjrt device: ``fn`` names
    the function that needs it, ``hint`` says how to get one."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: expected a torch.Tensor, but got {type(t).__name__}")
    if t.device.type != "pjrt":
        raise RuntimeError(
            f"{fn}: expected a tensor on a pjrt device, but got one on {t.device}; {hint}"
        )


def same_device_error(a, b) -> RuntimeError:
    """PyTorch's error for tensors of one call on two devices."""
    return RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"{a} and {b}!"
    )


def arrays_of(vals: list, positions: list, index: int, lazy: bool = False) -> tuple:
    """``(arrays, any tensor?)``: the arguments of an op's tensor positions (a tensor
    list as a list) on pjrt ``index``, by :func:`array_of`."""
    arrays = []
    has_tensors = False
    for i in positions:
        v = vals[i]
        if isinstance(v, (list, tuple)):
            arrays.append([array_of(t, index, lazy) for t in v])
            has_tensors = True
        else:
            arrays.append(array_of(v, index, lazy))
            has_tensors = has_tensors or isinstance(v, torch.Tensor)
    return arrays, has_tensors


def plain_arrays(vals: list, positions: list, lazy: bool = False) -> tuple | None:
    """:func:`arrays_of` for the common call, with as little host work as possible (one
    look at each storage, ``tensor.read_on_device``; no ``device`` objects):
    ``(arrays, device index)`` when every tensor is a strided pjrt tensor on one device,
    no argument is a list and no mesh is in use, else None (the general binding then
    runs, and raises PyTorch's errors). ``lazy``: as :func:`array_of`'s."""
    index = None
    arrays = []
    for i in positions:
        v = vals[i]
        if isinstance(v, torch.Tensor):
            found = read_on_device(v, lazy) if v.layout is torch.strided else None
            if found is None or (index is not None and found[1] != index):
                return None  # CPU scalars, device errors: the general path
            array, index = found
            arrays.append(array)
        elif v.__class__ is list or v.__class__ is tuple:
            return None  # (a tensor list: the general path)
        else:  # None, or a wrapped Python number
            arrays.append(v if lazy else device_scalar(v))
    if index is None or executor.mesh_in_use:
        return None
    return arrays, index


def array_of(t, index: int, lazy: bool = False):
    """The argument of a tensor position of an op running on pjrt ``index``: the tensor's
    array; a Python number as the weakly typed scalar jit makes of it (a number as it
    is in a recording, which takes numbers by value); None as it is."""
    if t is None or isinstance(t, (bool, int, float, complex)):
        return t if lazy else device_scalar(t)
    device = t.device
    if device.type == "pjrt":
        if (device.index or 0) != index:
            raise same_device_error(f"pjrt:{index}", device)
        return argument(t, lazy)
    if t.dim() == 0:  # a CPU scalar tensor may meet device tensors, as with CUDA
        return runtime.from_host(t, runtime.device(index))
    raise same_device_error(f"pjrt:{index}", device)


def device_of(args) -> int:
    """The device a call runs on: its first pjrt tensor's, else the current device."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type == "pjrt":
            return a.device.index or 0
    return pjrt_random.current_device()


_SCALAR_ARRAYS: dict = {}


def device_scalar(v):
    """A Python number as the weakly typed JAX scalar that jit makes of it, made once:
    a jitted call converts Python numbers on every call (about 1.5 us each), arrays it
    takes as they are. Numbers that compare equal but differ (-0.0 and 0.0, NaN) are
    passed through unconverted."""
    cls = v.__class__
    if cls is not int and cls is not float and cls is not bool and cls is not complex:
        return v
    key = (cls, v)
    found = _SCALAR_ARRAYS.get(key)
    if found is None:
        if v != v or (not v and (cls is float or cls is complex)):
            return v
        if len(_SCALAR_ARRAYS) >= 4096:
            _SCALAR_ARRAYS.clear()
        try:
            with jax.enable_x64(True):
                found = _SCALAR_ARRAYS[key] = jax.numpy.asarray(v)
        except OverflowError:  # (the jitted call raises its own error)
            return v
    return found


def static(v):
    """A static argument as a part of a program's key: lists as tuples, symbolic ints
    (a compiled graph's sizes, concrete at the call) as ints."""
    cls = v.__class__
    if cls is list or cls is tuple:
        return tuple([static(x) for x in v])
    if cls is torch.SymInt:
        return int(v)
    return v
