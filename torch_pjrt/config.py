"""One configuration object; every field can come from a ``TORCH_PJRT_*`` variable."""

from __future__ import annotations

import contextlib
import dataclasses
import os

__all__ = ["Config", "config", "settings"]


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() not in ("", "0", "false", "no", "off")


@dataclasses.dataclass
class Config:
    """Settings of torch_pjrt.

    Attributes:
        fallback: what an op without a lowering does: ``"cpu"`` runs it on the CPU
            with a one-time warning per op, ``"error"`` raises (``TORCH_PJRT_FALLBACK``).
        cpu_devices: number of devices on JAX's CPU platform, or None for JAX's
            default (``TORCH_PJRT_CPU_DEVICES``); read when the runtime starts.
        platform: the PJRT platform to use, or None for the best one found
            (``PJRT_DEVICE``, then ``TORCH_PJRT_PLATFORM``).
        cache_dir: the persistent XLA compilation cache, shared by processes, or None
            for none (``TORCH_PJRT_CACHE_DIR``; default ``$XDG_CACHE_HOME/torch_pjrt/xla``,
            else ``~/.cache/torch_pjrt/xla``; ``TORCH_PJRT_CACHE=0`` turns it off). Read
            when the runtime starts.
        cache_min_seconds: programs that compile faster than this are not written to
            the persistent cache (``TORCH_PJRT_CACHE_MIN_SECONDS``, default 0.2).
        buckets: how compiled graphs with dynamic sizes pad them: ``"pow2"`` (the next
            power of two), a sorted tuple of sizes, or None for no padding (one program
            per size). ``TORCH_PJRT_BUCKETS``: ``pow2``, ``16,32,64,128`` or ``0``.
        mode: the execution mode, ``"debug"``, ``"eager"`` or ``"fused"`` (the default;
            ``TORCH_PJRT_MODE``; see :mod:`torch_pjrt.modes` and docs/modes.md).
        fused_max_ops: in fused mode, the recording runs as a program once it holds
            this many ops (``TORCH_PJRT_FUSED_MAX_OPS``, default 5000).
        check_nan: raise at the first op whose result has a NaN or an infinity
            (``TORCH_PJRT_CHECK_NAN``); ops then run one at a time, synchronously.
        check_numerics: run every op on the CPU too and warn at the first op whose
            result differs beyond tolerance (``TORCH_PJRT_CHECK_NUMERICS``); ops then run
            one at a time, synchronously.
        strict: raise on CPU fallbacks, and on host syncs and compilations inside a
            ``torch_pjrt.step()`` after warm-up (``TORCH_PJRT_STRICT``).
        strict_warmup: steps that may compile and sync in strict mode
            (``TORCH_PJRT_STRICT_WARMUP``, default 2).
    """

    fallback: str = "cpu"
    cpu_devices: int | None = None
    platform: str | None = None
    cache_dir: str | None = None
    cache_min_seconds: float = 0.2
    buckets: object = "pow2"
    mode: str = "fused"
    fused_max_ops: int = 5000
    check_nan: bool = False
    check_numerics: bool = False
    strict: bool = False
    strict_warmup: int = 2

    @classmethod
    def from_env(cls) -> Config:
        cpu_devices = os.environ.get("TORCH_PJRT_CPU_DEVICES")
        platform = os.environ.get("PJRT_DEVICE") or os.environ.get("TORCH_PJRT_PLATFORM")
        return cls(
            fallback=os.environ.get("TORCH_PJRT_FALLBACK", "cpu").strip().lower() or "cpu",
            cpu_devices=int(cpu_devices) if cpu_devices else None,
            platform=platform or None,
            cache_dir=_cache_dir(),
            cache_min_seconds=float(os.environ.get("TORCH_PJRT_CACHE_MIN_SECONDS", "0.2")),
            buckets=_buckets(os.environ.get("TORCH_PJRT_BUCKETS", "pow2")),
            mode=os.environ.get("TORCH_PJRT_MODE", "fused").strip().lower() or "fused",
            fused_max_ops=int(os.environ.get("TORCH_PJRT_FUSED_MAX_OPS", "5000")),
            check_nan=_env_bool("TORCH_PJRT_CHECK_NAN", False),
            check_numerics=_env_bool("TORCH_PJRT_CHECK_NUMERICS", False),
            strict=_env_bool("TORCH_PJRT_STRICT", False),
            strict_warmup=int(os.environ.get("TORCH_PJRT_STRICT_WARMUP", "2")),
        )


def _buckets(spec: str):
    spec = spec.strip().lower()
    if spec in ("", "0", "off", "none", "false", "no"):
        return None
    if spec == "pow2":
        return "pow2"
    try:
        sizes = tuple(sorted(int(x) for x in spec.split(",") if x.strip()))
    except ValueError:
        raise ValueError(
            f"TORCH_PJRT_BUCKETS={spec!r}: expected 'pow2', '0' or sizes like '16,32,64'"
        ) from None
    return sizes


def _cache_dir() -> str | None:
    if not _env_bool("TORCH_PJRT_CACHE", True):
        return None
    explicit = os.environ.get("TORCH_PJRT_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch_pjrt", "xla")


settings = Config.from_env()


@contextlib.contextmanager
def config(**overrides):
    """Override settings inside a ``with`` block.

    Example:
        >>> with torch_pjrt.config(fallback="error"):
        ...     y = x.to("pjrt") + 1
    """
    unknown = set(overrides) - {f.name for f in dataclasses.fields(Config)}
    if unknown:
        raise TypeError(f"torch_pjrt.config() got unknown settings: {sorted(unknown)}")
    saved = {name: getattr(settings, name) for name in overrides}
    for name, value in overrides.items():
        setattr(settings, name, value)
    try:
        yield settings
    finally:
        for name, value in saved.items():
            setattr(settings, name, value)
