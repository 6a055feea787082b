"""Keep Dynamo out of torch_pjrt's own code.

While a ``torch.compile``d function runs, Dynamo's frame hook sees every Python frame,
including those of our eager kernels (Python functions the dispatcher calls after a
graph break) and of JAX below them. Tracing those would be wrong and slow, so
torch_pjrt, JAX and their helpers go on Dynamo's skip list as soon as Dynamo is
imported (Dynamo is heavy: it is not imported for this).
"""

from __future__ import annotations

import importlib.util

from torch_pjrt.runtime.imports import after_import

_SKIPPED = ("torch_pjrt", "jax", "jaxlib", "ml_dtypes", "opt_einsum")
_done = [False]


def _add_skips(trace_rules) -> None:
    if _done[0]:
        return
    _done[0] = True
    for name in _SKIPPED:
        if importlib.util.find_spec(name) is not None:
            trace_rules.add(name)


def skip_torch_pjrt() -> None:
    """Put torch_pjrt and JAX on Dynamo's skip list, now or when Dynamo is imported."""
    after_import("torch._dynamo.trace_rules", _add_skips)
