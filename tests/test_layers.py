"""torch_pjrt's packages form layers: each imports only the layers below it, and no two
packages import each other, directly or through others (docs/internals.md, "The layers").

The graph is read from the source (no import runs): every ``import`` and ``from ...
import`` of torch_pjrt, at module level and inside functions, relative ones resolved.
A module's package is the first name under ``torch_pjrt/`` (``ops/registry.py``:
``ops``); a top-level module is its own package (``config.py``: ``config``), and
``torch_pjrt/__init__.py``, the public surface that imports every layer, is
``torch_pjrt``.
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "torch_pjrt"

# bottom to top: a package may import the packages of the layers below its own; inside a
# layer, imports are allowed as long as they make no cycle
LAYERS = (
    ("config", "_version"),  # settings; nothing from torch_pjrt
    ("runtime",),  # platform, transfers, the executor, events, the torchrun launcher
    ("modes",),  # the mode policy and the fused recording
    ("device",),  # tensors and storage cells, torch.pjrt, RNG state, streams, serialization
    ("ops",),  # lowerings, the registry, the fallback, debug-mode checks
    ("distributed", "compile", "diagnostics", "migrate", "kernels"),
    ("_registration", "torch_pjrt"),  # registering the device; the public names
    # the torch-pjrt command, vLLM's plugin, Ray Train's helpers, StableHLO artifacts
    ("cli", "serving", "ray_train", "export"),
)
LAYER = {package: i for i, layer in enumerate(LAYERS) for package in layer}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "torch_pjrt"


def _imports(module: str, path: Path, modules: set[str]) -> set[str]:
    """The torch_pjrt modules ``module`` imports, anywhere in its source."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, up level - 1
                parts = module.split(".")[: None if path.name == "__init__.py" else -1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                # a submodule (from torch_pjrt import runtime), else a name of base
                found.add(sub if sub in modules else base)
    return {m for m in found if m == "torch_pjrt" or m.startswith("torch_pjrt.")}


def package_graph() -> dict[str, dict[str, list[str]]]:
    """{package: {imported package: ["module -> module", ...]}}, between packages."""
    paths = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    graph: dict = collections.defaultdict(lambda: collections.defaultdict(list))
    for module, path in paths.items():
        for target in _imports(module, path, set(paths)):
            a, b = _package(module), _package(target)
            if a != b:
                graph[a][b].append(f"{module} -> {target}")
    for module in paths:
        graph.setdefault(_package(module), collections.defaultdict(list))
    return graph


def _cycle(graph) -> list[str] | None:
    """One cycle of packages (its first package repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(v):
        state[v] = 1
        path.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return path[path.index(w) :] + [w]
            if w not in state:
                found = visit(w)
                if found:
                    return found
        path.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state:
            found = visit(v)
            if found:
                return found
    return None


def _show(graph, a, b) -> str:
    return f"{a} -> {b} ({'; '.join(sorted(graph[a][b])[:3])})"


def test_no_cycle_between_packages():
    graph = package_graph()
    cycle = _cycle(graph)
    assert cycle is None, "a cycle between torch_pjrt's packages:\n  " + "\n  ".join(
        _show(graph, a, b) for a, b in zip(cycle, cycle[1:])
    )


def test_every_package_has_a_layer():
    missing = sorted(set(package_graph()) - set(LAYER))
    assert not missing, f"packages in no layer of LAYERS (add them where they belong): {missing}"


def test_layers_point_down():
    graph = package_graph()
    upward = [
        _show(graph, a, b)
        for a in sorted(graph)
        for b in sorted(graph[a])
        if a in LAYER and b in LAYER and LAYER[b] > LAYER[a]
    ]
    assert not upward, "imports of a higher layer:\n  " + "\n  ".join(upward)


def test_the_bottom_layers():
    """The rules of issue 17, spelled out: config imports nothing of torch_pjrt, runtime
    only config, modes only config and runtime, device nothing above modes."""
    graph = package_graph()
    allowed = {
        "config": set(),
        "_version": set(),
        "runtime": {"config"},
        "modes": {"config", "runtime"},
        "device": {"config", "runtime", "modes"},
    }
    for package, ok in allowed.items():
        extra = sorted(set(graph[package]) - ok)
        assert not extra, f"{package} imports " + "; ".join(_show(graph, package, b) for b in extra)


def test_the_graph_sees_function_level_and_relative_imports(tmp_path):
    source = "from . import sibling\n\ndef f():\n    from ..ops import registry\n"
    path = tmp_path / "torch_pjrt" / "device" / "thing.py"
    path.parent.mkdir(parents=True)
    path.write_text(source)
    modules = {"torch_pjrt.device.sibling", "torch_pjrt.ops.registry"}
    found = _imports("torch_pjrt.device.thing", path, modules)
    assert found == modules
