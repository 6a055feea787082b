"""Choosing the PJRT platform and listing its devices."""

from __future__ import annotations

import logging
import os
import threading

from torch_pjrt.config import settings
from torch_pjrt.runtime import events as metrics
from torch_pjrt.runtime import launch

log = logging.getLogger("torch_pjrt")

# PJRT_DEVICE spellings (PyTorch/XLA's convention) -> JAX platform names.
_ALIASES = {
    "TPU": "tpu",
    "CUDA": "cuda",
    "GPU": "gpu",
    "ROCM": "rocm",
    "NEURON": "neuron",
    "CPU": "cpu",
    "METAL": "METAL",
}

# The package a user installs to get each platform's PJRT plugin.
_PLUGIN_PACKAGES = {
    "tpu": "libtpu (pip install 'jax[tpu]')",
    "cuda": "jax-cuda12-plugin or jax-cuda13-plugin (pip install 'jax[cuda12]' or 'jax[cuda13]')",
    "gpu": "jax-cuda12-plugin or jax-cuda13-plugin (pip install 'jax[cuda12]' or 'jax[cuda13]')",
    "rocm": "jax-rocm7-plugin (pip install 'jax[rocm7-local]')",
    "neuron": "jax-neuronx (AWS Neuron's JAX plugin)",
    "METAL": "jax-metal",
}

# The GPU platforms' names (where Pallas kernels compile through Triton).
GPU_PLATFORMS = ("cuda", "rocm", "gpu")

# Accelerator platforms tried, in order, when no platform is asked for.
_PREFERENCE = ("tpu", "neuron", "cuda", "rocm", "gpu", "METAL")


class PlatformError(RuntimeError):
    """The requested PJRT platform is not available."""


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.platform: str | None = None
        self.devices: list = []
        # pjrt:LOCAL_RANK -> 0 under a launcher when this process sees one device
        self.aliases: dict[int, int] = {}
        self.visible = 0  # the device count PyTorch is told (launcher's view)


_state = _State()


def _normalize(name: str) -> str:
    key = name.strip()
    return _ALIASES.get(key.upper(), key.lower())


# NOTE: XLA's CPU scheduler by default orders a program's kernels so that independent
# ones can run at once; a program whose order is then not one chain (each kernel using
# a buffer of the one before) runs on XLA's thread pool, handing each kernel over: about
# a microsecond a kernel, and the host's thread competes with the pool. A checked
# program's value checks are such side branches: the captured one-token decoding step
# of benchmarks/generate.py ran at 1.7-1.8x plain JAX's step, 1.25-1.4x in order
# (docs/internals.md). XLA reads it from XLA_FLAGS once, when its first client starts
# (JAX's per-program compiler_options do not reach it); a user's own setting wins.
_CPU_SCHEDULER = "--xla_cpu_enable_concurrency_optimized_scheduler"


def _apply_cpu_scheduler() -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    if _CPU_SCHEDULER in flags:
        return
    os.environ["XLA_FLAGS"] = f"{flags} {_CPU_SCHEDULER}=false".strip()


def _apply_cpu_device_count() -> None:
    if settings.cpu_devices is None:
        return
    import jax

    # NOTE: JAX reads this once, when its CPU client starts; it is the only JAX
    # setting torch_pjrt touches, and only when TORCH_PJRT_CPU_DEVICES asks for it.
    try:
        jax.config.update("jax_num_cpu_devices", int(settings.cpu_devices))
    except RuntimeError as exc:  # the CPU backend has already started
        log.warning("TORCH_PJRT_CPU_DEVICES=%s ignored: %s", settings.cpu_devices, exc)


_EVENTS = {
    "/jax/compilation_cache/cache_hits": "xla_cache_hits",
    "/jax/compilation_cache/cache_misses": "xla_cache_misses",
}
_DURATIONS = {
    "/jax/compilation_cache/compile_time_saved_sec": "xla_cache_seconds_saved",
    "/jax/core/compile/backend_compile_duration": "xla_compile_seconds",
}


def _on_event(event: str, **kwargs) -> None:
    name = _EVENTS.get(event)
    if name is not None:
        metrics.count(name)


def _on_duration(event: str, duration: float, **kwargs) -> None:
    name = _DURATIONS.get(event)
    if name is not None:
        metrics.add_seconds(name, duration)


def _listen() -> None:
    """Count XLA compilations and persistent-cache hits in torch_pjrt.metrics."""
    import jax.monitoring

    jax.monitoring.register_event_listener(_on_event)
    jax.monitoring.register_event_duration_secs_listener(_on_duration)


def _apply_compilation_cache() -> None:
    """Turn on JAX's persistent compilation cache (unless the user configured JAX's)."""
    import jax

    _listen()
    if settings.cache_dir is None or jax.config.jax_compilation_cache_dir:
        return
    jax.config.update("jax_compilation_cache_dir", settings.cache_dir)
    jax.config.update(
        "jax_persistent_cache_min_compile_time_secs", float(settings.cache_min_seconds)
    )


def _available(platform: str) -> list:
    import jax

    try:
        return list(jax.local_devices(backend=platform))  # this process's, when distributed
    except RuntimeError:
        return []


