"""``torch.pjrt.memory``: the device's memory figures under ``torch.cuda.memory``'s names.

The same functions are ``torch.pjrt``'s (``torch.pjrt.memory_allocated()``) and, with pjrt
as the current accelerator, ``torch.accelerator``'s (``device/accelerator.py`` routes
them here). XLA owns a pjrt device's memory, so there is no caching allocator: the
figures are the platform's where its PJRT client reports them (GPU, TPU), else those of
the live JAX arrays on the device (the CPU platform); ``runtime/properties.py`` keeps
them. What no client keeps (allocation counts and freed totals, retries, out-of-memory
events) reads as 0, under the key ``torch.cuda.memory_stats()`` gives it, so that tools
that read those keys run (docs/device_api.md, Memory).
"""

from __future__ import annotations

from torch_pjrt import runtime
from torch_pjrt.device import random as pjrt_random
from torch_pjrt.runtime import properties

__all__ = [
    "empty_cache",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_summary",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "reset_peak_memory_stats",
]


def _device(device=None):
    return runtime.device(pjrt_random.index_of(device))


def _flushed(device=None):
    """The JAX device, after the work recorded in fused mode has been started (not
    waited for), so that the figures count the tensors made so far, as on CUDA."""
    from torch_pjrt.modes import fused

    dev = _device(device)
    fused.flush_all("memory query")
    return dev


def memory_stats(device=None) -> dict:
    """``torch.cuda.memory_stats``' keys, sorted, every value an int."""
    return properties.memory_stats(_flushed(device))


def memory_allocated(device=None) -> int:
    """Bytes of the device's memory in use by arrays."""
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None) -> int:
    """The peak of :func:`memory_allocated` since the start or the last reset (on the CPU
    platform: the highest figure seen at a query)."""
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None) -> int:
    """Bytes the platform's allocator holds (on the CPU platform: the bytes in use)."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None) -> int:
    """The platform's reserved peak where it keeps one; never below the peak in use."""
    stats = memory_stats(device)
    return max(stats["reserved_bytes.all.peak"], stats["allocated_bytes.all.peak"])


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the device, as ``torch.cuda.mem_get_info``: total from the
    platform (the host's memory on the CPU platform), free = total - reserved."""
    total = properties.properties(_device(device)).total_memory
    return max(total - memory_reserved(device), 0), total


def reset_peak_memory_stats(device=None) -> None:
    """Start every peak again from the current figure."""
    properties.reset_peak(_flushed(device))


def reset_max_memory_allocated(device=None) -> None:
    """As ``torch.cuda.reset_max_memory_allocated``: resets every peak."""
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None) -> None:
    """Nothing to reset: the accumulated counts (``*.allocated``, ``*.freed``,
    ``num_*``) are the platform's or zeros."""
    _device(device)  # an invalid index still raises


def empty_cache() -> None:
    """Nothing to free: XLA frees a buffer when its last array goes."""


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A readable table of :func:`memory_stats`, as ``torch.cuda.memory_summary``."""
    dev = _flushed(device)
    stats = properties.memory_stats(dev)
    source = properties.memory_source(dev)
    lines = [
        f"pjrt memory summary, device pjrt:{dev.id} ({dev.platform}, {dev.device_kind})",
        "figures from "
        + (
            "the platform's allocator"
            if source == "platform"
            else "the live arrays on the device (the platform reports none)"
        ),
        f"{'':24}{'current':>16}{'peak':>16}",
    ]
    rows = [
        ("allocated bytes", "allocated_bytes"),
        ("reserved bytes", "reserved_bytes"),
        ("allocations", "allocation"),
    ]
    pools = ("all",) if abbreviated else ("all", "large_pool", "small_pool")
    for label, stat in rows:
        for pool in pools:
            name = label if pool == "all" else f"  {pool}"
            current, peak = (stats[f"{stat}.{pool}.{m}"] for m in ("current", "peak"))
            lines.append(f"{name:24}{current:>16}{peak:>16}")
    return "\n".join(lines)


def _record_memory_history(enabled="all", *args, **kwargs) -> None:
    """Turning the history off is accepted; turning it on raises (no allocator to ask)."""
    if enabled in (None, False):
        return
    raise NotImplementedError(
        "torch.pjrt.memory._record_memory_history() cannot record on the pjrt device: "
        "XLA allocates its memory, and there is no allocator whose events PyTorch can "
        "record. Read torch.pjrt.memory_stats() or torch.pjrt.memory_summary() instead, "
        "or JAX's device memory profile (jax.profiler.save_device_memory_profile)."
    )


def _snapshot(device=None, *args, **kwargs):
    raise NotImplementedError(
        "torch.pjrt.memory._snapshot() is not available on the pjrt device: there is no "
        "caching allocator with segments to list. Use torch.pjrt.memory_stats(), or "
        "jax.profiler.save_device_memory_profile(path) for a profile of the live buffers."
    )


def _dump_snapshot(filename="dump_snapshot.pickle"):
    _snapshot()
