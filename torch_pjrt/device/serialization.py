"""Storages: ``torch.load(..., map_location="pjrt")``, ``storage.pjrt()``, ``clone``.

NOTE: PyTorch's own PrivateUse1 path makes ``torch.UntypedStorage(n, device="pjrt")``,
which needs a C++ allocator that a pure-Python backend cannot register. This
restorer, tried before PyTorch's, builds the storage from the host bytes instead.
"""

from __future__ import annotations

import re

import torch

from torch_pjrt import runtime

_LOCATION = re.compile(r"^pjrt(?::(\d+))?$")


def storage_on_device(storage, index: int):
    """A new pjrt storage on ``pjrt:index`` holding the bytes of a CPU storage."""
    from torch_pjrt.device.tensor import cell_of, new_tensor

    device = runtime.device(index)
    host = torch.empty(0, dtype=torch.uint8).set_(storage)
    t = new_tensor((host.numel(),), torch.uint8, index)
    if host.numel():
        cell_of(t).own(runtime.from_host(host, device))  # (a new array)
    return t.untyped_storage()


def _restore(obj, location: str):
    match = _LOCATION.match(location)
    if match is None:
        return None
    from torch_pjrt.device import random as pjrt_random

    index = int(match.group(1)) if match.group(1) else pjrt_random.current_device()
    return storage_on_device(obj.untyped() if hasattr(obj, "untyped") else obj, index)


def _storage_to_pjrt(self, device=None, non_blocking=False):
    """``storage.pjrt()``: PyTorch's generated version allocates through a C++ allocator
    that a Python backend cannot register (it crashes), so storages move via the host."""
    from torch_pjrt.device import random as pjrt_random

    if device is None:
        index = pjrt_random.current_device()
    elif isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        index = device.index if device.index is not None else pjrt_random.current_device()
    untyped = self.untyped() if isinstance(self, torch.TypedStorage) else self
    if untyped.device.type == "pjrt":
        if (untyped.device.index or 0) == index:
            return self
        untyped = untyped.cpu()
    moved = storage_on_device(untyped, index)
    if isinstance(self, torch.TypedStorage):
        return torch.TypedStorage(wrap_storage=moved, dtype=self.dtype, _internal=True)
    return moved


def _is_pjrt(self) -> bool:
    """``storage.is_pjrt``: whether the storage is on a pjrt device."""
    return self.device.type == "pjrt"


def _clone_storage(storage):
    """A new pjrt storage with the same bytes (JAX arrays are immutable: it shares the
    array until either storage is written, so neither owns it: tensor.Cell)."""
    from torch_pjrt.device.tensor import _ATTR, Cell, _handle, cell_of

    src = cell_of(torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage))
    src.give_up()
    nbytes = storage.nbytes()
    t = _handle(src.index, (nbytes,), (1,), torch.uint8, nbytes)
    setattr(t.untyped_storage(), _ATTR, Cell(src.size, src.dtype, src.index, src.array))
    return t.untyped_storage()


_storage_clone = torch.storage._StorageBase.clone


def _clone(self):
    if self.device.type == "pjrt":
        return _clone_storage(self)
    return _storage_clone(self)


def _tag(obj):
    if obj.device.type == "pjrt":
        return f"pjrt:{obj.device.index or 0}"
    return None


# --- torch.multiprocessing ----------------------------------------------------------

_NOT_SHARED = (
    "torch_pjrt: a pjrt tensor cannot be sent to another process through "
    "torch.multiprocessing: PJRT has no inter-process memory handles, so the receiver could "
    "not see the sender's writes as a CUDA tensor's receiver does. Send tensor.cpu() (or "
    "the data to make it) and move it with .to('pjrt') in the receiving process"
)


def _refuse(message: str):
    """Run where a pickled pjrt tensor is unpickled: the receiver's error."""
    raise RuntimeError(message)


def _guarded(reduce):
    def guarded(obj):
        if obj.device.type == "pjrt":
            # NOTE: a multiprocessing.Queue pickles in a feeder thread, where an error
            # would be printed and the item dropped (its receiver would wait forever): the
            # item goes through and raises when the receiver unpickles it
            return _refuse, (_NOT_SHARED,)
        return reduce(obj)

    guarded.__name__ = guarded.__qualname__ = reduce.__name__
    return guarded


def _guard_sharing() -> None:
    """PyTorch's multiprocessing reducers of tensors and storages, for pjrt ones."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers PyTorch's reducers)

    for cls, reduce in list(ForkingPickler._extra_reducers.items()):
        if getattr(reduce, "__module__", "") == "torch.multiprocessing.reductions" and (
            issubclass(cls, torch.Tensor) or cls in torch._storage_classes
            or cls is torch.storage.TypedStorage
        ):  # fmt: skip
            ForkingPickler.register(cls, _guarded(reduce))


def register() -> None:
    _guard_sharing()
    torch.serialization.register_package(19, _tag, _restore)
    torch.storage._StorageBase.pjrt = _storage_to_pjrt
    torch.storage.TypedStorage.pjrt = _storage_to_pjrt
    # (PyTorch generates these with the methods above, which it cannot generate for us)
    torch.storage._StorageBase.is_pjrt = property(_is_pjrt)
    torch.storage.TypedStorage.is_pjrt = property(_is_pjrt)
    # NOTE: PyTorch's clone makes UntypedStorage(n, device=...), which a Python backend
    # cannot allocate (no C++ allocator); copy.deepcopy of a module on pjrt needs it
    torch.storage._StorageBase.clone = _clone
