#!/usr/bin/env python
"""Run the Hugging Face family suite and write ``docs/models.md`` from its results.

The suite is ``tests/test_hf_families.py`` (forward, loss gradients, one AdamW step per
family) and ``tests/test_hf_generate.py`` (greedy decoding against CPU, eager and
compiled, dynamic and static cache; seq2seq greedy; beam search; sampling), every case
(``--exhaustive``). This script runs them with pytest (``-n`` workers), reads pytest's
JUnit XML and writes the table. Usage::

    .venv/bin/python scripts/models_table.py              # about 20 min on 2 cores
    .venv/bin/python scripts/models_table.py --from-xml out/models.xml --no-run

Columns: forward (the main output and the loss within 1e-4), backward (every gradient,
then one AdamW step), generate (greedy tokens equal to CPU's, eager, dynamic and static
cache), compiled (the same under ``torch.compile(backend="pjrt")``). A cell is ``pass``,
``FAIL`` or ``xfail`` (a known failure listed in ``tests/expectations.py``, with its
reason in the notes); ``-`` where the case does not apply.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TEST_FILES = ["tests/test_hf_families.py", "tests/test_hf_generate.py"]


def run_suite(xml_path: pathlib.Path, workers: int) -> int:
    cmd = [sys.executable, "-m", "pytest", "-q", "--exhaustive", f"--junitxml={xml_path}"]
    if workers > 1:
        cmd += ["-n", str(workers)]
    print("running:", " ".join(cmd + TEST_FILES), flush=True)
    return subprocess.call(cmd + TEST_FILES, cwd=ROOT)


def outcomes(xml_path: pathlib.Path) -> dict[str, tuple[str, str]]:
    """test id (``test_name[param]``) -> (outcome, message)."""
    found = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        name = case.get("name")
        outcome, message = "pass", ""
        for child in case:
            tag = child.tag
            if tag in ("failure", "error"):
                outcome, message = "FAIL", child.get("message") or ""
            elif tag == "skipped":
                kind = child.get("type") or ""
                text = child.get("message") or ""
                outcome = "xfail" if "xfail" in kind or "xfail" in text else "skipped"
                message = text
        found[name] = (outcome, message)
    return found


def _stage(message: str) -> str:
    """Which check of test_family_matches_cpu failed, from its assertion message."""
    if "after AdamW step" in message:
        return "adamw"
    if re.search(r": grad of ", message):
        return "backward"
    return "forward"


def table(results: dict[str, tuple[str, str]]) -> tuple[list[dict], list[str]]:
    from tests import hf_families, test_hf_generate

    rows, extra = [], []
    for name in hf_families.FAMILIES:
        notes = []
        outcome, message = results.get(f"test_family_matches_cpu[{name}]", ("not run", ""))
        forward = backward = outcome
        if outcome == "FAIL":  # the checks run in order: later ones did not run
            stage = _stage(message)
            forward = "FAIL" if stage == "forward" else "pass"
            backward = "not run" if stage == "forward" else "FAIL"
            notes.append(f"{stage}: {(message.splitlines() or [''])[0][:120]}")
        generate, compiled = "-", "-"
        if name in test_hf_generate.DECODERS:
            generate = _combine(results, name, "eager", notes)
            compiled = _combine(results, name, "compiled", notes)
        elif name in test_hf_generate.SEQ2SEQ:
            generate, message = results.get(
                f"test_seq2seq_greedy_matches_cpu[{name}]", ("not run", "")
            )
            if generate == "FAIL":
                notes.append(f"generate: {(message.splitlines() or [''])[0][:120]}")
        rows.append(
            {
                "family": name,
                "forward": forward,
                "backward": backward,
                "generate": generate,
                "compiled": compiled,
                "notes": "; ".join(notes),
            }
        )
    for key, label in (
        ("test_beam_search_matches_cpu", "beam search (num_beams=3) equal to CPU"),
        ("test_sampling_reproducible", "sampling reproducible under a seed"),
        ("test_auto_compile_static_cache", "transformers' own compile path (CompileConfig)"),
    ):
        cases = {k: v for k, v in results.items() if k.split("[")[0] == key}
        if cases:
            status = sorted({v[0] for v in cases.values()})
            extra.append(f"- {label}: {', '.join(status)} ({', '.join(sorted(cases))})")
    return rows, extra


def _combine(results, name: str, mode: str, notes: list) -> str:
    """One cell for both caches of a decoder family in ``mode``."""
    from tests import expectations

    statuses = []
    for cache in ("dynamic", "static"):
        case = f"{name}-{cache}-{mode}"
        outcome, message = results.get(f"test_greedy_matches_cpu[{case}]", ("not run", ""))
        statuses.append(outcome)
        if outcome == "FAIL":
            notes.append(f"{cache} cache, {mode}: {(message.splitlines() or [''])[0][:120]}")
        elif outcome == "xfail":
            reason = expectations.XFAIL_HF_GENERATE.get(case, message)
            notes.append(f"{cache} cache, {mode}: {reason}")
    if all(s == "pass" for s in statuses):
        return "pass"
    return " / ".join(f"{c}: {s}" for c, s in zip(("dynamic", "static"), statuses))


def write_doc(rows: list[dict], extra: list[str], path: pathlib.Path) -> None:
    lines = [
        "# Hugging Face model families on pjrt",
        "",
        "Generated by `scripts/models_table.py` from `tests/test_hf_families.py` and",
        f"`tests/test_hf_generate.py` (every case), {datetime.date.today().isoformat()}, JAX's"
        " CPU platform.",
        "",
        "Each family is a tiny model built from a config (`tests/hf_families.py`: 2 layers,",
        "hidden size 32, random weights, no download). **forward**: the main output and the",
        "loss equal CPU's within 1e-4 (relative, and 1e-4 of the tensor's largest value",
        "absolute). **backward**: every parameter's gradient of the loss within 1e-4, then",
        "one `torch.optim.AdamW` step from the same gradients. **generate**: greedy",
        "decoding of 16 new tokens (a batch of 2, the second left-padded) gives CPU's tokens,",
        "eagerly, with the dynamic and the static cache. **compiled**: the same with the",
        'model\'s forward under `torch.compile(backend="pjrt")`, which must also not build',
        "a new program per token with the static cache. Every case runs with",
        '`fallback="error"`: no operator runs on the CPU.',
        "",
        "| family | forward | backward | generate | compiled | notes |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        notes = r["notes"].replace("|", "\\|")
        lines.append(
            f"| {r['family']} | {r['forward']} | {r['backward']} | {r['generate']} | "
            f"{r['compiled']} | {notes} |"
        )
    if extra:
        lines += ["", "Other generation checks:", "", *extra]
    lines += [
        "",
        "`make test` runs a few of these (gpt2, llama, bert, vit; greedy gpt2 eager and llama",
        "compiled with the static cache); this script runs them all.",
        "",
    ]
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--xml", type=pathlib.Path, default=ROOT / "out" / "models.xml")
    parser.add_argument("--no-run", action="store_true", help="only read --xml")
    parser.add_argument("-n", "--workers", type=int, default=2)
    parser.add_argument("--doc", type=pathlib.Path, default=ROOT / "docs" / "models.md")
    args = parser.parse_args(argv)
    if not args.no_run:
        args.xml.parent.mkdir(parents=True, exist_ok=True)
        run_suite(args.xml, args.workers)  # failures are reported in the table
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    rows, extra = table(outcomes(args.xml))
    write_doc(rows, extra, args.doc)
    print(f"wrote {args.doc}")
    for r in rows:
        print(f"  {r['family']:11} {r['forward']:6} {r['backward']:6} {r['generate']:24} "
              f"{r['compiled']:24} {r['notes'][:60]}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
