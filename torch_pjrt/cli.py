"""The ``torch-pjrt`` command.

    torch-pjrt doctor                  # versions, plugins, platform, devices, a smoke test
    torch-pjrt doctor --json           # the same, machine-readable
    torch-pjrt doctor --platform tpu   # check one platform (exits 1 when it is missing)
    python -m torch_pjrt.cli doctor    # without the installed entry point
    torch-pjrt run [--platform P] [--mode M] [--cuda-compat] [--receipt FILE] script.py args...
    torch-pjrt migrate PATH [--apply] [--report FILE]
    torch-pjrt export MODULE_OR_SCRIPT [--format stablehlo|litert] --out PATH
    torch-pjrt explain "ERROR TEXT OR TRACEBACK"   (or - to read it from stdin)
    torch-pjrt onboard [--steps N] [--json] script.py args...  # first steps, vs the CPU
    torch-pjrt report [--out report.html] [--steps N] [--json] script.py args...  # a page
    torch-pjrt mcp                     # the tools above for coding assistants (MCP, stdio)

``main(argv)`` returns the exit status: for ``doctor``, 0 when every check passed, 1 when
one failed; for ``run``, the script's exit status (1 when it raised); for ``migrate``, 0
when every file was analyzed (and, with ``--apply``, rewritten where needed), 1 when a
file could not be (a syntax error, a binary or read-only file, ...); for ``export``, 0
when the file or directory was written, 1 when the model could not be exported (an op
with no lowering, a data-dependent size, an unwritable path); 2 for a usage error
(``migrate``: also a PATH that does not exist; ``export``: no such script or module, or
no hook in it); for ``explain``, 0 when an entry was found, 1 when none; for ``mcp``, 0
when the client closed the connection, 1 when the mcp SDK is missing; for ``onboard``,
0 when nothing was found, 1 when something was, 2 when there is no such script; for
``report``, 0 when the script ran to its end (or the steps asked for) and the page was
written, 1 when the script raised (the page is written, with the error), 2 when there is
no such script or ``--out`` cannot be written.
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
    exp = sub.add_parser(
        "export",
        help="export a model to StableHLO (run by JAX alone) or to LiteRT (.tflite)",
        description="Import MODULE_OR_SCRIPT (a .py file or a dotted module name, "
        f"optionally ':FUNCTION'), call its {EXPORT_HOOK}() (or FUNCTION), which returns "
        "(model, example_args) or (model, example_args, dynamic_shapes), and write the "
        "model: --format stablehlo writes a directory (torch_pjrt.export.save), --format "
        "litert a .tflite file (torch_pjrt.export.to_litert). A failed export writes "
        "nothing. docs/export.md has the details.",
    )
    exp.add_argument("target", metavar="MODULE_OR_SCRIPT", help="path/to/file.py or pkg.mod")
    exp.add_argument(
        "--format", choices=("stablehlo", "litert"), default="stablehlo", help="the target"
    )
    exp.add_argument("--out", metavar="PATH", required=True, help="the directory or file")
    exp.add_argument(
        "--platforms",
        metavar="P,...",
        default="cpu",
        help="stablehlo: the platforms to compile for, e.g. cpu,cuda,tpu (default: cpu)",
    )
    exp.add_argument(
        "--quantize",
        choices=("dynamic_int8",),
        default=None,
        help="litert: dynamic-range int8 (int8 weights, activations quantized at run time)",
    )
    expl = sub.add_parser(
        "explain",
        help="explain a torch_pjrt error: what it means, the usual cause, the fix",
        description="Look up an error message or a whole traceback in torch_pjrt's error "
        "glossary and print what it means, its usual cause, the fix and the doc to read. "
        "Exits 1 when no entry matches.",
    )
    expl.add_argument("text", metavar="TEXT", help='the error or traceback; "-" reads stdin')
    expl.add_argument("--json", action="store_true", help="print the entries as JSON")
    onb = sub.add_parser(
        "onboard",
        help="run a program's first steps on pjrt next to the CPU and list what to fix",
        description="Check the installation, read the script for CUDA-only and slow code, "
        "then run it on pjrt for its first optimizer steps: the first module whose output "
        "differs from the CPU's, recompilations with their cause, host syncs inside the "
        "loop and CPU fallbacks, each with the line and a fix; a numbered fix list at the "
        "end. Exits 1 when something was found.",
    )
    onb.add_argument("--steps", type=int, default=4, help="optimizer steps to run (default 4)")
    onb.add_argument("--json", action="store_true", help="print the report as JSON")
    onb.add_argument("--platform", metavar="P", default=None, help="PJRT platform")
    onb.add_argument("script", help="the Python script to run")
    onb.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    rep = sub.add_parser(
        "report",
        help="run a program and write one HTML page of what the device did",
        description="Run the script on pjrt and write a self-contained HTML report: step "
        "time with the compilations and their causes, host syncs by line, CPU fallbacks, "
        "bytes moved, device memory over time and per program, the ten costliest "
        "programs, and what strict mode would stop on, with fixes (docs/diagnostics.md). "
        "Exits 1 when the script raised.",
    )
    rep.add_argument("--out", default="report.html", help="the page (default report.html)")
    rep.add_argument("--steps", type=int, default=None, help="stop after N optimizer steps")
    rep.add_argument("--json", action="store_true", help="print what the page shows as JSON")
    rep.add_argument("--platform", metavar="P", default=None, help="PJRT platform")
    rep.add_argument("script", help="the Python script to run")
    rep.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    sub.add_parser(
        "mcp",
        help="serve doctor, explain, migrate and metrics to coding assistants (MCP, stdio)",
        description="Serve torch_pjrt's tools over the Model Context Protocol on stdin and "
        "stdout, for a coding assistant to call (docs/agents.md).",
    )
    return ap


def explain_command(text: str, *, as_json: bool = False) -> int:
    """``torch-pjrt explain``: print the entries for ``text``; returns the exit status."""
    import dataclasses

    from torch_pjrt.diagnostics import glossary

    if text == "-":
        text = sys.stdin.read()
    found = glossary.explain(text)
    if as_json:
        print(json.dumps([dataclasses.asdict(e) for e in found], indent=2))
    elif found:
        print("\n\n".join(glossary.format_entry(e) for e in found))
    else:
        print(
            "torch-pjrt explain: no glossary entry matches this text. Errors from PyTorch "
            "or JAX themselves are not in it; run `torch-pjrt doctor` for the setup.",
            file=sys.stderr,
        )
    return 0 if found else 1


def onboard_command(script, args, *, steps=4, as_json=False, platform=None) -> int:
    """``torch-pjrt onboard``: print the report; returns the exit status."""
    from torch_pjrt.diagnostics import onboard

    if not os.path.isfile(script):
        print(f"torch-pjrt onboard: no such script: {script}", file=sys.stderr)
        return 2
    report = onboard.onboard(script, args, steps=steps, platform=platform)
    print(json.dumps(report, indent=2) if as_json else onboard.format_report(report))
    sys.stdout.flush()
    return 0 if report["ok"] else 1


def report_command(script, args, *, out, steps=None, as_json=False, platform=None) -> int:
    """``torch-pjrt report``: write the page; returns the exit status."""
    from torch_pjrt.diagnostics import report

    if steps is not None and steps < 1:
        print(f"torch-pjrt report: --steps must be at least 1, got {steps}", file=sys.stderr)
        return 2
    try:
        result = report(script, args, out=out, steps=steps, platform=platform)
    except OSError as exc:  # (no such script, an --out that cannot be written)
        print(exc, file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(result, indent=2, default=str))
    else:
        m = result["metrics"]
        print(
            f"torch-pjrt report: wrote {result['out']}: {result['steps_run']} optimizer "
            f"step(s), {m['compilations']} compilation(s), {m['host_syncs']} host sync(s), "
            f"{sum(m['fallbacks'].values())} CPU fallback(s), {len(result['findings'])} "
            "finding(s)"
        )
        if result["error"]:
            print(f"the script raised:\n{result['error']}", file=sys.stderr)
    sys.stdout.flush()
    return 1 if result["error"] else 0


EXPORT_HOOK = "export_example"


def _export_hook(target: str):
    """The hook function ``target`` names: ``path.py``, ``pkg.mod`` or either with
    ``:FUNCTION`` (default :data:`EXPORT_HOOK`). Raises LookupError with the reason."""
    import importlib
    import runpy

    where, _, name = target.partition(":")
    name = name or EXPORT_HOOK
    if where.endswith(".py") or os.sep in where:
        if not os.path.isfile(where):
            raise LookupError(f"no such script: {where}")
        sys.path.insert(0, os.path.dirname(os.path.abspath(where)))
        namespace = runpy.run_path(where, run_name="__torch_pjrt_export__")
    else:
        try:
            namespace = vars(importlib.import_module(where))
        except ModuleNotFoundError as exc:
            if exc.name is None or not where.startswith(exc.name):
                raise  # (a module the user's module imports is missing: their error)
            raise LookupError(f"no such script or module: {where}") from None
    hook = namespace.get(name)
    if not callable(hook):
        raise LookupError(
            f"{where} defines no {name}(); define it to return (model, example_args) or "
            "(model, example_args, dynamic_shapes) (docs/export.md)"
        )
    return hook


def export_command(
    target: str,
    out: str,
    *,
    fmt: str = "stablehlo",
    platforms: str = "cpu",
    quantize: str | None = None,
) -> int:
    """``torch-pjrt export``: returns the exit status."""
    if quantize is not None and fmt != "litert":
        print("torch-pjrt export: --quantize applies to --format litert", file=sys.stderr)
        return 2
    saved_path = list(sys.path)
    try:
        return _export(target, out, fmt, platforms, quantize)
    finally:
        sys.path[:] = saved_path  # (a script's folder was put first, as python does)


def _export(target, out, fmt, platforms, quantize) -> int:
    import torch

    import torch_pjrt.export as pjrt_export

    try:
        hook = _export_hook(target)
    except LookupError as exc:
        print(f"torch-pjrt export: {exc.args[0]}", file=sys.stderr)
        return 2
    example = hook()
    if not isinstance(example, tuple) or len(example) not in (2, 3):
        print(
            f"torch-pjrt export: {target}'s hook returned {type(example).__name__}; "
            "expected (model, example_args) or (model, example_args, dynamic_shapes)",
            file=sys.stderr,
        )
        return 2
    model, args, dynamic = (*example, None)[:3]
    args = (args,) if isinstance(args, torch.Tensor) else tuple(args)
    try:
        if fmt == "litert":
            if dynamic is not None:
                print(
                    "torch-pjrt export: note: the .tflite file takes the example's shapes "
                    "(dynamic_shapes is for --format stablehlo)",
                    file=sys.stderr,
                )
            written = pjrt_export.to_litert(model, args, out, quantize=quantize)
        else:
            exported = torch.export.export(model, args, dynamic_shapes=dynamic)
            written = pjrt_export.save(exported, out, platforms=tuple(platforms.split(",")))
    except Exception as exc:  # noqa: BLE001  (the reasons an export is refused, below)
        message = _refusal(exc)
        if message is None:
            raise  # (a bug in the model or in torch_pjrt: its traceback helps)
        print(f"torch-pjrt export: {message}", file=sys.stderr)
        return 1
    print(f"torch-pjrt export: wrote {written} ({fmt})")
    return 0


def _refusal(exc: Exception) -> str | None:
    """The message for ``exc`` when it is a reason the export was refused (an op with no
    lowering, a data-dependent size or branch, a path that cannot be written), else
    None."""
    from torch._dynamo.exc import UserError
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    from torch_pjrt.compile.nodes import source_of

    text = str(exc).strip()
    if isinstance(exc, GuardOnDataDependentSymNode):
        where = source_of(text.partition("The following call raised this error:")[2])
        return (
            f"the model branches on a tensor's value (at {where or 'a line not recorded'}; "
            f"PyTorch: {text.splitlines()[0]}); an exported program cannot. Use torch.cond "
            "or torch.where, or move the branch out of the model."
        )
    if isinstance(exc, (NotImplementedError, OSError, UserError)) or (
        isinstance(exc, RuntimeError) and text.startswith("torch_pjrt.export")
    ):
        return f"{type(exc).__name__}: {text}"
    return None


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
    if args.command == "onboard":
        return onboard_command(
            args.script, list(args.args), steps=args.steps, as_json=args.json,
            platform=args.platform,
        )  # fmt: skip
    if args.command == "report":
        return report_command(
            args.script, list(args.args), out=args.out, steps=args.steps, as_json=args.json,
            platform=args.platform,
        )  # fmt: skip
    if args.command == "mcp":
        from torch_pjrt.diagnostics import mcp_server

        return mcp_server.main()
    if args.command == "explain":
        return explain_command(args.text, as_json=args.json)
    if args.command == "export":
        return export_command(
            args.target,
            args.out,
            fmt=args.format,
            platforms=args.platforms,
            quantize=args.quantize,
        )
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
