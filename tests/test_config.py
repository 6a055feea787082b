"""One config: every TORCH_PJRT_* variable read in config.py, values checked, scoped
overrides per thread (``config(...)``, ``mode(...)``, ``strict(...)``)."""

from __future__ import annotations

import ast
import dataclasses
import os
import pathlib
import re
import subprocess
import sys
import threading

import pytest
import torch

import torch_pjrt
from torch_pjrt import metrics, settings
from torch_pjrt.config import Config
from torch_pjrt.modes import fused

PACKAGE = pathlib.Path(torch_pjrt.__file__).parent
ROOT = PACKAGE.parent
PREFIX = "TORCH_PJRT_"
DEFAULT = Config.from_env()  # the process defaults this run started with


@pytest.fixture(autouse=True)
def _process_defaults_after():
    yield
    torch_pjrt.set_mode(DEFAULT.mode)
    settings.fused_max_ops = DEFAULT.fused_max_ops
    settings.strict_warmup = DEFAULT.strict_warmup


# --- every variable is read through the config --------------------------------------------


def _is_environ(node: ast.AST, aliases: set) -> bool:
    """``os.environ``, ``environ`` (``from os import environ``) or a name bound to it."""
    if isinstance(node, ast.Attribute):
        return node.attr == "environ" and isinstance(node.value, ast.Name) and node.value.id == "os"
    return isinstance(node, ast.Name) and (node.id == "environ" or node.id in aliases)


def _is_getenv(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "getenv" and isinstance(node.value, ast.Name) and node.value.id == "os"
    return isinstance(node, ast.Name) and node.id == "getenv"


def _names_variable(node: ast.AST) -> bool:
    """Whether a string in ``node`` starts with TORCH_PJRT_ (a name, an f-string's head)."""
    return any(
        isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith(PREFIX)
        for n in ast.walk(node)
    )


def _key_of_read(node: ast.AST, aliases: set):
    """The key expression when ``node`` reads the environment, else None."""
    if isinstance(node, ast.Call) and node.args:
        f = node.func
        if _is_getenv(f):
            return node.args[0]
        if isinstance(f, ast.Attribute) and _is_environ(f.value, aliases):
            if f.attr in ("get", "setdefault", "pop", "__getitem__"):
                return node.args[0]
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        if _is_environ(node.value, aliases):
            return node.slice
    if isinstance(node, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops):
        if any(_is_environ(c, aliases) for c in node.comparators):
            return node.left
    return None


def _aliases(scope: ast.AST) -> set:
    """Names bound to ``os.environ`` in ``scope`` itself (not in the functions inside)."""
    names, todo = set(), list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Assign) and _is_environ(node.value, set()):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        todo.extend(ast.iter_child_nodes(node))
    return names


def environ_reads(source: str) -> list[int]:
    """Lines of ``source`` that read a TORCH_PJRT_ variable from the environment: by its
    name, or by a computed name inside a function that names such a variable (a loop
    over names, say)."""
    lines = []

    def visit(node: ast.AST, scope: ast.AST, aliases: set) -> None:
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            scope, aliases = node, aliases | _aliases(node)
        key = _key_of_read(node, aliases)
        if key is not None:
            computed = not isinstance(key, ast.Constant)
            if _names_variable(key) or (computed and _names_variable(scope)):
                lines.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, scope, aliases)

    tree = ast.parse(source)
    visit(tree, tree, set())
    return lines


@pytest.mark.parametrize(
    "source",
    [
        'import os\nos.environ.get("TORCH_PJRT_X")',
        'import os\nos.environ.get("TORCH_PJRT_X", "1").strip()',
        'import os\nx = os.environ["TORCH_PJRT_X"]',
        'import os\nos.getenv("TORCH_PJRT_X")',
        'from os import getenv\ngetenv("TORCH_PJRT_X")',
        'import os\nif "TORCH_PJRT_X" in os.environ:\n    pass',
        'import os\nif "TORCH_PJRT_X" not in os.environ:\n    pass',
        'from os import environ\nenviron.get("TORCH_PJRT_X")',
        'import os\nenv = os.environ\nenv.get("TORCH_PJRT_X")',
        'import os\nos.environ.setdefault("TORCH_PJRT_X", "1")',
        'import os\nn = "X"\nos.environ.get(f"TORCH_PJRT_{n}")',
        'import os\ndef f():\n    for v in ("TORCH_PJRT_A", "TORCH_PJRT_B"):\n'
        "        os.environ.get(v)",
    ],
)
def test_the_scan_finds_each_kind_of_read(source):
    assert environ_reads(source), source


