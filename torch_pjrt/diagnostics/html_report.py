"""``torch-pjrt report``: run a program and write one HTML page of what the device did.

:func:`report` runs a script as ``__main__`` (as ``torch-pjrt onboard`` does, without
the CPU comparison), recording:

- each optimizer step's end (its time, the counters, the device memory in use);
- each compilation (when, in which step, its cause, the user's line, its seconds);
- each XLA program run (``runtime.executor.record_runs``): the report waits for each
  program to finish before the script goes on, so that each program's time is its own,
  device time included (host and device work do not overlap in this run: step times
  are those of that run);
- the counters of ``torch_pjrt.metrics``, from the script's start to its end.

It writes one self-contained HTML file (plots from matplotlib, inline SVG; no script,
no outside resource): step time over the run with the compilations on the same axis,
host syncs by line, CPU fallbacks by op, bytes moved per step, device memory over the
run and per program (XLA's memory analysis of the ten costliest programs), the ten
costliest programs, and what strict mode would stop on, with fixes. Every figure in
the summary is the difference of ``metrics.as_dict()`` between the script's start and
its end (in a fresh process: ``as_dict()`` itself); the page also holds them as JSON
(``<script type="application/json" id="metrics">``). docs/diagnostics.md shows one.
"""

from __future__ import annotations

import dataclasses
import datetime
import html
import io
import json
import os
import statistics
import time

from torch_pjrt.config import settings
from torch_pjrt.diagnostics.onboard import (
    Finding,
    _run_script,
    _Watch,
    error_finding,
    fix_list,
    loop_findings,
)

__all__ = ["report"]

TOP = 10  # programs in the costliest table and the memory-per-program plot


@dataclasses.dataclass
class _Runs:
    """The runs of one program (by its name in profiler traces)."""

    scope: str
    ops: str
    calls: int = 0
    timed: int = 0  # runs that did not compile (their time is the program's alone)
    seconds: float = 0.0  # of the timed runs
    first: float = 0.0  # the first run's time, compilation included
    keys: dict = dataclasses.field(default_factory=dict)  # key -> [runs, program, specs]

    @property
    def mean(self) -> float | None:
        return self.seconds / self.timed if self.timed else None

    @property
    def cost(self) -> float | None:
        """Seconds the program's runs took, device time included: its mean run times its
        runs (None when every run compiled: the time of such a run is counted in the
        compilation's seconds, as in ``metrics``)."""
        return None if self.mean is None else self.mean * self.calls


def _counters() -> dict:
    """The counters the per-step plots read."""
    from torch_pjrt.runtime import events

    d = events.as_dict()
    return {
        "compilations": d["compilations"],
        "compile_seconds": events.compile_seconds(),
        "host_syncs": d["host_syncs"],
        "bytes_to_device": d.get("bytes_to_device", 0),
        "bytes_to_host": d.get("bytes_to_host", 0),
        "fallbacks": sum(d["fallbacks"].values()),
    }


def _memory() -> dict[int, int]:
    """Bytes in use per device (arrays made so far: work recorded in fused mode and not
    started yet is not counted)."""
    from torch_pjrt import runtime
    from torch_pjrt.runtime import properties

    return {
        i: properties.memory_stats(runtime.device(i))["allocated_bytes.all.current"]
        for i in range(runtime.device_count())
    }


def _spec(value):
    import jax

    if isinstance(value, jax.Array):
        return jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=value.sharding)
    return value


