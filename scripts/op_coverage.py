#!/usr/bin/env python
"""Which OpInfo ops run on pjrt: every op of PyTorch's op_db, CPU vs pjrt, fallback=error.

For each op of ``torch.testing._internal.common_methods_invocations.op_db`` this runs,
with the same sample generation and comparison as ``tests/test_ops.py``:

- the op's test dtype (float32, or the first dtype the op has of int64, int32, ...):
  every sample;
- float64, bfloat16, float16, int64, int32, uint8 and bool, where the op's CPU dtypes
  include them: the first 3 samples each;
- float32 gradients, for ops that support autograd: every sample (a random cotangent
  through ``torch.autograd.grad``, as ``tests/test_ops.py::test_grad`` does).

all in fused mode (the default), and the test dtype's first 3 samples and the first 2
gradient samples in eager mode too (the runs of ``tests/test_ops.py`` in each mode;
``make test`` runs one of the two per op);

- the op's OpInfo ``error_inputs`` (arguments ATen must refuse), for ops that have them,
  ``SKIP`` ones included: every sample the CPU refuses, in fused mode, under
  ``fallback="error"``, as ``tests/test_error_inputs.py``'s ``-all-fused`` case does, the
  message always checked (counts of samples raising the right type, and of those with a
  message matching OpInfo's regex);

and writes ``docs/op_coverage.md`` (summary and per-op table). Every run of an op (one
dtype, the gradients, the error inputs) has its own time limit of
``TORCH_PJRT_COVERAGE_TIMEOUT`` seconds (default 300). Usage::

    .venv/bin/python scripts/op_coverage.py                      # all ops, 2 processes
    .venv/bin/python scripts/op_coverage.py --ops 'add,nn.functional.*' --no-doc
    .venv/bin/python scripts/op_coverage.py --json out/coverage.json
    .venv/bin/python scripts/op_coverage.py --write-expectations # also rewrite the xfail tables
    .venv/bin/python scripts/op_coverage.py --print-expectations # print them instead
    .venv/bin/python scripts/op_coverage.py --dtypes '' --write-expectations  # xfails only, faster
    .venv/bin/python scripts/op_coverage.py --dtypes '' --no-error-inputs --write-expectations

``--write-expectations`` rewrites the GENERATED block of ``tests/expectations.py``
(XFAIL: ops failing within the first 3 samples of their test dtype in both modes;
XFAIL_EAGER and XFAIL_FUSED: in one mode only; XFAIL_EXHAUSTIVE: ops failing only on a
later sample, in fused mode; XFAIL_GRAD, XFAIL_GRAD_EAGER, XFAIL_GRAD_FUSED and
XFAIL_GRAD_EXHAUSTIVE the same for gradients, with ``make test``'s first 2 samples).
With ``--ops`` only the selected ops' entries change. The error inputs enter no generated
table (``XFAIL_ERROR_INPUTS`` and ``ERROR_MESSAGES`` are kept by hand); ``--no-error-inputs``
leaves them out.
"""

from __future__ import annotations

import os
import sys

# The environment of the test suite, before torch (which autoloads torch_pjrt) or JAX.
os.environ["JAX_PLATFORMS"] = "cpu"
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    ).strip()

import argparse  # noqa: E402
import concurrent.futures  # noqa: E402
import contextlib  # noqa: E402
import datetime  # noqa: E402
import fnmatch  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import torch_pjrt  # noqa: E402
from tests import expectations as E  # noqa: E402
from tests import test_error_inputs as EI  # noqa: E402
from tests import test_ops as T  # noqa: E402

DOC = ROOT / "docs" / "op_coverage.md"
EXPECTATIONS = ROOT / "tests" / "expectations.py"
COLUMNS = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
DTYPE_NAMES = {dtype: name for name, dtype in COLUMNS.items()}
TIMEOUT = float(os.environ.get("TORCH_PJRT_COVERAGE_TIMEOUT", "300"))


def _dtype_name(dtype) -> str:
    return DTYPE_NAMES.get(dtype) or str(dtype).removeprefix("torch.")


# --- running (in worker processes) ----------------------------------------------------