@pytest.mark.parametrize(
    "source",
    [
        'import os\nos.environ["TORCH_PJRT_X"] = "1"',  # written for a child process
        'import os\ndel os.environ["TORCH_PJRT_X"]',
        'import os\nos.environ.get("JAX_PLATFORMS")',
        'import os\nenv = dict(os.environ)\nenv.pop("TORCH_PJRT_X", None)',  # a copy
        'import os\ndef f(env):\n    return env["RANK"]',
        # `env` is os.environ in another function only
        'import os\ndef f():\n    env = os.environ\ndef g(env, v="TORCH_PJRT_X"):\n'
        "    return env.pop(v)",
    ],
)
def test_the_scan_lets_writes_and_other_variables_pass(source):
    assert not environ_reads(source), source


def test_only_config_reads_torch_pjrt_variables():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "config.py":
            continue
        for line in environ_reads(path.read_text()):
            found.append(f"{path.relative_to(ROOT)}:{line}")
    assert not found, (
        "TORCH_PJRT_* variables read outside torch_pjrt/config.py (add a field to Config "
        f"and read settings.<field> instead): {found}"
    )


def test_every_variable_is_documented():
    fields = dataclasses.fields(Config)
    variables = {var for f in fields for var in f.metadata["env"] if var.startswith(PREFIX)}
    variables.add("TORCH_PJRT_CACHE")  # part of cache_dir
    docs = (ROOT / "docs" / "config.md").read_text()
    assert not [v for v in sorted(variables) if f"`{v}" not in docs]
    assert not [f.name for f in fields if f.name not in (Config.__doc__ or "")]


# --- values are checked -------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"mode": "lazy"}, "torch_pjrt mode must be one of debug, eager, fused, but got 'lazy'"),
        ({"fallback": "typo"}, "fallback must be one of cpu, error, but got 'typo'"),
        ({"fused_max_ops": 0}, "fused_max_ops must be a whole number >= 1, but got 0"),
        ({"fused_max_ops": -5}, "fused_max_ops must be a whole number >= 1, but got -5"),
        ({"fused_max_ops": 2.5}, "fused_max_ops must be a whole number >= 1, but got 2.5"),
        ({"fused_max_ops": True}, "fused_max_ops must be a whole number >= 1, but got True"),
        ({"strict_warmup": -1}, "strict_warmup must be a whole number >= 0, but got -1"),
        ({"check_nan": "yes"}, "check_nan must be True or False, but got 'yes'"),
        ({"strict": 2}, "strict must be True or False, but got 2"),
        ({"buckets": "big"}, "buckets must be 'pow2', None, or sizes >= 1"),
        ({"buckets": (0, 8)}, "buckets must be 'pow2', None, or sizes >= 1"),
        ({"cache_min_seconds": -1}, "cache_min_seconds must be a number of seconds >= 0"),
        ({"collective_timeout": 0}, "collective_timeout must be a number of seconds > 0"),
        ({"cpu_devices": 0}, "cpu_devices must be a whole number >= 1, or None, but got 0"),
    ],
)
def test_bad_values_name_what_is_allowed(overrides, message):
    with pytest.raises(ValueError, match=_literal(message)):
        torch_pjrt.config(**overrides)  # raises at the call, before any block starts
    [(name, value)] = overrides.items()
    before = getattr(settings, name)
    with pytest.raises(ValueError, match=_literal(message)):
        setattr(settings, name, value)
    assert getattr(settings, name) == before
    with pytest.raises(ValueError, match=_literal(message)):
        Config(**overrides)


