"""``torch.pjrt`` (:class:`DeviceModule`), and the hooks and device guard PyTorch's
PrivateUse1 registration takes (``torch_pjrt/_registration.py`` registers them)."""

from __future__ import annotations

import torch

from torch_pjrt import runtime
from torch_pjrt.device import random as pjrt_random

__all__ = ["DeviceModule"]


_index = pjrt_random.index_of


class DeviceModule:
    """``torch.pjrt``: the device API, mirroring ``torch.cuda``."""

    @staticmethod
    def is_available() -> bool:
        """True when a PJRT platform with at least one device is found."""
        try:
            return runtime.device_count() > 0
        except runtime.PlatformError:
            return False

    @staticmethod
    def is_initialized() -> bool:
        return runtime.is_initialized()

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def _lazy_init() -> None:
        runtime.init()

    @staticmethod
    def init() -> None:
        """Start the PJRT platform now (as ``torch.cuda.init``; the first pjrt use does
        it otherwise)."""
        runtime.init()

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        """The dtypes ``torch.autocast(device_type="pjrt", dtype=...)`` accepts."""
        return [torch.float16, torch.bfloat16]

    @staticmethod
    def device_count() -> int:
        """Number of devices of the chosen platform (under torchrun, with one device a
        process: the launcher's LOCAL_WORLD_SIZE; docs/distributed.md)."""
        return runtime.visible_device_count()

    @staticmethod
    def current_device() -> int:
        return pjrt_random.current_device()

    @staticmethod
    def set_device(device) -> None:
        """Make ``pjrt:device`` the process's default pjrt device."""
        index = _index(device)
        runtime.device(index)  # raises on an invalid index
        pjrt_random.set_current_device(runtime.canonical_index(index))

    @staticmethod
    def synchronize(device=None) -> None:
        """Wait for all work queued on the device (every live pjrt array, and the copies
        to the host issued with ``non_blocking=True``)."""
        import jax

        from torch_pjrt.modes import fused
        from torch_pjrt.runtime import transfer

        fused.flush_all("synchronize")
        # NOTE: one wait for them all: an array's own block_until_ready costs ~1 us a
        # call, and a training step holds hundreds (parameters, gradients, states)
        try:
            jax.block_until_ready(runtime.live_arrays(_index(device)))
        finally:
            # then the value checks, whose flags are ready now (read first, they would
            # wait for each program through its flags, then every array again: ~0.1 ms
            # more after a training step's replay), and the copies to the host
            transfer.host_wait()

    @staticmethod
    def get_device_name(device=None) -> str:
        return runtime.device(_index(device)).device_kind

    @staticmethod
    def get_device_properties(device=None):
        from torch_pjrt.runtime.properties import properties

        return properties(runtime.device(_index(device)))

    @staticmethod
    def get_device_capability(device=None) -> tuple[int, int]:
        return (0, 0)

    @staticmethod
    def manual_seed(seed: int) -> None:
        """Seed the current pjrt device's RNG."""
        pjrt_random.manual_seed(seed, pjrt_random.current_device())

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        """Seed every pjrt device's RNG (``torch.manual_seed`` calls this)."""
        pjrt_random.manual_seed_all(seed)

    @staticmethod
    def seed() -> None:
        import random

        DeviceModule.manual_seed(random.getrandbits(63))

    @staticmethod
    def seed_all() -> None:
        import random

        DeviceModule.manual_seed_all(random.getrandbits(63))

    @staticmethod
    def initial_seed() -> int:
        return pjrt_random.initial_seed(pjrt_random.current_device())

    @staticmethod
    def get_rng_state(device="pjrt") -> torch.Tensor:
        return pjrt_random.get_rng_state(_index(device))

    @staticmethod
    def set_rng_state(new_state: torch.Tensor, device="pjrt") -> None:
        pjrt_random.set_rng_state(new_state, _index(device))

    @staticmethod
    def get_rng_state_all() -> list:
        return [pjrt_random.get_rng_state(i) for i in range(runtime.device_count())]

    @staticmethod
    def set_rng_state_all(new_states) -> None:
        for i, state in enumerate(new_states):
            pjrt_random.set_rng_state(state, i)

    @staticmethod
    def get_offset(device="pjrt") -> int:
        """How many random ops the device's generator has run since it was seeded (the
        offset of ``get_rng_state``; ``torch.cuda._get_rng_state_offset``'s meaning)."""
        return pjrt_random.offset(_index(device))

    @staticmethod
    def set_offset(offset: int, device="pjrt") -> None:
        """Set the device generator's offset (the seed stays): the next random op draws
        what it would have drawn as the ``offset``-th op after seeding."""
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ValueError(f"set_offset(): offset must be a non-negative int, got {offset!r}")
        pjrt_random.set_offset(_index(device), offset)

    @staticmethod
    def _get_rng_state_offset(device="pjrt") -> int:
        return DeviceModule.get_offset(device)

    @staticmethod
    def _set_rng_state_offset(offset: int, device="pjrt") -> None:
        DeviceModule.set_offset(offset, device)

    @staticmethod
    def is_bf16_supported(including_emulation: bool = True) -> bool:
        """True: XLA runs bfloat16 on every PJRT platform (natively or emulated)."""
        return True

    from torch_pjrt.device import memory
    from torch_pjrt.device.graphs import (
        Graph,
        graph,
        graph_pool_handle,
        is_current_stream_capturing,
        make_graphed_callables,
    )
    from torch_pjrt.device.memory import (
        empty_cache,
        max_memory_allocated,
        max_memory_reserved,
        mem_get_info,
        memory_allocated,
        memory_reserved,
        memory_stats,
        memory_summary,
        reset_accumulated_memory_stats,
        reset_max_memory_allocated,
        reset_peak_memory_stats,
    )
    from torch_pjrt.device.streams import (
        Event,
        Stream,
        current_stream,
        default_stream,
        set_stream,
        stream,
    )

    PJRTGraph = Graph  # (as torch.cuda.CUDAGraph)

    class device:
        """Context manager that changes the current pjrt device (as ``torch.cuda.device``)."""

        def __init__(self, device):
            self.index = _index(device)
            self.previous = None

        def __enter__(self):
            self.previous = pjrt_random.current_device()
            DeviceModule.set_device(self.index)
            return self

        def __exit__(self, *exc):
            pjrt_random.set_current_device(self.previous)
            return False


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    """The guard PyTorch's Python registration takes; ``device/guard.py`` replaces it
    with the C++ one where that builds."""

    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1