@contextlib.contextmanager
def _timed(entry: dict):
    """Record the wall and CPU seconds of the block in ``entry``."""
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        yield entry
    finally:
        entry["seconds"] = round(time.perf_counter() - start, 2)
        entry["cpu_seconds"] = round(time.process_time() - cpu_start, 2)


def _run(op, dtype, limit, shape_only, grad=False, mode=T.DEFAULT_MODE) -> dict:
    with _timed({"limit": limit}) as entry:
        try:
            with T.time_limit(TIMEOUT), torch_pjrt.mode(mode):
                if grad:
                    total, compared = T.check_grad(op, limit)
                else:
                    total, compared = T.check_op(op, dtype, limit, shape_only)
            entry.update(status="pass" if compared else "none", samples=total, compared=compared)
        except T.SampleFailure as exc:
            entry.update(status="fail", first_failure=exc.index, error=T.short_error(exc, 200))
        except T.OpTimeout as exc:
            entry.update(status="timeout", error=str(exc))
        except Exception as exc:  # sample generation itself failed
            entry.update(status="error", error=T.short_error(exc, 200))
    return entry


def _run_error_inputs(op) -> dict:
    """Every error input of ``op`` the CPU refuses, in fused mode, the message checked: the
    status is ``pass`` (each raises the right type with a matching message), ``type`` (the
    right type, some message differs), ``fail`` (one returns or raises another type; the
    first such is ``error``), ``none`` (the CPU refuses none), ``timeout`` or ``error``."""
    with _timed({"limit": None}) as entry:
        try:
            with T.time_limit(TIMEOUT):
                total, outcomes = EI.error_outcomes(op, T.DEFAULT_MODE)
        except T.OpTimeout as exc:
            entry.update(status="timeout", error=str(exc))
            return entry
        except Exception as exc:  # making the error inputs itself failed
            entry.update(status="error", error=T.short_error(exc, 200))
            return entry
        first = {verdict: line for verdict, line in reversed(outcomes)}  # each verdict's first line
        if "wrong" in first:
            status = "fail"
        else:
            status = "type" if "type" in first else "pass" if outcomes else "none"
        entry.update(
            status=status,
            samples=total,
            checked=len(outcomes),
            right_type=sum(verdict != "wrong" for verdict, _ in outcomes),
            matched=sum(verdict == "match" for verdict, _ in outcomes),
        )
        if "wrong" in first:
            entry["error"] = _reason(first["wrong"], 300)
        if "type" in first:
            entry["mismatch"] = _reason(first["type"], 300)
    return entry


def _nondeterministic(op, dtype) -> bool:
    """Whether the op's first sample gives different CPU results under two seeds."""
    try:
        cases = T.samples(op, dtype, 1)
        if not cases:
            return False
        s = cases[0]
        outs = []
        for seed in (1, 2):
            args, kwargs = T.cpu_copy([s.input, *s.args], dict(s.kwargs))
            torch.manual_seed(seed)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                outs.append(op(*args, **kwargs))
    except Exception:
        return False
    try:
        torch.testing.assert_close(outs[0], outs[1], atol=0, rtol=0, equal_nan=True)
    except (AssertionError, TypeError, ValueError):
        return True
    return False


def run_op(
    key: str, extra_dtypes=tuple(COLUMNS), grad: bool = True, error_inputs: bool = True
) -> dict:
    op = T.ops_by_key()[key]
    result = {"op": key, "runs": {}}
    if error_inputs and op.error_inputs_func is not None:
        # (SKIP ops too: their results are not comparable, their argument checks are)
        result["error_inputs"] = _run_error_inputs(op)
    if key in E.SKIP:
        result["skip"] = E.SKIP[key]
        return result
    shape_only = key in E.SHAPE_ONLY
    primary = T.dtype_for(op)
    result["test_dtype"] = _dtype_name(primary) if primary is not None else None
    supported = T.cpu_dtypes(op)
    if primary is not None:
        result["runs"][_dtype_name(primary)] = _run(op, primary, None, shape_only)
        result["eager"] = _run(op, primary, T.QUICK_SAMPLES, shape_only, mode="eager")
        if not shape_only:
            result["cpu_nondeterministic"] = _nondeterministic(op, primary)
    for name, dtype in COLUMNS.items():
        if name in extra_dtypes and dtype in supported and dtype != primary:
            result["runs"][name] = _run(op, dtype, T.QUICK_SAMPLES, shape_only)
    if grad and T.grad_eligible(op) and not shape_only:
        result["grad"] = _run(op, torch.float32, None, False, grad=True)
        result["grad_eager"] = _run(
            op, torch.float32, T.GRAD_SAMPLES, False, grad=True, mode="eager"
        )
    return result


