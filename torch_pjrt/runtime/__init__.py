"""The runtime layer: which PJRT platform, its devices, and host<->device transfers.

Nothing outside this package knows which chip it runs on.
"""

from torch_pjrt.runtime.platform import (
    PlatformError,
    canonical_index,
    current_platform,
    device,
    device_count,
    devices,
    init,
    is_initialized,
    live_arrays,
    local_index,
    visible_device_count,
)
from torch_pjrt.runtime.transfer import from_host, to_host

__all__ = [
    "PlatformError",
    "canonical_index",
    "current_platform",
    "device",
    "device_count",
    "devices",
    "from_host",
    "init",
    "is_initialized",
    "live_arrays",
    "local_index",
    "to_host",
    "visible_device_count",
]
