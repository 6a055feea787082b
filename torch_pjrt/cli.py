"""The ``torch-pjrt`` command.

    torch-pjrt doctor                  # versions, plugins, platform, devices, a smoke test
    torch-pjrt doctor --json           # the same, machine-readable
    torch-pjrt doctor --platform tpu   # check one platform (exits 1 when it is missing)
    python -m torch_pjrt.cli doctor    # without the installed entry point
    torch-pjrt run [--platform P] [--mode M] [--cuda-compat] [--receipt FILE] script.py args...
    torch-pjrt migrate PATH [--apply] [--report FILE]

``main(argv)`` returns the exit status: for ``doctor``, 0 when every check passed, 1 when
one failed; for ``run``, the script's exit status (1 when it raised); for ``migrate``, 0
when every file was analyzed (and, with ``--apply``, rewritten where needed), 1 when a
file could not be (a syntax error, a binary or read-only file, ...); 2 for a usage error
(``migrate``: also a PATH that does not exist).
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.metadata
import json
import os
import platform as _platform
import sys
import time
import warnings

__all__ = ["main"]

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

    import torch_pjrt

    return {
        "python": _platform.python_version(),
        "torch": torch.__version__,
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "torch_pjrt": torch_pjrt.__version__,
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

    import torch_pjrt

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

    before = dict(torch_pjrt.metrics.as_dict()["fallbacks"])
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
    after = torch_pjrt.metrics.as_dict()["fallbacks"]
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
    import torch_pjrt
    from torch_pjrt.config import settings

    report: dict = {
        "ok": False,
        "versions": versions(),
        "plugins": installed_plugins(),
        "requested_platform": platform or settings.platform,
        "platform": None,
        "device_count": 0,
        "devices": [],
        "smoke": None,
        "error": None,
        "hints": [],
    }
    try:
        torch_pjrt.init(platform=platform)
        report["platform"] = torch_pjrt.current_platform()
    except torch_pjrt.PlatformError as exc:
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


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def format_report(r: dict) -> str:
    lines = ["torch_pjrt doctor", "versions"]
    for name, v in r["versions"].items():
        lines.append(f"  {name:<11} {v or 'not found'}")
    if r["plugins"]:
        lines.append("PJRT plugins")
        for name, v in r["plugins"].items():
            lines.append(f"  {name:<22} {v}")
    else:
        lines.append("PJRT plugins  none installed (only the CPU platform is available)")
    if r["requested_platform"]:
        lines.append(f"requested     {r['requested_platform']}")
    if r["platform"]:
        lines.append(f"platform      {r['platform']} ({r['device_count']} device(s))")
    if r["devices"]:
        lines.append("devices")
        for d in r["devices"]:
            lines.append(
                f"  pjrt:{d['index']}  {d['name']}  memory {_bytes(d['total_memory'])}, "
                f"in use {_bytes(d['memory_allocated'])} ({d['memory_source']})"
            )
    s = r["smoke"]
    if s is not None:
        status = "ok" if s["ok"] else "FAILED"
        if s["max_error"] is not None:
            lines.append(
                f"smoke test    matmul + softmax + backward vs CPU: max error "
                f"{s['max_error']:.3g} (tolerance {s['tolerance']:g}) {status} "
                f"[{s['seconds']:.2f} s, compilation included]"
            )
        else:
            lines.append(f"smoke test    {status}")
        if s["fallbacks"]:
            ops = ", ".join(f"{k} x{n}" for k, n in sorted(s["fallbacks"].items()))
            lines.append(f"  ran on the CPU (no pjrt lowering yet): {ops}")
    if r["error"]:
        lines.append(f"error         {r['error']}")
    for h in r["hints"]:
        lines.append(f"hint          {h}")
    lines.append(f"result        {'OK' if r['ok'] else 'FAILED'}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="torch-pjrt", description="torch_pjrt: the PyTorch 'pjrt' device on JAX/XLA."
    )
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    doc = sub.add_parser(
        "doctor",
        help="check the installation: versions, plugins, platform, devices, a smoke test",
        description="Print versions, PJRT plugins, the chosen platform and its devices, "
        "and run a small matmul + softmax + backward on pjrt compared with the CPU. "
        "Exits 1 when a check fails.",
    )
    doc.add_argument("--json", action="store_true", help="print one JSON object")
    doc.add_argument(
        "--platform",
        metavar="P",
        default=None,
        help="platform to use: tpu, cuda, rocm, gpu, neuron, metal, cpu (default: "
        "PJRT_DEVICE, else the first one found)",
    )
    run = sub.add_parser(
        "run",
        help="run a script on pjrt (with --cuda-compat: CUDA calls mapped at run time)",
        description="Run a Python script as __main__ with torch_pjrt set up. With "
        "--cuda-compat, torch.cuda calls, 'cuda' devices, CUDA autocast and GradScaler, "
        "cudnn flags and the nccl backend are mapped to pjrt at run time (no file changes), "
        "and a receipt of the mapped calls is printed to stderr at the end. "
        "Exits with the script's status.",
    )
    run.add_argument("--platform", metavar="P", default=None, help="PJRT platform (as for doctor)")
    run.add_argument(
        "--mode",
        metavar="M",
        choices=("eager", "fused", "debug"),
        default=None,
        help="execution mode: eager, fused or debug (default: TORCH_PJRT_MODE, else fused)",
    )
    run.add_argument(
        "--cuda-compat", action="store_true", help="map CUDA-only calls to pjrt at run time"
    )
    run.add_argument(
        "--receipt", metavar="FILE", default=None, help="also write the receipt as JSON"
    )
    run.add_argument("script", help="the Python script to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    mig = sub.add_parser(
        "migrate",
        help="find CUDA-only code and rewrite it to device-generic torch.accelerator code",
        description="Analyze a Python file, or every *.py file under a folder, for "
        "CUDA-only code (torch.cuda calls, 'cuda' devices, .cuda(), CUDA autocast and "
        "GradScaler, cudnn flags, the nccl backend, CUDA-only libraries, ...) and for code "
        "that is slow on XLA devices. Prints each finding with the proposed change and its "
        "risk. With --apply, rewrites the files in place (atomically) to device-generic "
        "code. Exits 1 when a file could not be analyzed or rewritten, else 0.",
    )
    mig.add_argument("path", metavar="PATH", help="a Python file or a folder")
    mig.add_argument("--apply", action="store_true", help="rewrite the files in place")
    mig.add_argument(
        "--report",
        metavar="FILE",
        default=None,
        help="also write the report to FILE: Markdown when it ends in .md, else JSON",
    )
    return ap


def migrate_command(path: str, *, apply: bool = False, report_file: str | None = None) -> int:
    """``torch-pjrt migrate``: print the report; returns the exit status."""
    from torch_pjrt import migrate
    from torch_pjrt.migrate.report import format_text, write_report

    try:
        report = migrate.migrate(path, apply=apply)
    except migrate.MigrateError as exc:
        print(f"torch-pjrt migrate: {exc}", file=sys.stderr)
        return 2
    print(format_text(report))
    sys.stdout.flush()
    if report_file:
        try:
            write_report(report, report_file)
        except OSError as exc:
            print(
                f"torch-pjrt migrate: cannot write the report to {report_file}: "
                f"{exc.strerror or exc}",
                file=sys.stderr,
            )
            return 1
    for r in report.errors:
        print(f"torch-pjrt migrate: {r.error}", file=sys.stderr)
    return 1 if report.errors else 0


def run_script(
    script: str,
    args: list[str],
    *,
    platform: str | None = None,
    mode: str | None = None,
    cuda_compat: bool = False,
    receipt: str | None = None,
) -> int:
    """``torch-pjrt run``: run ``script`` as ``__main__``; returns its exit status."""
    import runpy
    import traceback

    if not os.path.isfile(script):
        print(f"torch-pjrt run: no such script: {script}", file=sys.stderr)
        return 2
    import torch_pjrt

    try:
        torch_pjrt.init(platform=platform)
    except torch_pjrt.PlatformError as exc:
        print(f"torch-pjrt run: {exc}", file=sys.stderr)
        return 1
    if mode is not None:
        torch_pjrt.set_mode(mode)
    compat = None
    if cuda_compat:
        from torch_pjrt import cuda_compat as compat

        compat.install(report_at_exit=False)
    old_argv, old_path0 = sys.argv, sys.path[0] if sys.path else None
    sys.argv = [script, *args]
    script_dir = os.path.dirname(os.path.abspath(script))
    if sys.path:
        sys.path[0] = script_dir
    else:
        sys.path.insert(0, script_dir)
    status = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None:
            status = 0
        elif isinstance(exc.code, int):
            status = exc.code
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    except BaseException:  # noqa: BLE001  (the script's error, reported as python would)
        traceback.print_exc()
        status = 1
    finally:
        sys.argv = old_argv
        if old_path0 is not None:
            sys.path[0] = old_path0
        sys.stdout.flush()
        if compat is not None:
            print(compat.receipt().format(), file=sys.stderr)
            if receipt:
                compat.receipt().write_json(receipt)
    return status


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns the exit status."""
    ap = _parser()
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error
        return exc.code if isinstance(exc.code, int) else 2
    if args.command == "run":
        return run_script(
            args.script,
            list(args.args),  # verbatim, "--" included: they are the script's
            platform=args.platform,
            mode=args.mode,
            cuda_compat=args.cuda_compat,
            receipt=args.receipt,
        )
    if args.command == "migrate":
        return migrate_command(args.path, apply=args.apply, report_file=args.report)
    if args.command != "doctor":
        ap.print_help()
        return 2
    report = doctor(args.platform)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report))
    sys.stdout.flush()
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