def _literal(text: str) -> str:
    return re.escape(text)


def test_set_mode_and_strict_check_their_argument():
    with pytest.raises(ValueError, match="must be one of debug, eager, fused, but got 'lazy'"):
        torch_pjrt.set_mode("lazy")
    with pytest.raises(ValueError, match="must be one of debug, eager, fused, but got 'lazy'"):
        torch_pjrt.mode("lazy")
    with pytest.raises(ValueError, match="strict must be True or False, but got 'on'"):
        torch_pjrt.strict("on")
    assert torch_pjrt.get_mode() == DEFAULT.mode and settings.strict == DEFAULT.strict


def test_values_are_normalized():
    with torch_pjrt.config(mode=" Eager", fallback="ERROR", buckets=[64, 16, 32]):
        assert (settings.mode, settings.fallback) == ("eager", "error")
        assert settings.buckets == (16, 32, 64)
    with torch_pjrt.config(buckets="64,16", check_nan=1, cache_dir=pathlib.Path("/x")):
        assert settings.buckets == (16, 64) and settings.check_nan is True
        assert settings.cache_dir == "/x"


def test_unknown_settings_are_errors():
    with pytest.raises(TypeError, match="unknown settings: \\['moed'\\]; the settings are"):
        torch_pjrt.config(moed="eager")
    with pytest.raises(AttributeError, match="torch_pjrt has no setting 'moed'"):
        settings.moed = "eager"  # a typo is not a new setting
    with pytest.raises(AttributeError, match="torch_pjrt has no setting 'moed'"):
        settings.moed  # noqa: B018


# --- the environment ----------------------------------------------------------------------


def test_variables_are_parsed():
    cfg = Config.from_env(
        {
            "TORCH_PJRT_MODE": " Debug ",
            "TORCH_PJRT_FALLBACK": "error",
            "TORCH_PJRT_FUSED_MAX_OPS": "12",
            "TORCH_PJRT_STRICT": "yes",
            "TORCH_PJRT_CHECK_NAN": "off",
            "TORCH_PJRT_BUCKETS": "32,8",
            "TORCH_PJRT_CPU_DEVICES": "",  # empty: unset
            "TORCH_PJRT_CACHE": "0",
            "TORCH_PJRT_COLLECTIVE_TIMEOUT": "2.5",
            "TORCH_PJRT_DUMP_GRAPHS": "out/graphs",
        }
    )
    assert (cfg.mode, cfg.fallback, cfg.fused_max_ops) == ("debug", "error", 12)
    assert (cfg.strict, cfg.check_nan, cfg.buckets) == (True, False, (8, 32))
    assert (cfg.cpu_devices, cfg.cache_dir, cfg.collective_timeout) == (None, None, 2.5)
    assert cfg.dump_graphs == "out/graphs"
    defaults = Config.from_env({})  # no variables: the defaults
    assert defaults.cache_dir.endswith(os.path.join("torch_pjrt", "xla"))
    assert dataclasses.replace(defaults, cache_dir=None) == Config()


@pytest.mark.parametrize(
    "var, raw, message",
    [
        ("TORCH_PJRT_MODE", "lazy", "TORCH_PJRT_MODE must be one of debug, eager, fused"),
        ("TORCH_PJRT_FALLBACK", "typo", "TORCH_PJRT_FALLBACK must be one of cpu, error"),
        ("TORCH_PJRT_FUSED_MAX_OPS", "0", "TORCH_PJRT_FUSED_MAX_OPS must be a whole number >= 1"),
        ("TORCH_PJRT_FUSED_MAX_OPS", "many", "TORCH_PJRT_FUSED_MAX_OPS must be a whole number"),
        ("TORCH_PJRT_STRICT_WARMUP", "-1", "TORCH_PJRT_STRICT_WARMUP must be a whole number >= 0"),
        ("TORCH_PJRT_STRICT", "maybe", "TORCH_PJRT_STRICT must be one of 1, true, yes, on"),
        ("TORCH_PJRT_BUCKETS", "big", "TORCH_PJRT_BUCKETS must be 'pow2', '0'"),
        ("TORCH_PJRT_INIT_TIMEOUT", "soon", "TORCH_PJRT_INIT_TIMEOUT must be a number of seconds"),
    ],
)
def test_bad_variables_name_the_variable(var, raw, message):
    with pytest.raises(ValueError, match=_literal(message)) as info:
        Config.from_env({var: raw})
    assert f"but got {raw!r}" in str(info.value) and "unset it" in str(info.value)


