"""The ``torch-pjrt migrate`` report: text for the terminal, JSON or Markdown for a file."""

from __future__ import annotations

import json
import os

from torch_pjrt.migrate.findings import Finding, Report

__all__ = ["format_text", "format_markdown", "write_report"]


def _action(f: Finding, applied: bool) -> str:
    if f.category == "lint":
        return "why/fix"
    if f.proposal.startswith("kept"):
        return "keep"
    if not f.rewritten:
        return "manual"
    return "rewritten" if applied else "rewrite"


def _summary(report: Report) -> str:
    d = report.as_dict()
    t = d["totals"]
    n = len(report.findings)
    lints = sum(f.category == "lint" for f in report.findings)
    line = (
        f"{d['files_scanned']} file(s), {n} finding(s) ({n - lints} CUDA, {lints} lint; "
        f"{t['high']} high, {t['medium']} medium, {t['low']} low risk)"
    )
    if report.applied:
        line += f"; {d['files_changed']} file(s) rewritten"
    elif d["files_to_change"]:
        line += f"; {d['files_to_change']} file(s) to rewrite (run with --apply)"
    if d["errors"]:
        line += f"; {len(d['errors'])} file(s) could not be processed"
    return line


def format_text(report: Report) -> str:
    """One block per finding (``file:line:col  risk  kind  what``, then the change)."""
    lines = [f"torch-pjrt migrate {report.root}"]
    for f in report.findings:
        lines.append(f"{f.path}:{f.line}:{f.column}  {f.risk:<6}  {f.kind:<17} {f.what}")
        action = _action(f, report.applied)
        lines.append(f"    {f.proposal}" if action == "keep" else f"    {action}: {f.proposal}")
    for r in report.errors:
        lines.append(f"error: {r.error}")
    for note in report.notes:
        lines.append(f"note: {note}")
    lines.append(_summary(report))
    return "\n".join(lines)


def format_markdown(report: Report) -> str:
    """A Markdown table of the findings."""
    rows = [
        f"# torch-pjrt migrate `{report.root}`",
        "",
        _summary(report),
        "",
        "| where | risk | kind | what | change |",
        "|---|---|---|---|---|",
    ]
    for f in report.findings:
        cells = [
            f"{f.path}:{f.line}",
            f.risk,
            f.kind,
            f"`{f.what}`",
            f"{_action(f, report.applied)}: {f.proposal}",
        ]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    for r in report.errors:
        rows.append(f"\n- error: {r.error}")
    for note in report.notes:
        rows.append(f"\n- note: {note}")
    return "\n".join(rows) + "\n"


def write_report(report: Report, path: str) -> None:
    """Write ``report`` as Markdown when ``path`` ends in ``.md``, else as JSON."""
    text = (
        format_markdown(report)
        if path.endswith(".md")
        else json.dumps(report.as_dict(), indent=2) + "\n"
    )
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
