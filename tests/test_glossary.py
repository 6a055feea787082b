"""The error glossary (``torch-pjrt explain``): every message torch_pjrt raises on purpose
and every exception class it defines has an entry, each entry's doc exists, and real
errors, raised by the package and pasted as a whole traceback, find their entry.

The messages are read from the source (``raise X("...")`` and f-strings, their formatted
parts standing for anything; the helpers of ``WRAPPERS`` by the message they make). Not
checked, by design: errors raised in PyTorch's own words through ``registry.refusal`` and
``_helpers.check`` (the error CPU PyTorch gives for the same arguments), and the
exceptions that never leave the package (the control flow of ``INTERNAL``).
"""

from __future__ import annotations

import ast
import json
import pathlib
import re
import subprocess
import sys

import pytest

from torch_pjrt import cli
from torch_pjrt.diagnostics import glossary

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "torch_pjrt"

# exceptions caught inside the package, never seen by a user as such: what each steers
INTERNAL = {
    "NotBucketable": "compile/buckets.py: a graph's sizes cannot be padded; it runs as is",
    "Unfusable": "modes/fused.py: an argument cannot be recorded; the op runs at once",
    "declined": "ops/fallback.py: a lowering declines these arguments; the op takes the "
    "fallback road, whose own messages have their entries",
    "_Stop": "diagnostics/onboard.py: enough optimizer steps ran; the onboarding stops the script",
}


# helpers that make an error from something else than its message: the message they make
WRAPPERS = {
    "unsupported": lambda op: f"\"{op}_cpu\" not implemented for 'Bool'",
    "same_device_error": lambda a: (
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"{a} and cpu!"
    ),
}


def _literal(node) -> str | None:
    """A message's text, ``\\0`` for each formatted part (None: not a literal)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "\0" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal(node.left), _literal(node.right)
        if left is None and right is None:
            return None
        return (left or "\0") + (right or "\0")
    return None


def _name(node) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "?")


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text())


def raised_messages() -> list[tuple[str, str, str]]:
    """``(where, exception, sample message)`` for each literal message raised."""
    found = []
    for path, tree in _sources():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                continue
            cls = _name(node.exc.func)
            text = _literal(node.exc.args[0]) if node.exc.args else None
            if text is not None and cls in WRAPPERS:
                text = WRAPPERS[cls](text)
            if text is not None and cls not in INTERNAL:
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                found.append((where, cls, text.replace("\0", "X")))
    return found


def defined_exceptions() -> list[str]:
    """The exception classes torch_pjrt defines (but the internal ones)."""
    bases = ("Error", "Exception", "Missing", "Unsupported")
    builtin = {"Exception", "RuntimeError", "ValueError", "TypeError", "NotImplementedError"}
    names = []
    for _, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name not in INTERNAL:
                if any(_name(b).endswith(bases) or _name(b) in builtin for b in node.bases):
                    names.append(node.name)
    return names


def test_every_raised_message_has_an_entry():
    messages = raised_messages()
    assert len(messages) > 200  # (the scan sees the package)
    missing = [
        f"{where} {cls}: {text[:120]!r}"
        for where, cls, text in messages
        if not any(e.matches(text) > 1 for e in glossary.entries())
    ]
    assert not missing, "\n".join(missing)


def test_every_exception_class_has_an_entry():
    classes = defined_exceptions()
    assert {"StrictModeError", "PlatformError", "CaptureError"} <= set(classes)
    covered = {c for e in glossary.entries() for c in e.classes}
    assert set(classes) <= covered, set(classes) - covered


def test_entries_are_well_formed():
    entries = glossary.entries()
    ids = [e.id for e in entries]
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]
    for e in entries:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", e.id), e.id
        re.compile(e.pattern)
        assert (ROOT / e.doc.split("#")[0]).is_file(), (e.id, e.doc)
        assert all(len(t) > 15 for t in (e.meaning, e.cause, e.fix)), e.id
        # (a pattern that matches anything would explain every error)
        assert not e.matches("a wholly unrelated message about the weather"), e.id


def _traceback_of(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode != 0 and "Traceback" in done.stderr, done.stderr[-2000:]
    return done.stderr


REAL_ERRORS = {
    # a LiteRT conversion asked of something that is not a module
    "to_litert": "import torch_pjrt.export as e; e.to_litert(lambda t: t, (), 'x.tflite')",
    # a platform that is not there
    "platform": "import torch_pjrt; torch_pjrt.init(platform='tpu')",
    # strict mode refusing a CPU fallback (an op with no pjrt lowering)
    "strict": (
        "import torch, torch_pjrt\n"
        "with torch_pjrt.strict():\n"
        "    torch.hash_tensor(torch.ones(2, device='pjrt'))"
    ),
}


@pytest.mark.parametrize("case", sorted(REAL_ERRORS))
def test_a_real_traceback_finds_its_entry(case, capsys):
    text = _traceback_of(REAL_ERRORS[case])
    last = text.strip().splitlines()[-1]
    found = glossary.explain(text)
    assert found, last
    assert found[0].matches(last), (found[0].id, last)
    assert cli.main(["explain", text]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"[{found[0].id}]") and "fix " in out and found[0].doc in out
    assert cli.main(["explain", "--json", last]) == 0
    assert json.loads(capsys.readouterr().out)[0]["id"] == found[0].id


def test_unknown_text_is_said_so(capsys):
    assert cli.main(["explain", "a wholly unrelated message about the weather"]) == 1
    assert "no glossary entry matches" in capsys.readouterr().err