class _Timeline(_Watch):
    """The listeners of one report run."""

    compare = False

    def __init__(self, steps: int | None):
        super().__init__(steps, settings.strict_warmup)
        self.start = time.perf_counter()
        self.steps_at: list[float] = []  # each optimizer step's end, seconds from the start
        self.counters = [_counters()]  # at the start, then at each step's end
        self.memory = [(0.0, _memory())]  # (seconds from the start, bytes per device)
        self.compiles: list[dict] = []
        self.programs: dict[str, _Runs] = {}

    def now(self) -> float:
        return time.perf_counter() - self.start

    def event(self, event: str, what: str) -> None:
        super().event(event, what)
        if event == "compilation":  # (told before it is counted: its seconds come later)
            self.compiles.append(
                {
                    "at": self.now(),
                    "step": self.done + 1,
                    "cause": what,
                    "line": self.events.user_line(),
                    "before": self.events.compile_seconds(),
                }
            )

    def step_hook(self, *args):
        self.steps_at.append(self.now())
        self.counters.append(_counters())
        self.memory.append((self.steps_at[-1], _memory()))
        super().step_hook(*args)  # (last: it ends the run after the steps asked for)

    def run(self, program, key, jitted, args):
        """``executor.record_runs``' hook: the program's run, waited for and timed."""
        import jax

        label, attributes = program.profile_entry(key)
        runs = self.programs.get(label)
        if runs is None:
            runs = self.programs[label] = _Runs(program.scope, attributes["ops"])
        seen = runs.keys.get(key)
        if seen is None:  # (before the call: it may donate its inputs)
            seen = runs.keys[key] = [0, program, jax.tree.map(_spec, args)]
        began = time.perf_counter()
        out = jitted(*args)
        jax.block_until_ready(out)
        seconds = time.perf_counter() - began
        runs.calls += 1
        seen[0] += 1
        if runs.calls == 1:
            runs.first = seconds
        if program.traced is None:  # (not traced: no compilation in this run)
            runs.timed += 1
            runs.seconds += seconds
        return out

    def finish(self) -> None:
        """The compilations' seconds (each one's is what the total gained until the
        next), and the memory at the end."""
        ends = [c["before"] for c in self.compiles[1:]] + [self.events.compile_seconds()]
        for c, end in zip(self.compiles, ends):
            c["seconds"] = round(end - c.pop("before"), 6)
        self.memory.append((self.now(), _memory()))


def _delta(before: dict, after: dict) -> dict:
    """``after - before`` for ``metrics.as_dict()``'s counters and tables (entries that
    did not change are left out of the tables)."""
    out = {}
    for name, value in after.items():
        old = before.get(name)
        if isinstance(value, dict):
            old = old or {}
            changed = {k: v - old.get(k, 0) for k, v in value.items()}
            out[name] = {
                k: round(v, 6) if isinstance(v, float) else v for k, v in changed.items() if v
            }
        else:
            change = value - (old or 0)
            out[name] = round(change, 6) if isinstance(change, float) else change
    return out


def _analyse(programs: dict[str, _Runs]) -> list[dict]:
    """The ten costliest programs, with XLA's memory and cost analysis of the shapes
    they ran most often."""
    top = sorted(programs.items(), key=lambda kv: (-(kv[1].cost or 0.0), -kv[1].first))[:TOP]
    rows = []
    for label, runs in top:
        key, (_, program, specs) = max(runs.keys.items(), key=lambda kv: kv[1][0])
        try:
            analysis = program.analysis(key, *specs)
        except Exception as exc:  # noqa: BLE001  (shown in the table, not fatal)
            analysis = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        rows.append(
            {
                "program": label,
                "scope": runs.scope,
                "ops": runs.ops,
                "runs": runs.calls,
                "timed_runs": runs.timed,
                "mean_ms": None if runs.mean is None else round(runs.mean * 1e3, 4),
                "total_ms": None if runs.cost is None else round(runs.cost * 1e3, 4),
                **analysis,
            }
        )
    return rows


def report(script, args=None, *, out="report.html", steps=None, platform=None) -> dict:
    """Run ``script`` (with ``args`` as its command line) and write the report to
    ``out``; returns what it shows as a dict (``"out"``, ``"metrics"``, ``"programs"``,
    ``"findings"``, ``"fixes"``, ``"error"``...). ``steps``: stop after that many
    optimizer steps (None: run the script to its end); ``platform``: the PJRT platform
    (as ``torch-pjrt run --platform``). The report is written when the script fails
    too, with its error."""
    from torch_pjrt import runtime
    from torch_pjrt.runtime import events, executor

    script = os.fspath(script)
    if not os.path.isfile(script):
        raise FileNotFoundError(f"torch-pjrt report: no such script: {script}")
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise ValueError(f"torch-pjrt report: steps must be a positive int, got {steps!r}")
    out = os.fspath(out)
    _check_writable(out)
    runtime.init(platform=platform)
    before = events.as_dict()
    timeline = _Timeline(steps)
    previous = executor.record_runs(timeline.run)
    try:
        error = _run_script(script, list(args or []), timeline)
    finally:
        executor.record_runs(previous)
    timeline.finish()
    metrics = _delta(before, events.as_dict())
    programs = _analyse(timeline.programs)
    findings = loop_findings(timeline)
    if error is not None:
        findings.insert(0, error_finding(error))
    result = {
        "script": script,
        "args": list(args or []),
        "out": os.path.abspath(out),
        "platform": runtime.current_platform(),
        "devices": runtime.device_count(),
        "steps_run": timeline.done,
        "seconds": round(timeline.now(), 3),
        "error": error,
        "metrics": metrics,
        "steps": _steps(timeline),
        "compilations": timeline.compiles,
        "memory": [{"at": round(t, 4), "bytes": b} for t, b in timeline.memory],
        "programs": programs,
        "findings": [dataclasses.asdict(f) for f in findings],
        "fixes": fix_list(findings),
    }
    page = _page(result, findings)
    temporary = f"{out}.tmp{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as f:
        f.write(page)
    os.replace(temporary, out)
    return result


