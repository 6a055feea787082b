"""The checks of ``torch-pjrt doctor``: versions, PJRT plugins, platform, devices, and a
smoke test against the CPU. :func:`doctor` returns them as a dict; the command
(``torch_pjrt/cli.py``) prints it.

Example:
    >>> report = doctor("cpu")
    >>> report["ok"], report["platform"], report["smoke"]["max_error"] < 1e-5
    (True, 'cpu', True)
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import os
import platform as _platform
import time
import warnings

__all__ = ["doctor", "installed_plugins", "versions"]

# Distributions that provide a PJRT plugin for JAX (glob patterns on normalized names).
PLUGIN_PATTERNS = (
    "libtpu",
    "libtpu-nightly",
    "jax-cuda12-plugin",
    "jax-cuda13-plugin",
    "jax-cuda*-pjrt",
    "jax-rocm*-plugin",
    "jax-rocm*-pjrt",
    "jax-neuronx",
    "jax-metal",
)

# Which of those serve each platform name a user may ask for (lowercased).
_PLATFORM_PLUGINS = {
    "tpu": ("libtpu*",),
    "cuda": ("jax-cuda*-plugin",),
    "gpu": ("jax-cuda*-plugin", "jax-rocm*-plugin"),
    "rocm": ("jax-rocm*-plugin",),
    "neuron": ("jax-neuronx",),
    "metal": ("jax-metal",),
}

# The smoke test passes when pjrt and the CPU agree this closely (max absolute error).
TOLERANCE = 1e-5


def _normalize_dist(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def installed_plugins() -> dict[str, str]:
    """Installed PJRT plugin distributions: {name: version}."""
    found = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata.get("Name")
        if not name:
            continue
        norm = _normalize_dist(name)
        if any(fnmatch.fnmatchcase(norm, p) for p in PLUGIN_PATTERNS):
            found[norm] = dist.version
    return dict(sorted(found.items()))


def _version(dist: str, module=None) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return getattr(module, "__version__", None) if module is not None else None


def versions() -> dict[str, str | None]:
    import jax
    import torch

    from torch_pjrt._version import __version__

    return {
        "python": _platform.python_version(),
        "torch": torch.__version__,
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "torch_pjrt": __version__,
    }


def _hints(requested: str | None, plugins: dict[str, str]) -> list[str]:
    """Advice for a requested platform that could not be started."""
    if not requested:
        return []
    key = requested.strip().lower()
    hints = []
    jax_platforms = os.environ.get("JAX_PLATFORMS", "").strip()
    if jax_platforms:
        allowed = [p.strip().lower() for p in jax_platforms.split(",") if p.strip()]
        if key not in allowed and not (key == "gpu" and {"cuda", "rocm"} & set(allowed)):
            hints.append(
                f"JAX_PLATFORMS={jax_platforms} is set and limits JAX to those platforms; "
                f"unset it (or add '{key}') to use '{key}'."
            )
    patterns = _PLATFORM_PLUGINS.get(key, ())
    have = [n for n in plugins if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if have:
        hints.append(
            f"{', '.join(have)} is installed, yet JAX found no '{key}' devices: check that "
            "this machine has the chip and its driver, and what "
            "`python -c 'import jax; print(jax.devices())'` reports."
        )
    return hints


def _smoke() -> dict:
    """matmul + softmax + backward on pjrt, compared with the same on the CPU."""
    import torch

    from torch_pjrt.diagnostics import metrics

    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 8, generator=g)
    b = torch.randn(8, 5, generator=g)
    w = torch.randn(4, 5, generator=g)

    def run(device):
        x = a.to(device).requires_grad_()
        y = b.to(device).requires_grad_()
        p = torch.softmax(x @ y, dim=-1)
        (p * w.to(device)).sum().backward()
        return [t.detach().to("cpu") for t in (p, x.grad, y.grad)]

    before = dict(metrics.as_dict()["fallbacks"])
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            # reported below from the metrics, not as warnings
            warnings.filterwarnings("ignore", message="torch_pjrt: .* has no pjrt lowering")
            got = run("pjrt")
    except Exception as exc:  # noqa: BLE001  (any failure is the check's result)
        return {
            "ok": False,
            "max_error": None,
            "tolerance": TOLERANCE,
            "seconds": round(time.perf_counter() - start, 3),
            "fallbacks": {},
            "error": f"{type(exc).__name__}: {exc}",
        }
    seconds = time.perf_counter() - start
    after = metrics.as_dict()["fallbacks"]
    fallbacks = {k: n - before.get(k, 0) for k, n in after.items() if n > before.get(k, 0)}
    want = run("cpu")
    err = max(float((u - v).abs().max()) for u, v in zip(got, want))
    ok = err <= TOLERANCE
    return {
        "ok": ok,
        "max_error": err,
        "tolerance": TOLERANCE,
        "seconds": round(seconds, 3),
        "fallbacks": fallbacks,
        "error": None if ok else f"max error {err:.3g} exceeds {TOLERANCE:g}",
    }


def _devices() -> list[dict]:
    import torch

    out = []
    for i in range(torch.pjrt.device_count()):
        props = torch.pjrt.get_device_properties(i)
        stats = torch.pjrt.memory_stats(i)
        out.append(
            {
                "index": i,
                "name": props.name,
                "platform": props.platform,
                "total_memory": props.total_memory,
                "memory_allocated": stats.get("allocated_bytes.all.current", 0),
                "memory_source": stats.get("source"),
            }
        )
    return out


def doctor(platform: str | None = None) -> dict:
    """Everything ``torch-pjrt doctor`` checks, as a dict (``ok`` says if all passed)."""
    from torch_pjrt import runtime
    from torch_pjrt.config import settings
    from torch_pjrt.device import guard

    native, why = guard.native()
    report: dict = {
        "ok": False,
        "versions": versions(),
        "plugins": installed_plugins(),
        "device_guard": "C++" if native else f"Python ({why})",
        "requested_platform": platform or settings.platform,
        "platform": None,
        "device_count": 0,
        "devices": [],
        "smoke": None,
        "error": None,
        "hints": [],
    }
    try:
        runtime.init(platform=platform)
        report["platform"] = runtime.current_platform()
    except runtime.PlatformError as exc:
        report["error"] = str(exc)
        report["hints"] = _hints(report["requested_platform"], report["plugins"])
        return report
    try:
        report["devices"] = _devices()
        report["device_count"] = len(report["devices"])
    except Exception as exc:  # noqa: BLE001
        report["error"] = f"listing devices failed: {type(exc).__name__}: {exc}"
        return report
    if not report["devices"]:
        report["error"] = f"platform '{report['platform']}' has no devices"
        return report
    report["smoke"] = _smoke()
    report["ok"] = report["smoke"]["ok"]
    if not report["ok"]:
        report["error"] = "smoke test failed: " + report["smoke"]["error"]
    return report
