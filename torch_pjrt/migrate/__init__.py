"""``torch-pjrt migrate``: find CUDA-only code and rewrite it to device-generic code.

Static analysis with libcst (nothing is imported or run). For each ``*.py`` file it
reports CUDA-only constructs (``torch.cuda.*``, ``"cuda"`` strings, ``.cuda()``, CUDA
autocast and GradScaler, cuDNN flags, the ``"nccl"`` backend, CUDA-only libraries, ...)
with the proposed change and its risk, and hardware lints (code that is slow on an XLA
device). ``apply=True`` rewrites the files in place to ``torch.accelerator``-based code
(see docs/migrating.md for each rewrite).

Example::

    >>> from torch_pjrt.migrate import analyze_source
    >>> findings, new = analyze_source("import torch\\ntorch.cuda.synchronize()\\n")
    >>> findings[0].what, findings[0].risk
    ('torch.cuda.synchronize', 'low')
    >>> print(new.splitlines()[-1])
    torch.get_device_module(_DEVICE).synchronize()
"""

from __future__ import annotations

import os

from torch_pjrt.migrate.files import MigrateError, python_files, read_source, write_atomic
from torch_pjrt.migrate.findings import FileResult, Finding, Report

__all__ = ["Finding", "FileResult", "Report", "MigrateError", "analyze_source", "migrate"]


def analyze_source(source: str | bytes, path: str = "<string>") -> tuple[list[Finding], str]:
    """The findings (CUDA constructs and lints) of one module's source, and its rewrite.

    Args:
        source: the module's text (``bytes`` keep the file's own encoding).
        path: the name findings carry.

    Returns:
        ``(findings, rewritten)``: findings in source order; the rewritten source, of the
        same type as ``source`` (equal to it when nothing is rewritten).

    Raises:
        MigrateError: ``source`` does not parse as Python.
    """
    import libcst as cst

    from torch_pjrt.migrate.lints import lint_module
    from torch_pjrt.migrate.rewrite import rewrite_module

    try:
        compile(source, path, "exec", dont_inherit=True)
        module = cst.parse_module(source)
    except (SyntaxError, ValueError, cst.ParserSyntaxError) as exc:
        where = f" (line {exc.lineno})" if getattr(exc, "lineno", None) else ""
        msg = getattr(exc, "msg", None) or str(exc).splitlines()[0]
        raise MigrateError(
            f"{path}: not valid Python{where}: {msg}; not analyzed, not rewritten. "
            "Fix the syntax error (does `python -m py_compile` accept it?) and run again."
        ) from None
    cuda, new = rewrite_module(module, path)
    findings = sorted([*cuda, *lint_module(module, path)], key=lambda f: (f.line, f.column))
    rewritten = new.bytes if isinstance(source, bytes) else new.code
    return findings, rewritten


def _migrate_file(path: str, apply: bool) -> FileResult:
    result = FileResult(path)
    try:
        data = read_source(path)
        findings, new = analyze_source(data, path)
        result.findings = findings
        if new == data:
            return result
        try:
            compile(new, path, "exec", dont_inherit=True)
        except SyntaxError as exc:
            raise MigrateError(
                f"{path}: the rewrite does not compile ({exc.msg}, line {exc.lineno}); "
                "the file is unchanged. Please report this as a torch-pjrt bug."
            ) from None
        result.would_change = True
        if apply:
            write_atomic(path, new)
            result.changed = True
    except MigrateError as exc:
        result.error = str(exc)
    return result


def migrate(path: str, *, apply: bool = False) -> Report:
    """Analyze ``path`` (a file, or a folder searched recursively for ``*.py``).

    Args:
        path: a Python file or a folder.
        apply: rewrite the files in place (atomically; files that do not parse, or whose
            rewrite would not compile, are left as they are).

    Returns:
        A :class:`Report`; files that could not be processed carry an ``error``.

    Raises:
        MigrateError: ``path`` does not exist or is neither a file nor a folder.
    """
    if not os.path.lexists(path):
        raise MigrateError(f"no such file or folder: {path}")
    if not os.path.exists(path):
        raise MigrateError(f"{path}: a symbolic link that leads nowhere (a loop, or a missing "
                           "target)")  # fmt: skip
    if not (os.path.isfile(path) or os.path.isdir(path)):
        raise MigrateError(f"{path}: neither a file nor a folder")
    files, notes = python_files(path)
    report = Report(root=path, applied=apply, notes=notes)
    report.files = [_migrate_file(f, apply) for f in files]
    return report
