"""``torch-pjrt onboard``: run the first steps of a program on pjrt, next to the CPU, and
say what stands between it and running well there.

:func:`onboard` checks the installation (``doctor``), reads the script for CUDA-only and
slow code (``migrate``'s findings), then runs the script as ``__main__`` on pjrt until
``steps`` optimizer steps are done (or it ends), watching:

- numerics: every module's forward during the first step is run again on the CPU, on a
  CPU copy of the module and its inputs; the first module whose output differs beyond
  the tolerance is named, with its largest error (modules in training mode with dropout
  are not compared: their random draws differ by design);
- compilations after the warm-up steps (recompilations; the first
  ``settings.strict_warmup`` steps compile, as strict mode allows), with their cause;
- host syncs in the steps after the first (inside the loop), by the user's line;
- CPU fallbacks, by op.

Each finding comes with the user's line where one is known and a fix; the report ends
with the fixes, numbered. The script's own output goes to stderr, so ``--json`` output
stays clean.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import runpy
import sys

import torch

from torch_pjrt.config import settings
from torch_pjrt.runtime.transfer import module_on_cpu, tree_on_cpu

__all__ = ["Finding", "format_report", "onboard"]

RTOL, ATOL = 1e-4, 1e-5  # float32 forward against the CPU (docs/precision.md)


@dataclasses.dataclass
class Finding:
    kind: str  # environment, migrate, divergence, recompilation, host-sync, fallback, error
    what: str
    where: str | None
    fix: str


class _Stop(BaseException):
    """Raised from an optimizer hook when enough steps ran (not an Exception: a script's
    ``except Exception`` does not swallow it)."""


def _tensors(value) -> list:
    return [v for v in torch.utils._pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def _random(module: torch.nn.Module) -> bool:
    return module.training and any(
        isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in module.modules()
    )


class _Watch:
    """The listeners of one onboarding run."""

    compare = True  # run each module's first forward again on the CPU

    def __init__(self, steps: int | None, warmup: int):
        from torch_pjrt.runtime import events

        self.events = events
        self.steps = steps  # optimizer steps to run (None: the whole script)
        self.warmup = warmup  # steps whose compilations are expected
        self.done = 0  # optimizer steps so far
        self.divergence: tuple | None = None  # (module, largest error, line)
        self.compared = 0
        self.skipped_random = 0
        self.recompilations: list[tuple[int, str, str]] = []  # (step, cause, line)
        self.syncs: collections.Counter = collections.Counter()  # line -> count (step >= 1)
        self.fallbacks: collections.Counter = collections.Counter()  # (op, line) -> count
        self.names: dict[int, str] = {}  # id(module) -> qualified name

    # --- events ---------------------------------------------------------------------
    def event(self, event: str, what: str) -> None:
        if event == "fallback":
            self.fallbacks[what, self.events.user_line()] += 1
        elif event == "host sync" and self.done >= 1:
            self.syncs[what] += 1
        elif event == "compilation" and self.done >= self.warmup:
            self.recompilations.append((self.done, what, self.events.user_line()))

    def step_hook(self, *_):
        self.done += 1
        if self.steps is not None and self.done >= self.steps:
            raise _Stop

    # --- numerics -------------------------------------------------------------------
    def forward_hook(self, module, args, kwargs, output):
        if self.done > 0:
            return
        for name, child in module.named_modules():  # (names: the outermost, which ends last)
            self.names[id(child)] = name or type(module).__name__
        if self.divergence is not None:
            return
        outs = _tensors(output)
        if not outs or not all(t.device.type == "pjrt" for t in outs):
            return
        if _random(module):
            self.skipped_random += 1
            return
        line = self.events.user_line()
        try:
            with torch.no_grad():
                expected = _tensors(
                    module_on_cpu(module)(*tree_on_cpu(args), **tree_on_cpu(kwargs))
                )
        except Exception:  # noqa: BLE001  (a module the CPU cannot run as is: not compared)
            return
        self.compared += 1
        worst = 0.0
        for got, want in zip(outs, expected):
            got = got.detach().cpu()
            if not (got.is_floating_point() or got.is_complex()):
                if not torch.equal(got, want):
                    worst = float("inf")
                continue
            wide = torch.complex128 if got.is_complex() else torch.float64
            diff = (got.to(wide) - want.to(wide)).abs()
            if bool((diff > ATOL + RTOL * want.to(wide).abs()).any()):
                worst = max(worst, float(diff.max()))
        if worst > 0:
            self.divergence = (module, worst, line)


def _run_script(script: str, args: list[str], watch: _Watch) -> str | None:
    """Run ``script`` as ``__main__`` with ``watch`` listening; returns the error that
    ended it (None: it ended, or enough steps ran)."""
    import traceback

    from torch.optim.optimizer import register_optimizer_step_post_hook

    events = watch.events
    events.listen(watch.event)
    hooks = [register_optimizer_step_post_hook(watch.step_hook)]
    if watch.compare:
        forward = torch.nn.modules.module.register_module_forward_hook
        hooks.append(forward(watch.forward_hook, with_kwargs=True))
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        with contextlib.redirect_stdout(sys.stderr):
            runpy.run_path(script, run_name="__main__")
    except _Stop:
        return None
    except SystemExit as exc:
        return None if exc.code in (None, 0) else f"the script exited with status {exc.code}"
    except Exception:  # noqa: BLE001  (the script's error: part of the report)
        return traceback.format_exc()
    finally:
        sys.argv, sys.path[:] = old_argv, old_path
        for h in hooks:
            h.remove()
        events.unlisten(watch.event)
    return None


def _recompilation_fix(cause: str) -> str:
    if "changed from" in cause and ("[" in cause or "shape" in cause):
        return (
            "an input's shape changes between steps: keep it fixed (DataLoader(drop_last=True), "
            "pad sequences to a few bucket lengths), or mark the dimension dynamic "
            "(torch._dynamo.mark_dynamic(x, dim)) under torch.compile (docs/compile.md)"
        )
    return (
        "something the program depends on changes between steps (a Python number, a dtype, "
        "a new code path): keep it the same each step, or pass it as a tensor "
        "(docs/metrics.md lists the causes)"
    )


def error_finding(error: str) -> Finding:
    """The finding of the traceback that ended a script, with the glossary's fix."""
    from torch_pjrt.diagnostics import glossary

    entries = glossary.explain(error)
    fix = entries[0].fix if entries else "read the traceback (`torch-pjrt explain` it)"
    return Finding("error", f"the script raised: {error.strip().splitlines()[-1]}", None, fix)


