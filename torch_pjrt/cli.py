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
import json
import os
import sys

from torch_pjrt.diagnostics.doctor import doctor

__all__ = ["main"]


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
    lines.append(f"device guard  {r['device_guard']}")
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
        from torch_pjrt.migrate import cuda_compat as compat

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
