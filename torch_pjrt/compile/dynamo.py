"""Keep Dynamo out of torch_pjrt's own code.

While a ``torch.compile``d function runs, Dynamo's frame hook sees every Python frame,
including those of our eager kernels (Python functions the dispatcher calls after a
graph break) and of JAX below them. Tracing those would be wrong and slow, so
torch_pjrt, JAX and their helpers go on Dynamo's skip list as soon as Dynamo is
imported (Dynamo is heavy: it is not imported for this).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

_SKIPPED = ("torch_pjrt", "jax", "jaxlib", "ml_dtypes", "opt_einsum")
_done = [False]


def _add_skips(trace_rules) -> None:
    if _done[0]:
        return
    _done[0] = True
    for name in _SKIPPED:
        if importlib.util.find_spec(name) is not None:
            trace_rules.add(name)


class _AfterTraceRules(importlib.abc.MetaPathFinder):
    """Runs :func:`_add_skips` right after ``torch._dynamo.trace_rules`` is executed."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch._dynamo.trace_rules":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_skip(module):
            exec_module(module)
            _add_skips(module)

        spec.loader.exec_module = exec_then_skip
        return spec


def skip_torch_pjrt() -> None:
    """Put torch_pjrt and JAX on Dynamo's skip list, now or when Dynamo is imported."""
    rules = sys.modules.get("torch._dynamo.trace_rules")
    if rules is not None and hasattr(rules, "add"):
        _add_skips(rules)
    elif not any(isinstance(f, _AfterTraceRules) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTraceRules())