def _check_writable(out: str) -> None:
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"torch-pjrt report: no such folder for --out: {folder}")
    if os.path.isdir(out):
        raise IsADirectoryError(f"torch-pjrt report: --out is a folder, not a file: {out}")
    if not os.access(folder, os.W_OK):
        raise PermissionError(f"torch-pjrt report: cannot write in {folder}")


def _steps(timeline: _Timeline) -> list[dict]:
    """Per optimizer step: when it ended, how long it took (step 1: from the script's
    start), and what the counters gained in it."""
    rows, last = [], 0.0
    for i, at in enumerate(timeline.steps_at):
        a, b = timeline.counters[i], timeline.counters[i + 1]
        row = {"step": i + 1, "end": round(at, 4), "seconds": round(at - last, 6)}
        row.update({k: round(b[k] - a[k], 6) for k in b})
        rows.append(row)
        last = at
    return rows


# --- the page ---------------------------------------------------------------------------

_BLUE, _ORANGE, _GREEN, _RED, _GREY = "#3b6fb6", "#e8833a", "#4c9a5a", "#c8423b", "#888888"


def _figure(height=3.0):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9.5, height), layout="constrained")
    return figure, figure.subplots()


def _svg(figure) -> str:
    """The figure as an inline ``<svg>`` element."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _bytes(n) -> str:
    n = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else "..." + text[-(width - 3) :]


def _barh(labels, values, color, xlabel, height=None):
    figure, axes = _figure(height or max(1.6, 0.32 * len(labels) + 0.9))
    positions = list(range(len(labels)))[::-1]
    axes.barh(positions, values, color=color)
    axes.set_yticks(positions, [_short(label) for label in labels], fontsize=8)
    axes.set_xlabel(xlabel)
    for p, v in zip(positions, values):
        axes.annotate(f" {v:g}", (v, p), va="center", fontsize=8)
    axes.margins(x=0.12)
    return figure


def _plot_steps(result) -> str:
    """Step times (ms) at each step's end, compilations on the same time axis."""
    figure, axes = _figure(3.4)
    steps = result["steps"]
    if steps:
        axes.plot(
            [s["end"] for s in steps],
            [s["seconds"] * 1e3 for s in steps],
            marker="o",
            color=_BLUE,
            label="step time (ms)",
        )
        times = [s["seconds"] for s in steps]
        if max(times) > 20 * min(times):  # (the first steps compile: a log scale keeps the rest)
            axes.set_yscale("log")
        axes.set_ylabel("step time (ms)")
    for n, c in enumerate(result["compilations"], 1):
        axes.axvline(c["at"], color=_ORANGE, linestyle="--", linewidth=1)
        axes.annotate(
            str(n), (c["at"], 1.0), xycoords=("data", "axes fraction"), color=_ORANGE,
            fontsize=7, ha="center", va="bottom",
        )  # fmt: skip
    axes.plot([], [], color=_ORANGE, linestyle="--", label="compilation (numbered below)")
    axes.set_xlabel("seconds since the script started")
    axes.legend(loc="upper right", fontsize=8)
    return _svg(figure)


def _plot_bytes(result) -> str:
    steps = result["steps"]
    figure, axes = _figure(2.8)
    x = [s["step"] for s in steps]
    to_device = [s["bytes_to_device"] / 1024 for s in steps]
    to_host = [s["bytes_to_host"] / 1024 for s in steps]
    axes.bar(x, to_device, color=_BLUE, label="to the device")
    axes.bar(x, to_host, bottom=to_device, color=_GREEN, label="to the host")
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("KiB moved")
    axes.legend(fontsize=8)
    return _svg(figure)


def _plot_memory(result) -> str:
    figure, axes = _figure(2.8)
    points = result["memory"]
    for index in sorted({i for p in points for i in p["bytes"]}):
        axes.plot(
            [p["at"] for p in points],
            [p["bytes"].get(index, 0) / 2**20 for p in points],
            marker=".",
            label=f"pjrt:{index}",
        )
    axes.set_xlabel("seconds since the script started (samples: start, each step, end)")
    axes.set_ylabel("MiB in use")
    axes.legend(fontsize=8)
    return _svg(figure)


