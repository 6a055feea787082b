"""Device properties and memory figures, from the platform where it reports them.

GPU and TPU PJRT clients report memory statistics (``jax.Device.memory_stats``). The
CPU client does not; there the figures count the bytes of live JAX arrays on the
device, and the peak is the highest such count seen at a query or reset.
"""

from __future__ import annotations

import dataclasses

import jax

_peaks: dict = {}


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


def _live_bytes(device) -> int:
    total = 0
    for array in jax.live_arrays(device.platform):
        try:
            if device in array.devices():
                total += array.nbytes
        except RuntimeError:  # deleted meanwhile
            continue
    return total


def memory_stats(device) -> dict:
    """PyTorch-style memory statistics (``torch.cuda.memory_stats`` key names)."""
    stats = _platform_stats(device)
    if stats:
        current = stats.get("bytes_in_use", 0)
        peak = stats.get("peak_bytes_in_use", current)
        peak = max(peak if device not in _peaks else _peaks[device][1], current)
        reserved = stats.get("bytes_reserved", stats.get("pool_bytes", current))
        source = "platform"
    else:
        current = _live_bytes(device)
        peak = max(_peaks.get(device, (0, 0))[1], current)
        reserved = current
        source = "live_arrays"
    _peaks[device] = (current, peak)
    return {
        "allocated_bytes.all.current": current,
        "allocated_bytes.all.peak": peak,
        "reserved_bytes.all.current": reserved,
        "source": source,
    }


def reset_peak(device) -> None:
    stats = memory_stats(device)
    _peaks[device] = (stats["allocated_bytes.all.current"],) * 2
