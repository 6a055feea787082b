"""``torch.load(..., map_location="pjrt")``: storages restored onto pjrt devices.

NOTE: PyTorch's own PrivateUse1 path makes ``torch.UntypedStorage(n, device="pjrt")``,
which needs a C++ allocator that a pure-Python backend cannot register. This
restorer, tried before PyTorch's, builds the storage from the host bytes instead.
"""

from __future__ import annotations

import re

import torch

from torch_pjrt import runtime

_LOCATION = re.compile(r"^pjrt(?::(\d+))?$")


def _restore(obj, location: str):
    match = _LOCATION.match(location)
    if match is None:
        return None
    from torch_pjrt import random as pjrt_random
    from torch_pjrt.tensor import new_tensor

    index = int(match.group(1)) if match.group(1) else pjrt_random.current_device()
    device = runtime.device(index)
    host = torch.empty(0, dtype=torch.uint8).set_(obj.untyped() if hasattr(obj, "untyped") else obj)
    t = new_tensor((host.numel(),), torch.uint8, index)
    if host.numel():
        from torch_pjrt.tensor import cell_of

        cell_of(t).array = runtime.from_host(host, device)
    return t.untyped_storage()


def _tag(obj):
    if obj.device.type == "pjrt":
        return f"pjrt:{obj.device.index or 0}"
    return None


def register() -> None:
    torch.serialization.register_package(19, _tag, _restore)