# --- the report -----------------------------------------------------------------------


def _cell(run) -> str:
    if run is None:
        return ""
    return {
        "pass": "pass",
        "type": "type",
        "fail": "FAIL",
        "timeout": "TIMEOUT",
        "none": "-",
        "error": "ERROR",
    }[run["status"]]


def _first_error(result) -> str:
    runs = result["runs"]
    order = [result.get("test_dtype")] + [n for n in COLUMNS if n != result.get("test_dtype")]
    for name in [*order, "grad"]:
        run = result.get("grad") if name == "grad" else runs.get(name)
        if run and run["status"] in ("fail", "timeout", "error"):
            prefix = "" if name == result.get("test_dtype") else f"[{name}] "
            return prefix + _reason(run["error"], 80).replace("|", "\\|")
    run = result.get("error_inputs")
    if run and run["status"] in ("fail", "timeout", "error"):
        return _reason("error_inputs: " + run["error"], 80).replace("|", "\\|")
    return ""


def summarize(results) -> dict:
    tested = [r for r in results if "skip" not in r]
    f32 = [r for r in tested if "float32" in r["runs"]]
    f32_pass = [r for r in f32 if r["runs"]["float32"]["status"] in ("pass", "none")]
    primary_pass = [
        r
        for r in tested
        if r.get("test_dtype") and r["runs"][r["test_dtype"]]["status"] in ("pass", "none")
    ]
    per_dtype = {}
    for name in COLUMNS:
        runs = [r["runs"][name] for r in tested if name in r["runs"]]
        per_dtype[name] = {
            "pass": sum(run["status"] in ("pass", "none") for run in runs),
            "run": len(runs),
        }
    grads = [r["grad"] for r in tested if "grad" in r]
    return {
        "ops": len(results),
        "skipped": len(results) - len(tested),
        "grad_ops": len(grads),
        "grad_pass": sum(run["status"] in ("pass", "none") for run in grads),
        "grad_percent": round(
            100 * sum(run["status"] in ("pass", "none") for run in grads) / max(len(grads), 1), 1
        ),
        "float32_ops": len(f32),
        "float32_pass": len(f32_pass),
        "float32_percent": round(100 * len(f32_pass) / max(len(f32), 1), 1),
        "op_db_percent": round(100 * len(f32_pass) / max(len(results), 1), 1),
        "test_dtype_pass": len(primary_pass),
        "per_dtype": per_dtype,
        "error_inputs": _error_summary(results),
    }


def _error_summary(results) -> dict | None:
    """The error-input figures, per sample and per op (None for results without them)."""
    runs = [r["error_inputs"] for r in results if "error_inputs" in r]
    if not runs:
        return None
    status = [run["status"] for run in runs]
    return {
        "ops": len(runs),
        "ops_checked": sum(s != "none" for s in status),  # (timeouts and errors included)
        "ops_pass": status.count("pass"),
        "ops_type": status.count("type"),
        "ops_fail": status.count("fail"),
        "ops_timeout_or_error": status.count("timeout") + status.count("error"),
        "samples": sum(run.get("samples", 0) for run in runs),
        "checked": sum(run.get("checked", 0) for run in runs),
        "right_type": sum(run.get("right_type", 0) for run in runs),
        "matched": sum(run.get("matched", 0) for run in runs),
    }