def init(platform: str | None = None) -> str:
    """Choose the PJRT platform; called by the first use of a pjrt device.

    Args:
        platform: ``"tpu"``, ``"cuda"``, ``"rocm"``, ``"neuron"``, ``"cpu"``, ... (any
            case, PyTorch/XLA's ``PJRT_DEVICE`` spellings too). None uses ``PJRT_DEVICE``,
            else the first accelerator JAX finds, else the CPU.

    Returns:
        The JAX name of the chosen platform.

    Example:
        >>> torch_pjrt.init(platform="cpu")
        'cpu'
    """
    with _state.lock:
        wanted = _normalize(platform) if platform else None
        if _state.platform is not None:
            if (
                wanted is not None
                and wanted != _state.platform
                and (_available(wanted) != _state.devices)
            ):
                raise PlatformError(
                    f"torch_pjrt is already running on platform '{_state.platform}'; the "
                    f"platform must be chosen (here '{wanted}') before the first pjrt tensor "
                    "is made. Set PJRT_DEVICE or call torch_pjrt.init() at the start."
                )
            return _state.platform
        if wanted is None and settings.platform:
            wanted = _normalize(settings.platform)
        _apply_cpu_scheduler()
        _apply_cpu_device_count()
        _apply_compilation_cache()
        launch.init_jax_from_env(wanted or settings.platform)  # under torchrun
        if wanted is not None:
            found = _available(wanted)
            if not found:
                hint = _PLUGIN_PACKAGES.get(wanted)
                install = f" Install its PJRT plugin: {hint}." if hint else ""
                raise PlatformError(
                    f"PJRT platform '{wanted}' was requested (PJRT_DEVICE or "
                    f"torch_pjrt.init) but JAX found no such devices.{install} "
                    "Use PJRT_DEVICE=CPU to run on the CPU."
                )
        else:
            found = []
            for candidate in _PREFERENCE:
                found = _available(candidate)
                if found:
                    wanted = candidate
                    break
            if not found:
                wanted, found = "cpu", _available("cpu")
        # NOTE: the name asked for ("cuda"), not the devices' own ("gpu")
        _state.platform = wanted
        _state.devices = found
        _state.aliases, _state.visible = _local_rank_alias(len(found))
        log.info("torch_pjrt: platform %s with %d device(s)", _state.platform, len(found))
        return _state.platform


def is_initialized() -> bool:
    return _state.platform is not None


def current_platform() -> str:
    return _state.platform if _state.platform is not None else init()


def devices() -> list:
    if _state.platform is None:
        init()
    return _state.devices


def device_count() -> int:
    return len(devices())


def _local_rank_alias(count: int) -> tuple[dict[int, int], int]:
    """Under torchrun, scripts name their device ``pjrt:LOCAL_RANK`` (``set_device(
    local_rank)``, DDP's ``device_ids=[local_rank]``), as on CUDA where each process sees
    the host's GPUs. A process that sees only its own device (the CPU platform, or a GPU
    given to it alone) takes that index as another name of its pjrt:0, and reports the
    host's count, LOCAL_WORLD_SIZE, as the launcher knows it. Returns (aliases, the count
    reported)."""
    env = launch.torchrun_env()
    if env is None or count != 1 or env["local_world_size"] <= 1:
        return {}, count
    return {env["local_rank"]: 0}, env["local_world_size"]


def visible_device_count() -> int:
    """``torch.pjrt.device_count()``: the platform's devices, or under a launcher whose
    processes see one device each, the launcher's count (:func:`_local_rank_alias`)."""
    if _state.platform is None:
        init()
    return _state.visible


def canonical_index(index: int) -> int:
    """``index``, or 0 where ``pjrt:index`` is another name of this process's one device
    (:func:`_local_rank_alias`): the index its tensors and its current device carry."""
    return _state.aliases.get(index, index)


def local_index(index: int | None) -> int:
    """The position in :func:`devices` of ``pjrt:index``; raises PyTorch's kind of error
    when there is none."""
    found = devices()
    i = 0 if index is None else index
    if 0 <= i < len(found):
        return i
    if i in _state.aliases:
        return _state.aliases[i]
    launched = launch.torchrun_env()
    under = (
        f" This process (torchrun local rank {launched['local_rank']}) sees "
        f"{len(found)} device(s); pjrt:LOCAL_RANK names its own device only when it "
        "sees one."
        if launched is not None
        else ""
    )
    raise RuntimeError(
        f"Invalid device pjrt:{i}: the '{_state.platform}' platform has {len(found)} "
        f"device(s), so valid indices are 0 to {len(found) - 1}.{under} "
        "(On the CPU platform, TORCH_PJRT_CPU_DEVICES=N gives N devices.)"
    )


def device(index: int | None):
    """The JAX device behind ``pjrt:index``; raises PyTorch's kind of error when invalid."""
    found = devices()
    if index is not None and 0 <= index < len(found):
        return found[index]
    return found[local_index(index)]


def live_arrays(index: int | None) -> list:
    """The live JAX arrays on ``pjrt:index``: what was issued to it and is still held."""
    import jax

    dev = device(index)
    arrays = jax.live_arrays(dev.platform)
    if jax.local_device_count(dev.platform) > 1:  # (this device's alone)
        arrays = [a for a in arrays if dev in a.devices()]
    return arrays