def fix_list(findings: list[Finding]) -> list[str]:
    """The findings' fixes, each once, with the kind and line it comes from."""
    fixes = []
    for f in findings:
        fix = f"{f.fix} [{f.kind}{', ' + f.where if f.where else ''}]"
        if fix not in fixes:
            fixes.append(fix)
    return fixes


def loop_findings(watch: _Watch) -> list[Finding]:
    """What strict mode stops on, found in a watched run: recompilations after the
    warm-up steps, host syncs after the first step and CPU fallbacks (each by line)."""
    findings = []
    for step, cause, line in watch.recompilations:
        findings.append(
            Finding(
                "recompilation",
                f"step {step + 1} (after the warm-up) compiled again: {cause}",
                line,
                _recompilation_fix(cause),
            )
        )
    for line, n in watch.syncs.most_common():
        findings.append(
            Finding(
                "host-sync",
                f"the host waits for the device {n} time(s) in steps 2-{watch.done} "
                "(.item(), .cpu(), printing or an `if` on a tensor)",
                line,
                "keep values on the device inside the loop (accumulate a tensor, read it "
                "every N steps), or read it after the loop (docs/metrics.md)",
            )
        )
    for (op, line), n in watch.fallbacks.most_common():
        findings.append(
            Finding(
                "fallback",
                f"{op} has no pjrt lowering and ran on the CPU ({n} time(s))",
                line,
                "replace the call with ops that have lowerings, or write a kernel for it "
                "(docs/fallback.md, docs/kernels.md)",
            )
        )
    return findings


def onboard(script: str, args: list[str] | None = None, *, steps: int = 4, platform=None):
    """Onboard ``script``: returns ``{"ok", "findings", "fixes", ...}`` (see the module
    doc). ``steps``: optimizer steps to run; compilations in the first
    ``settings.strict_warmup`` (2) are expected, later ones are recompilations."""
    from torch_pjrt import migrate
    from torch_pjrt.diagnostics.doctor import doctor

    if not os.path.isfile(script):
        raise FileNotFoundError(f"torch-pjrt onboard: no such script: {script}")
    findings: list[Finding] = []
    env = doctor(platform)
    if not env["ok"]:
        findings.append(
            Finding(
                "environment",
                f"torch-pjrt doctor failed: {env['error'] or 'the smoke test'}",
                None,
                "; ".join(env["hints"]) or "run `torch-pjrt doctor` and follow its hints",
            )
        )
    for f in migrate.migrate(script).findings:
        findings.append(Finding("migrate", f.what, f"{f.path}:{f.line}", f.proposal))

    warmup = settings.strict_warmup  # (as strict mode: the first steps compile)
    watch = _Watch(max(warmup + 1, steps), warmup)
    error = _run_script(script, list(args or []), watch)
    if error is not None:
        findings.append(error_finding(error))
    if watch.divergence is not None:
        module, worst, line = watch.divergence
        name = watch.names.get(id(module), type(module).__name__)
        findings.append(
            Finding(
                "divergence",
                f"module {name} ({type(module).__name__}) gives outputs up to {worst:.3g} away "
                f"from the CPU's (tolerance rtol={RTOL:g}, atol={ATOL:g}); it is the first "
                "module, in the order they finish, that differs",
                line,
                "run its ops in debug mode (TORCH_PJRT_MODE=debug, TORCH_PJRT_CHECK_NUMERICS=1) "
                "to find the op, and check its dtypes and matmul precision (docs/precision.md)",
            )
        )
    findings += loop_findings(watch)
    return {
        "script": script,
        "ok": not findings,
        "steps_run": watch.done,
        "modules_compared": watch.compared,
        "modules_skipped_random": watch.skipped_random,
        "platform": env.get("platform"),
        "findings": [dataclasses.asdict(f) for f in findings],
        "fixes": fix_list(findings),
    }


def format_report(report: dict) -> str:
    lines = [
        f"torch-pjrt onboard {report['script']}",
        f"  platform {report['platform']}; {report['steps_run']} optimizer step(s) run; "
        f"{report['modules_compared']} module outputs compared with the CPU "
        f"({report['modules_skipped_random']} skipped: dropout in training mode)",
    ]
    if report["ok"]:
        lines.append(
            "  nothing found: the program runs on pjrt as on the CPU, without "
            "recompilations, host syncs in the loop or CPU fallbacks"
        )
        return "\n".join(lines)
    lines.append("findings")
    for f in report["findings"]:
        where = f" ({f['where']})" if f["where"] else ""
        lines.append(f"  [{f['kind']}] {f['what']}{where}")
    lines.append("fixes")
    lines.extend(f"  {i}. {fix}" for i, fix in enumerate(report["fixes"], 1))
    return "\n".join(lines)