def _error_line(e: dict, bold: str = "") -> str:
    """The summary line of the error inputs (``bold``: the markdown emphasis, if any)."""
    b = bold
    text = (
        "error inputs (OpInfo's `error_inputs`, every sample the CPU refuses, fused mode): "
        f"{b}{e['right_type']} / {e['checked']} samples{b} raise the right exception type, "
        f"{e['matched']} with the CPU's message; ops: {b}{e['ops_pass']} / {e['ops_checked']} "
        f"all right{b}, {e['ops_type']} more with the right types only"
    )
    if e["ops_timeout_or_error"]:
        text += f", {e['ops_timeout_or_error']} timed out or failed to make their samples"
    return (
        text + f"; the CPU accepts every error input of {e['ops'] - e['ops_checked']} of the "
        f"{e['ops']} ops that have them"
    )


def summary_text(s) -> str:
    lines = [
        f"op_db entries: {s['ops']} ({s['skipped']} skipped as not comparable, see SKIP)",
        f"ops passing all float32 samples: {s['float32_pass']} / {s['float32_ops']} "
        f"ops with float32 ({s['float32_percent']}%); {s['op_db_percent']}% of all op_db entries",
        f"ops passing every sample of their test dtype: {s['test_dtype_pass']} / "
        f"{s['ops'] - s['skipped']}",
        f"float32 gradients, all samples: {s['grad_pass']} / {s['grad_ops']} ops that "
        f"support autograd ({s['grad_percent']}%)",
        "per dtype (ops passing / ops run; float32 all samples, others the first "
        f"{T.QUICK_SAMPLES}):",
    ]
    for name, c in s["per_dtype"].items():
        pct = 100 * c["pass"] / max(c["run"], 1)
        lines.append(f"  {name:9} {c['pass']:4} / {c['run']:<4} ({pct:.1f}%)")
    if s.get("error_inputs"):
        lines.append(_error_line(s["error_inputs"]))
    return "\n".join(lines)


def write_doc(results, summary, meta, path: Path) -> None:
    s = summary
    out = [
        "# Op coverage: PyTorch's OpInfo database on pjrt",
        "",
        "Generated by `scripts/op_coverage.py` (do not edit by hand). Every entry of",
        "`torch.testing._internal.common_methods_invocations.op_db` runs on the CPU and on pjrt",
        '(`fallback="error"`, so nothing passes by running on the CPU) with the comparison of',
        "`tests/test_ops.py`: OpInfo's own tolerances; for bfloat16 and float16, a result that",
        "differs from the CPU's passes only if it is no further from the exact (float64)",
        "result than the CPU's is; for sort, argsort and topk without `stable=True`, indices",
        "that select equal values are equal (order among ties is unspecified).",
        "",
        f"- generated {meta['date']} with torch {meta['torch']}, jax {meta['jax']}",
        f"- wall time {meta['seconds']:.0f} s with {meta['jobs']} worker processes"
        f" on {meta['cpus']} CPU cores"
        + (
            f" ({meta['op_cpu_seconds']} CPU-seconds running ops)"
            if "op_cpu_seconds" in meta
            else ""
        )
        + "; the wall time depends on what else the machine runs",
        "",
        "## Summary",
        "",
        f"- ops passing **all float32 samples: {s['float32_pass']} / {s['float32_ops']}** "
        f"(**{s['float32_percent']}%** of the op_db entries that have float32; "
        f"{s['op_db_percent']}% of all {s['ops']} entries)",
        f"- ops passing every sample of their test dtype (float32, or the first of "
        f"int64, int32, ... the op has): {s['test_dtype_pass']} / {s['ops'] - s['skipped']}",
        f"- **float32 gradients: {s['grad_pass']} / {s['grad_ops']}** ops that support "
        f"autograd pass every sample (**{s['grad_percent']}%**; a random cotangent through "
        "`torch.autograd.grad`, column `grad`)",
        f"- skipped (not comparable, `SKIP` in tests/expectations.py): {s['skipped']}",
        *_mode_lines(results),
        *(
            [f"- {_error_line(s['error_inputs'], '**')}; column `error_inputs`"]
            if s.get("error_inputs")
            else []
        ),
        "",
        "| dtype | ops passing | ops run | samples |",
        "|---|---|---|---|",
    ]
    for name, c in s["per_dtype"].items():
        pct = 100 * c["pass"] / max(c["run"], 1)
        samples = "all" if name == "float32" else f"first {T.QUICK_SAMPLES}"
        out.append(f"| {name} | {c['pass']} ({pct:.1f}%) | {c['run']} | {samples} |")
    out += [
        "",
        "## Per op",
        "",
        "`pass`: every sample matches the CPU; `FAIL`: a sample raised or differed (first",
        "error shown, prefixed by its dtype when not the op's test dtype); `-`: every sample",
        "raised on the CPU too; empty: the op has no such CPU dtype (for `grad`: it does not",
        "support autograd). The test dtype (float32 unless noted) and `grad` run every",
        f"sample, the other dtypes the first {T.QUICK_SAMPLES}.",
        "",
        "`error_inputs`: OpInfo's error inputs (arguments ATen must refuse), every one the CPU",
        "refuses, in fused mode (`SKIP` ops too): `pass`: each raises the expected exception",
        "type with a message matching OpInfo's regex; `type`: each raises the right type, some",
        "with another message; `FAIL`: one returns or raises another type (the first such is",
        "the first error, prefixed `error_inputs:`, when no other run has one); `-`: the CPU",
        "accepts every one; empty: the op has none.",
        "",
        "| op | " + " | ".join(COLUMNS) + " | grad | error_inputs | first error |",
        "|---|" + "---|" * (len(COLUMNS) + 2) + "---|",
    ]
    for r in results:
        name = r["op"]
        errors = _cell(r.get("error_inputs"))
        if "skip" in r:
            skips = " | ".join("skip" for _ in range(len(COLUMNS) + 1))
            out.append(f"| {name} | {skips} | {errors} | {r['skip']} |")
            continue
        cells = [_cell(r["runs"].get(c)) for c in COLUMNS] + [_cell(r.get("grad")), errors]
        err = _first_error(r)
        td = r.get("test_dtype")
        if td and td != "float32":
            if td in COLUMNS:
                name += f" ({td})"
            else:
                extra = _cell(r["runs"][td])
                name += f" ({td}: {extra})"
        out.append(f"| {name} | " + " | ".join(cells) + f" | {err} |")
    flagged = [
        r["op"] for r in results if r.get("cpu_nondeterministic") and r["op"] not in E.SHAPE_ONLY
    ]
    if flagged:
        out += [
            "",
            "## CPU results that change with the seed",
            "",
            "These ops' first sample gave different CPU results under two seeds; if they",
            "draw random numbers they belong in `SKIP`:",
            "",
        ] + [f"- {k}" for k in flagged]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out) + "\n")