def test_a_bad_variable_fails_the_import_with_a_clear_error():
    env = dict(os.environ, TORCH_PJRT_MODE="lazy", PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", "import torch_pjrt"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0
    assert "ValueError: TORCH_PJRT_MODE must be one of debug, eager, fused, but got 'lazy'" in (
        out.stderr
    ), out.stderr[-3000:]


def test_launcher_variables_are_read_when_used(monkeypatch):
    monkeypatch.setenv("TORCH_PJRT_COORDINATOR_PORT", "1234")
    assert settings.coordinator_port == 1234  # set after import: still seen
    with torch_pjrt.config(coordinator_port=99):
        assert settings.coordinator_port == 99
    monkeypatch.setenv("TORCH_PJRT_COORDINATOR_PORT", "x")
    with pytest.raises(ValueError, match="TORCH_PJRT_COORDINATOR_PORT must be a whole number"):
        settings.coordinator_port  # noqa: B018
    monkeypatch.delenv("TORCH_PJRT_COORDINATOR_PORT")
    assert settings.coordinator_port is None


def test_dump_graphs_is_a_setting(tmp_path):
    assert settings.dump_graphs == DEFAULT.dump_graphs
    torch_pjrt.compile.dump_graphs(tmp_path)
    try:
        assert settings.dump_graphs == str(tmp_path)
    finally:
        torch_pjrt.compile.dump_graphs(DEFAULT.dump_graphs)


# --- scoped overrides ---------------------------------------------------------------------


def test_nested_scopes_restore_what_was_in_effect():
    torch_pjrt.set_mode("eager")
    with torch_pjrt.config(fallback="error", fused_max_ops=7) as s:
        assert s is settings
        with torch_pjrt.mode("debug"), torch_pjrt.strict():
            with torch_pjrt.config(fused_max_ops=3), torch_pjrt.strict(False):
                assert (settings.fallback, settings.fused_max_ops) == ("error", 3)
                assert (torch_pjrt.get_mode(), settings.strict) == ("debug", False)
            assert (settings.fused_max_ops, settings.strict) == (7, True)
            assert torch_pjrt.get_mode() == "debug"
        assert (torch_pjrt.get_mode(), settings.strict) == ("eager", DEFAULT.strict)
        with pytest.raises(KeyError), torch_pjrt.config(fused_max_ops=2):
            raise KeyError  # an exception leaves the block too
        assert settings.fused_max_ops == 7
    assert (settings.fallback, settings.fused_max_ops) == (DEFAULT.fallback, DEFAULT.fused_max_ops)


def test_process_defaults_set_inside_a_scope():
    with torch_pjrt.config(fused_max_ops=7):
        settings.strict_warmup = 5  # not overridden here: seen at once
        assert settings.strict_warmup == 5
        settings.fused_max_ops = 9  # the process default; this block's override wins
        assert settings.fused_max_ops == 7
    assert (settings.fused_max_ops, settings.strict_warmup) == (9, 5)


def test_config_as_a_decorator():
    @torch_pjrt.config(fallback="error")
    def inside():
        return settings.fallback

    assert (inside(), inside(), settings.fallback) == ("error", "error", DEFAULT.fallback)

    @torch_pjrt.mode("debug")
    @torch_pjrt.strict()
    def checked():
        return torch_pjrt.get_mode(), settings.strict

    assert checked() == checked() == ("debug", True)
    assert (torch_pjrt.get_mode(), settings.strict) == (DEFAULT.mode, DEFAULT.strict)


def test_leaving_fused_in_a_scope_runs_what_was_recorded():
    torch_pjrt.set_mode("eager")
    a = torch.arange(6.0, device="pjrt")
    torch.pjrt.synchronize()
    metrics.reset()
    with torch_pjrt.mode("fused"):
        b = a * 2 + 1
        assert fused.pending_ops() > 0
    assert fused.pending_ops() == 0  # ran when the block ended
    assert metrics.as_dict()["fused_flush_reasons"] == {"mode switch": 1}
    torch_pjrt.set_mode("fused")
    c = b - 1
    assert fused.pending_ops() > 0
    with torch_pjrt.mode("eager"):  # entering another mode runs the recording too
        assert fused.pending_ops() == 0
        d = c * 3
    torch.testing.assert_close(d.cpu(), (torch.arange(6.0) * 2) * 3)


# --- threads ------------------------------------------------------------------------------


def _in_threads(work, names: list) -> dict:
    """``work(name, barrier)`` in one thread per name, all at once; their results."""
    barrier = threading.Barrier(len(names))
    results = {}

    def run(name):
        try:
            results[name] = work(name, barrier)
        except BaseException as exc:  # noqa: BLE001  (reported by the test)
            results[name] = exc
            barrier.abort()

    threads = [threading.Thread(target=run, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for name, result in results.items():
        if isinstance(result, BaseException):
            raise AssertionError(f"thread {name}: {result!r}") from result
    assert sorted(results) == sorted(names)
    return results


def test_threads_run_in_different_modes_at_once():
    def work(name, barrier):
        seed = torch_pjrt.modes.MODES.index(name)
        g = torch.Generator().manual_seed(seed)
        w_cpu, x_cpu = torch.randn(16, 16, generator=g), torch.randn(4, 16, generator=g)
        w, x = w_cpu.to("pjrt"), x_cpu.to("pjrt")
        seen = []
        with torch_pjrt.mode(name):
            barrier.wait(timeout=120)  # every thread is inside its block
            for _ in range(3):
                seen.append(torch_pjrt.get_mode())
                x = torch.tanh(x @ w) + x
                x_cpu = torch.tanh(x_cpu @ w_cpu) + x_cpu
            barrier.wait(timeout=120)  # still all inside, the others mid-way too
            seen.append(torch_pjrt.get_mode())
            got = x.cpu()
        seen.append(torch_pjrt.get_mode())
        torch.testing.assert_close(got, x_cpu, rtol=1e-5, atol=1e-5)
        return seen

    torch_pjrt.set_mode("eager")
    results = _in_threads(work, list(torch_pjrt.modes.MODES))
    for name, seen in results.items():
        assert seen == [name] * 4 + ["eager"], (name, seen)  # then the process default
    assert torch_pjrt.get_mode() == "eager"


def test_a_scope_in_one_thread_is_not_seen_by_another():
    inside, checked = threading.Event(), threading.Event()
    seen = {}

    def scoped():
        with torch_pjrt.config(fallback="error"), torch_pjrt.mode("debug"):
            inside.set()
            checked.wait(timeout=60)
            seen["scoped"] = (settings.fallback, torch_pjrt.get_mode())

    torch_pjrt.set_mode("eager")
    t = threading.Thread(target=scoped)
    t.start()
    assert inside.wait(timeout=60)
    seen["main"] = (settings.fallback, torch_pjrt.get_mode())
    torch_pjrt.set_mode("fused")  # the process default: the scoped thread keeps its own
    seen["main after"] = torch_pjrt.get_mode()
    checked.set()
    t.join(timeout=60)
    assert seen == {
        "main": (DEFAULT.fallback, "eager"),
        "main after": "fused",
        "scoped": ("error", "debug"),
    }


def test_a_new_thread_sees_the_process_defaults():
    def work(name, barrier):
        return torch_pjrt.get_mode(), settings.fused_max_ops

    torch_pjrt.set_mode("debug")
    settings.fused_max_ops = 11
    with torch_pjrt.mode("eager"), torch_pjrt.config(fused_max_ops=3):
        assert _in_threads(work, ["other"]) == {"other": ("debug", 11)}