def _plot_program_memory(rows) -> str:
    rows = [r for r in rows if r.get("arguments") is not None]
    figure, axes = _figure(max(1.6, 0.32 * len(rows) + 1.1))
    positions = list(range(len(rows)))[::-1]
    left = [0.0] * len(rows)
    for part, color in (
        ("arguments", _BLUE), ("outputs", _GREEN), ("temporaries", _ORANGE), ("code", _GREY),
    ):  # fmt: skip
        values = [(r[part] or 0) / 1024 for r in rows]
        axes.barh(positions, values, left=left, color=color, label=part)
        left = [a + b for a, b in zip(left, values)]
    axes.set_yticks(positions, [_short(r["program"], 48) for r in rows], fontsize=8)
    axes.set_xlabel("KiB (XLA's memory analysis)")
    axes.legend(fontsize=8, loc="lower right")
    return _svg(figure)


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1100px;
color:#222;padding:0 16px}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:32px;border-bottom:1px solid #ddd;
padding-bottom:4px}.sub{color:#555;font-size:13px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:16px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:120px}
.card .v{font-size:20px;font-weight:600}.card .k{font-size:12px;color:#555}
table{border-collapse:collapse;font-size:12.5px;margin:8px 0;width:100%}
td,th{border-bottom:1px solid #eee;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f6f6f6}td.n{text-align:right;font-variant-numeric:tabular-nums}
code{font-size:12px}.none{color:#4c9a5a}.error{color:#c8423b;white-space:pre-wrap;font-size:12px}
svg{max-width:100%;height:auto}
"""


def _table(headers, rows, numeric=()) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for i, value in enumerate(row):
            text = "" if value is None else html.escape(str(value))
            cells.append(f'<td class="n">{text}</td>' if i in numeric else f"<td>{text}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _counted(table: dict, what: str, counted: str, color: str, none: str) -> list[str]:
    """A table of counts (host syncs by line, fallbacks by op): its 15 largest as bars,
    then all of them, largest first; ``none`` when it is empty."""
    rows = sorted(table.items(), key=lambda kv: -kv[1])
    if not rows:
        return [f"<p class='none'>{none}</p>"]
    top = rows[:15]
    bars = _barh([k for k, _ in top], [v for _, v in top], color, counted)
    return [_svg(bars), _table([what, counted], rows, numeric=(1,))]


def _arguments(args: list[str]) -> str:
    return f"arguments <code>{html.escape(' '.join(args))}</code> &middot; " if args else ""


def _card(label, value, metric=None, shown=None) -> str:
    attribute = f' data-metric="{metric}" data-value="{value}"' if metric else ""
    text = html.escape(str(value if shown is None else shown))
    value_div, label_div = f'<div class="v">{text}</div>', f'<div class="k">{label}</div>'
    return f'<div class="card"{attribute}>{value_div}{label_div}</div>'


def _page(result, findings: list[Finding]) -> str:
    from torch_pjrt._version import __version__
    from torch_pjrt.runtime import events

    m = result["metrics"]
    steps = result["steps"]
    after_warmup = [s["seconds"] for s in steps[settings.strict_warmup :]] or [
        s["seconds"] for s in steps
    ]
    median = f"{statistics.median(after_warmup) * 1e3:.2f} ms" if after_warmup else "n/a"
    fallbacks = sum(m["fallbacks"].values())
    cards = [
        _card("optimizer steps", result["steps_run"], "steps_run"),
        _card("seconds in all", result["seconds"]),
        _card(f"median step (after step {settings.strict_warmup})", median),
        _card("compilations", m["compilations"], "compilations"),
        _card("seconds compiling", round(events.compile_seconds(m), 3), "compile_seconds"),
        _card("host syncs", m["host_syncs"], "host_syncs"),
        _card("transfers to device", m["transfers_to_device"], "transfers_to_device"),
        _card("bytes to device", m.get("bytes_to_device", 0), "bytes_to_device",
              _bytes(m.get("bytes_to_device", 0))),
        _card("transfers to host", m["transfers_to_host"], "transfers_to_host"),
        _card("bytes to host", m.get("bytes_to_host", 0), "bytes_to_host",
              _bytes(m.get("bytes_to_host", 0))),
        _card("CPU fallbacks", fallbacks, "fallbacks"),
    ]  # fmt: skip
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>torch-pjrt report: {html.escape(os.path.basename(result['script']))}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>torch-pjrt report: {html.escape(result['script'])}</h1>",
        f"<div class='sub'>{_arguments(result['args'])}platform "
        f"{html.escape(result['platform'])}, {result['devices']} device(s) &middot; torch_pjrt "
        f"{__version__} &middot; {datetime.datetime.now().isoformat(timespec='seconds')} "
        "&middot; each program was waited for before the next: program times are their own, "
        "step times those of that run</div>",
        f"<div class='cards'>{''.join(cards)}</div>",
    ]
    if result["error"]:
        parts.append(
            f"<h2>The script failed</h2><div class='error'>{html.escape(result['error'])}</div>"
        )

    parts.append("<h2 id='steps'>Step time and compilations</h2>")
    parts.append(_plot_steps(result))
    if not steps:
        parts.append("<p>No optimizer step ran: the step times need a training loop.</p>")
    if result["compilations"]:
        parts.append(
            _table(
                ["#", "at (s)", "step", "seconds", "cause", "line"],
                [
                    (n, f"{c['at']:.3f}", c["step"], f"{c['seconds']:.4f}", c["cause"], c["line"])
                    for n, c in enumerate(result["compilations"], 1)
                ],
                numeric=(0, 1, 2, 3),
            )
        )
    parts.append(
        f"<p>{m['compilations']} compilation(s), {events.compile_seconds(m):.3f} s compiling</p>"
    )

    parts.append("<h2 id='syncs'>Host syncs by source line</h2>")
    parts += _counted(m["host_syncs_by_line"], "line", "host syncs", _BLUE,
                      "None: the host never waited for the device.")  # fmt: skip
    parts.append("<h2 id='fallbacks'>CPU fallbacks by op</h2>")
    parts += _counted(m["fallbacks"], "op", "runs on the CPU", _RED,
                      "None: every op ran on the device.")  # fmt: skip

    parts.append("<h2 id='bytes'>Bytes moved</h2>")
    parts.append(
        f"<p>To the device: {m['transfers_to_device']} transfer(s), "
        f"{_bytes(m.get('bytes_to_device', 0))}; to the host: {m['transfers_to_host']} "
        f"transfer(s), {_bytes(m.get('bytes_to_host', 0))}.</p>"
    )
    if steps:
        parts.append(_plot_bytes(result))

    parts.append("<h2 id='memory'>Device memory</h2>")
    parts.append(_plot_memory(result))
    programs = result["programs"]
    if any(r.get("arguments") is not None for r in programs):
        parts.append("<p>Per program (the ten costliest below):</p>")
        parts.append(_plot_program_memory(programs))

    parts.append("<h2 id='programs'>The ten costliest programs</h2>")
    if programs:
        parts.append(
            _svg(
                _barh(
                    [r["program"] for r in programs],
                    [r["total_ms"] or 0.0 for r in programs],
                    _BLUE,
                    "ms in all (runs x mean run; runs that compiled are in the compilations)",
                )
            )
        )
        parts.append(
            _table(
                ["program", "scope", "runs", "mean ms", "total ms", "GFLOP", "memory", "holds"],
                [
                    (
                        r["program"],
                        r["scope"],
                        r["runs"],
                        r["mean_ms"],
                        "in its compilation" if r["total_ms"] is None else r["total_ms"],
                        None if r.get("flops") is None else f"{r['flops'] / 1e9:.4g}",
                        r.get("error")
                        or _bytes(
                            sum(r.get(p) or 0 for p in ("arguments", "outputs", "temporaries"))
                        ),
                        r["ops"],
                    )
                    for r in programs
                ],  # fmt: skip
                numeric=(2, 3, 4, 5),
            )
        )
    else:
        parts.append("<p>No XLA program ran.</p>")

    parts.append("<h2 id='strict'>What strict mode would stop on</h2>")
    if findings:
        parts.append(
            _table(
                ["kind", "what", "where", "fix"],
                [(f.kind, f.what, f.where, f.fix) for f in findings],
            )
        )
    else:
        parts.append(
            "<p class='none'>Nothing: no CPU fallback, no host sync after the first step, no "
            "compilation after the warm-up steps.</p>"
        )
    data = json.dumps({k: v for k, v in result.items() if k != "error"}, default=str)
    data = data.replace("</", "<\\/")  # (a "</script>" in a cause or line ends no element)
    parts.append(f"<script type='application/json' id='metrics'>{data}</script>")
    parts.append("</body></html>")
    return "\n".join(parts)