# --- the expectation tables -----------------------------------------------------------

BEGIN = "# --- BEGIN GENERATED (scripts/op_coverage.py --write-expectations) ---"
END = "# --- END GENERATED ---"


# the generated tables, in order: (name, which run, kind); a kind is "both" (fails the
# first samples in both modes), a mode (in that mode only) or "later" (fused, past them)
TABLES = (
    ("XFAIL", "runs", "both"),
    ("XFAIL_EXHAUSTIVE", "runs", "later"),
    ("XFAIL_EAGER", "runs", "eager"),
    ("XFAIL_FUSED", "runs", "fused"),
    ("XFAIL_GRAD", "grad", "both"),
    ("XFAIL_GRAD_EXHAUSTIVE", "grad", "later"),
    ("XFAIL_GRAD_EAGER", "grad", "eager"),
    ("XFAIL_GRAD_FUSED", "grad", "fused"),
)


def expectations(results) -> dict[str, dict]:
    """Fresh generated tables (:data:`TABLES`) by name, merged with the current ones for
    ops not run."""
    ran = {"runs": {r["op"] for r in results}, "grad": {r["op"] for r in results if "grad" in r}}
    tables = {
        name: {k: v for k, v in getattr(E, name).items() if k not in ran[run]}
        for name, run, _ in TABLES
    }
    for r in results:
        td = r.get("test_dtype")
        if "skip" in r or not td:
            continue
        for run, quick in (("runs", T.QUICK_SAMPLES), ("grad", T.GRAD_SAMPLES)):
            if run not in r:
                continue
            fused = r["runs"][td] if run == "runs" else r["grad"]
            eager = r.get("eager" if run == "runs" else "grad_eager")
            for kind, reason in _outcomes(fused, eager, quick):
                name = next(n for n, which, k in TABLES if which == run and k == kind)
                tables[name][r["op"]] = reason
    order = {k: i for i, k in enumerate(T.ops_by_key())}
    sort = lambda d: dict(sorted(d.items(), key=lambda kv: order.get(kv[0], 1 << 30)))  # noqa: E731
    return {name: sort(table) for name, table in tables.items()}


