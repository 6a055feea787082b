"""The error glossary: every error torch_pjrt raises on purpose, what it means, its usual
cause, the fix, and where the docs say more. ``torch-pjrt explain "<error or
traceback>"`` and :func:`explain` look an error up here.

An :class:`Entry` matches an error by a regular expression over its message (the
formatted parts of a message stand for anything), or by the name of one of torch_pjrt's
own exception classes. ``tests/test_glossary.py`` checks that every message the package
raises, and every exception class it defines, has an entry, and that each entry's doc
exists. The entries themselves are in ``glossary_entries.py``.
"""

from __future__ import annotations

import dataclasses
import re

__all__ = ["Entry", "entries", "explain", "format_entry"]


@dataclasses.dataclass(frozen=True)
class Entry:
    """One kind of error.

    Args:
        id: a short stable name (``"device-mismatch"``).
        pattern: a regular expression searched in the error's text (case-insensitive).
        meaning: what the error says, in plain words.
        cause: what usually leads to it.
        fix: what to do.
        doc: the doc that says more (``"docs/export.md"``, optionally ``#section``).
        classes: torch_pjrt exception classes whose every instance this entry explains.
    """

    id: str
    pattern: str
    meaning: str
    cause: str
    fix: str
    doc: str
    classes: tuple[str, ...] = ()

    def matches(self, text: str) -> int:
        """How well ``text`` matches: the length of the matched text (0: no match;
        a class name alone counts as a short match)."""
        found = _compiled(self.pattern).search(text)
        if found:
            return max(1, found.end() - found.start())
        if any(re.search(rf"\b{re.escape(c)}\b", text) for c in self.classes):
            return 1
        return 0


_cache: dict = {}


def _compiled(pattern: str) -> re.Pattern:
    found = _cache.get(pattern)
    if found is None:
        found = _cache[pattern] = re.compile(pattern, re.IGNORECASE | re.DOTALL)
    return found


def entries() -> tuple[Entry, ...]:
    """All entries."""
    from torch_pjrt.diagnostics.glossary_entries import ENTRIES

    return ENTRIES


def _error_lines(text: str) -> list[str]:
    """The part of ``text`` to look at first: the last exception line of a traceback
    (``SomeError: message`` and what follows it), else the whole text."""
    lines = text.strip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Warning)\b", lines[i]):
            return ["\n".join(lines[i:]), text]
    return [text]


def explain(text: str, limit: int = 3) -> list[Entry]:
    """The entries that explain ``text`` (an error message, or a whole traceback), best
    first: those matching the traceback's last error, by how much of it they match."""
    for part in _error_lines(text):
        scored = [(e.matches(part), i, e) for i, e in enumerate(entries())]
        found = sorted(((-s, i, e) for s, i, e in scored if s), key=lambda t: t[:2])
        if found:
            return [e for _, _, e in found[:limit]]
    return []


def format_entry(entry: Entry) -> str:
    """An entry as text, for the terminal."""
    return "\n".join(
        [
            f"[{entry.id}]",
            f"  what it means  {entry.meaning}",
            f"  usual cause    {entry.cause}",
            f"  fix            {entry.fix}",
            f"  docs           {entry.doc}",
        ]
    )
