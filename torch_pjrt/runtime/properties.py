"""Device properties and memory figures, from the platform where it reports them.

GPU and TPU PJRT clients report memory statistics (``jax.Device.memory_stats``). The
CPU client does not; there the figures count the live JAX arrays on the device and their
bytes, and a peak is the highest such figure seen at a query or reset. The figures take
``torch.cuda.memory_stats()``'s names; the ones no PJRT client keeps are zeros.
"""

from __future__ import annotations

import dataclasses

import jax

# device -> {(stat, pool, "peak"): the highest figure seen at a query since the last reset}
_peaks: dict = {}
# device -> the platform's own peaks at the last reset (it cannot reset them itself)
_reset_at: dict = {}


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    name: str
    platform: str
    total_memory: int
    index: int
    process_index: int

    def __repr__(self) -> str:
        mb = self.total_memory // (1024 * 1024)
        return (
            f"_PjrtDeviceProperties(name='{self.name}', platform='{self.platform}', "
            f"total_memory={mb}MB, index={self.index})"
        )


def _platform_stats(device) -> dict | None:
    try:
        return device.memory_stats()
    except Exception:  # noqa: BLE001  (plugins without the call raise various errors)
        return None


def properties(device) -> DeviceProperties:
    stats = _platform_stats(device) or {}
    total = stats.get("bytes_limit", 0)
    if not total and device.platform == "cpu":
        import os

        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return DeviceProperties(
        name=device.device_kind,
        platform=device.platform,
        total_memory=int(total),
        index=device.id,
        process_index=device.process_index,
    )


# torch.cuda.memory_stats()'s statistics: each has these pools and these metrics
_STATS = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
_POOLS = ("all", "large_pool", "small_pool")
_METRICS = ("current", "peak", "allocated", "freed")
_COUNTERS = (
    "num_alloc_retries",
    "num_ooms",
    "num_sync_all_streams",
    "num_device_alloc",
    "num_device_free",
    "num_oom_rejections",
    "max_split_size",
)
_OVERSIZE = ("oversize_allocations", "oversize_segments")
_SMALL = 1 << 20  # PyTorch's small pool: allocations under 1 MiB


def _zeros() -> dict:
    keys = [f"{s}.{p}.{m}" for s in _STATS for p in _POOLS for m in _METRICS]
    keys += [f"{s}.{m}" for s in _OVERSIZE for m in _METRICS]
    return dict.fromkeys(sorted(keys + list(_COUNTERS)), 0)


def _live(device) -> dict:
    """Count and bytes of the live JAX arrays on ``device``, per pool."""
    counts = dict.fromkeys(_POOLS, 0)
    sizes = dict.fromkeys(_POOLS, 0)
    for array in jax.live_arrays(device.platform):
        try:
            if device not in array.devices():
                continue
            nbytes = array.nbytes
        except RuntimeError:  # deleted meanwhile
            continue
        for pool in ("all", "small_pool" if nbytes < _SMALL else "large_pool"):
            counts[pool] += 1
            sizes[pool] += nbytes
    return {"count": counts, "bytes": sizes}


def _figures(device) -> dict:
    """This device's figures as {(stat, pool, metric): value}."""
    stats = _platform_stats(device)
    figures = {}
    if stats:
        current = stats.get("bytes_in_use", 0)
        reserved = stats.get("bytes_reserved", stats.get("pool_bytes", current))
        figures[("allocated_bytes", "all", "current")] = current
        figures[("allocated_bytes", "all", "peak")] = stats.get("peak_bytes_in_use", current)
        figures[("reserved_bytes", "all", "current")] = reserved
        figures[("reserved_bytes", "all", "peak")] = stats.get(
            "peak_bytes_reserved", stats.get("peak_pool_bytes", reserved)
        )
        figures[("allocation", "all", "allocated")] = stats.get("num_allocs", 0)
        return figures
    live = _live(device)
    for pool in _POOLS:
        for stat in ("allocated_bytes", "reserved_bytes"):
            figures[(stat, pool, "current")] = live["bytes"][pool]
        for stat in ("allocation", "segment"):
            figures[(stat, pool, "current")] = live["count"][pool]
    return figures


def memory_stats(device) -> dict:
    """``torch.cuda.memory_stats()``'s keys and meanings, every value an int: the figures
    the platform reports (or the live arrays', where it reports none), zeros for the
    ones it does not keep (docs/device_api.md, Memory)."""
    figures = _figures(device)
    seen = _peaks.setdefault(device, {})
    at_reset = _reset_at.get(device, {})
    for stat, pool, metric in [key for key in figures if key[2] == "current"]:
        key = (stat, pool, "peak")
        reported = figures.get(key, 0)  # the platform's own peak, where it keeps one
        if reported <= at_reset.get(key, -1):  # ... reached before the last reset
            reported = 0
        seen[key] = max(seen.get(key, 0), reported, figures[(stat, pool, metric)])
        figures[key] = seen[key]
    # no caching allocator: every allocated block is active and was requested as such
    for pool in _POOLS:
        for metric in ("current", "peak"):
            for stat, same_as in (
                ("active", "allocation"),
                ("active_bytes", "allocated_bytes"),
                ("requested_bytes", "allocated_bytes"),
            ):
                if (same_as, pool, metric) in figures:
                    figures[(stat, pool, metric)] = figures[(same_as, pool, metric)]
    out = _zeros()
    for (stat, pool, metric), value in figures.items():
        out[f"{stat}.{pool}.{metric}"] = int(value)
    return out


def memory_source(device) -> str:
    """Where :func:`memory_stats`' figures come from: "platform" or "live_arrays"."""
    return "platform" if _platform_stats(device) else "live_arrays"


def reset_peak(device) -> None:
    """Start every peak again from the current figure."""
    figures = _figures(device)
    _reset_at[device] = {key: value for key, value in figures.items() if key[2] == "peak"}
    _peaks[device] = {
        (stat, pool, "peak"): value
        for (stat, pool, metric), value in figures.items()
        if metric == "current"
    }