def _quick_failure(run: dict | None, quick: int) -> str | None:
    """The reason ``run`` fails within its first ``quick`` samples, else None."""
    if run is None:
        return None
    if run["status"] == "fail" and run["first_failure"] < quick:
        return _reason(run["error"])
    if run["status"] in ("timeout", "error"):
        return _reason(run["error"])
    return None


def _outcomes(fused: dict, eager: dict | None, quick: int) -> list[tuple[str, str]]:
    """(kind, reason) of each table an op's fused run (every sample) and eager run (the
    first ``quick``) enter: see :data:`TABLES`. Without an eager run (results of an older
    --json), eager is taken to agree with fused."""
    in_fused = _quick_failure(fused, quick)
    in_eager = in_fused if eager is None else _quick_failure(eager, quick)
    found = []
    if in_fused and in_eager:
        found.append(("both", in_fused))
    elif in_fused or in_eager:
        found.append(("fused", in_fused) if in_fused else ("eager", in_eager))
    if not in_fused and fused["status"] == "fail":
        found.append(("later", f"sample {fused['first_failure']}: {_reason(fused['error'])}"))
    return found


def _mode_lines(results) -> list[str]:
    """The doc's summary of eager against fused (empty for results without eager runs)."""
    pairs = [
        (r["op"], fused, r[eager])
        for r in results
        if "skip" not in r and r.get("test_dtype")
        for fused, eager in ((r["runs"][r["test_dtype"]], "eager"), (r.get("grad"), "grad_eager"))
        if eager in r
    ]
    if not pairs:
        return []
    differ = sorted({op for op, fused, eager in pairs if _differs(fused, eager)})
    return [
        f"- eager mode against fused (the first {T.QUICK_SAMPLES} samples of the test dtype "
        f"and the first {T.GRAD_SAMPLES} gradient samples): {len(differ)} ops differ"
        + (f" ({', '.join(differ)}; `XFAIL_EAGER` and `XFAIL_FUSED`)" if differ else "")
    ]


def _differs(fused: dict, eager: dict) -> bool:
    quick = eager["limit"]
    return (_quick_failure(fused, quick) is None) != (_quick_failure(eager, quick) is None)


def _reason(text: str, width: int = 100) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _dict_source(name: str, d: dict) -> str:
    if not d:
        return f"{name}: dict[str, str] = {{}}\n"
    body = "".join(f"    {k!r}: {v!r},\n" for k, v in d.items())
    return f"{name}: dict[str, str] = {{\n{body}}}\n"


def generated_block(tables: dict[str, dict]) -> str:
    body = "\n".join(_dict_source(name, tables[name]) for name, _, _ in TABLES)
    return f"{BEGIN}\n# fmt: off\n{body}# fmt: on\n{END}"


def write_expectations(block: str) -> None:
    text = EXPECTATIONS.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{EXPECTATIONS}: GENERATED markers not found")
    EXPECTATIONS.write_text(pattern.sub(lambda m: block, text))


# --- main -----------------------------------------------------------------------------


