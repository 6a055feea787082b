"""What ``torch-pjrt migrate`` reports: one :class:`Finding` per construct, per file a
:class:`FileResult`, for the whole run a :class:`Report`."""

from __future__ import annotations

import dataclasses

__all__ = ["RISKS", "Finding", "FileResult", "Report"]

# low: the rewrite (or keeping the code) does what the CUDA code did.
# medium: it runs, but something differs (what it reports, what it seeds); the note says what.
# high: CUDA-only code that needs a hand-written replacement; never rewritten.
RISKS = ("low", "medium", "high")


@dataclasses.dataclass(frozen=True)
class Finding:
    """One construct found in a file.

    ``category`` is ``"cuda"`` (CUDA-only code, rewritten by ``--apply`` when
    ``rewritten``) or ``"lint"`` (code that is slow on an XLA device; never rewritten).
    """

    path: str
    line: int
    column: int
    kind: str
    what: str
    proposal: str
    risk: str
    category: str = "cuda"
    rewritten: bool = False

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class FileResult:
    """The outcome for one file: findings, or the error that stopped its analysis."""

    path: str
    findings: list[Finding] = dataclasses.field(default_factory=list)
    error: str | None = None
    changed: bool = False  # --apply wrote a new version
    would_change: bool = False  # the rewrite differs from the file (--apply would write it)


@dataclasses.dataclass
class Report:
    """Everything one ``torch-pjrt migrate`` run found and did."""

    root: str
    applied: bool
    files: list[FileResult] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def findings(self) -> list[Finding]:
        return [f for r in self.files for f in r.findings]

    @property
    def errors(self) -> list[FileResult]:
        return [r for r in self.files if r.error is not None]

    def as_dict(self) -> dict:
        counts = {risk: 0 for risk in RISKS}
        for f in self.findings:
            counts[f.risk] += 1
        return {
            "root": self.root,
            "applied": self.applied,
            "files_scanned": len(self.files),
            "files_changed": sum(r.changed for r in self.files),
            "files_to_change": sum(r.would_change for r in self.files),
            "findings": [f.as_dict() for f in self.findings],
            "errors": [{"path": r.path, "error": r.error} for r in self.errors],
            "notes": list(self.notes),
            "totals": counts,
        }