def select(patterns: str | None) -> list[str]:
    keys = list(T.ops_by_key())
    if not patterns:
        return keys
    wanted = [p.strip() for p in patterns.split(",") if p.strip()]
    chosen = [k for k in keys if any(k == p or fnmatch.fnmatchcase(k, p) for p in wanted)]
    if not chosen:
        raise SystemExit(f"--ops {patterns!r} matches no op_db entry")
    return chosen


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ops", help="comma-separated op keys or globs (name or name.variant)")
    p.add_argument(
        "--jobs",
        "-j",
        type=int,
        default=os.cpu_count() or 1,
        help="worker processes (default: CPU count)",
    )
    p.add_argument(
        "--dtypes",
        default=",".join(COLUMNS),
        help="dtypes checked besides the test dtype (default: all columns; '' for none)",
    )
    p.add_argument("--no-grad", action="store_true", help="skip the gradient runs")
    p.add_argument(
        "--no-error-inputs", action="store_true", help="skip the OpInfo error-input runs"
    )
    p.add_argument("--json", metavar="PATH", help="also write the raw results as JSON")
    p.add_argument(
        "--doc",
        metavar="PATH",
        default=None,
        help=f"markdown report (default {DOC.relative_to(ROOT)} for a full run)",
    )
    p.add_argument("--no-doc", action="store_true", help="write no markdown report")
    p.add_argument(
        "--write-expectations",
        action="store_true",
        help="rewrite the XFAIL tables of tests/expectations.py",
    )
    p.add_argument(
        "--print-expectations", action="store_true", help="print fresh XFAIL tables to stdout"
    )
    p.add_argument(
        "--from-json",
        metavar="PATH",
        help="reuse the results of an earlier --json run instead of running ops",
    )
    p.add_argument("--quiet", "-q", action="store_true")
    args = p.parse_args(argv)

    keys = select(args.ops)
    extra = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
    unknown = set(extra) - set(COLUMNS)
    if unknown:
        raise SystemExit(f"--dtypes: unknown {sorted(unknown)}; choose from {list(COLUMNS)}")
    work = functools.partial(
        run_op, extra_dtypes=extra, grad=not args.no_grad, error_inputs=not args.no_error_inputs
    )
    start = time.perf_counter()
    results: dict[str, dict] = {}
    jobs = max(1, min(args.jobs, len(keys)))

    def done(result):
        results[result["op"]] = result
        if not args.quiet:
            td = result.get("test_dtype")
            status = "skip" if "skip" in result else (result["runs"][td]["status"] if td else "n/a")
            print(f"[{len(results):4}/{len(keys)}] {status:7} {result['op']}", flush=True)

    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        for result in saved["results"]:
            if result["op"] in keys:
                results[result["op"]] = result
        keys = [k for k in keys if k in results]
    elif jobs == 1:
        for key in keys:
            done(work(key))
    else:
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
            for result in pool.map(work, keys, chunksize=1):
                done(result)
    seconds = time.perf_counter() - start
    if args.from_json:
        seconds = saved["meta"]["seconds"]
    ordered = [results[k] for k in keys]
    summary = summarize(ordered)

    import jax

    meta = (
        saved["meta"]
        if args.from_json
        else {
            "date": datetime.date.today().isoformat(),
            "torch": torch.__version__,
            "jax": jax.__version__,
            "seconds": seconds,
            "jobs": jobs,
            "cpus": os.cpu_count(),
            "op_cpu_seconds": round(
                sum(
                    run.get("cpu_seconds", 0)
                    for r in ordered
                    for run in [
                        *r["runs"].values(),
                        *(r.get(k, {}) for k in ("grad", "eager", "grad_eager", "error_inputs")),
                    ]
                )
            ),
            "ops_filter": args.ops,
        }
    )
    print(summary_text(summary))
    print(
        f"wall time: {seconds:.0f} s ({meta['jobs']} processes,"
        f" {meta.get('op_cpu_seconds', '?')} CPU-s in ops)"
    )
    doc = Path(args.doc) if args.doc else (None if args.ops else DOC)
    if doc is not None and not args.no_doc:
        write_doc(ordered, summary, meta, doc)
        print(f"wrote {doc}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps({"meta": meta, "summary": summary, "results": ordered}, indent=1)
        )
        print(f"wrote {args.json}")
    if args.write_expectations or args.print_expectations:
        block = generated_block(expectations(ordered))
        if args.print_expectations:
            print(block)
        if args.write_expectations:
            write_expectations(block)
            print(f"rewrote {EXPECTATIONS.relative_to(ROOT)}")
    flagged = [
        r["op"] for r in ordered if r.get("cpu_nondeterministic") and r["op"] not in E.SHAPE_ONLY
    ]
    if flagged:
        print("CPU results change with the seed (random? consider SKIP):", ", ".join(flagged))
    return 0


if __name__ == "__main__":
    sys.exit(main())
